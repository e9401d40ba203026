"""``hisparse.coordinator=sglang``: the HiSparse backend with SGLang's swap-in kernel in its
swap-in stage. On the CPU the kernel's pure-Python stand-in (``ModelSwapInKernel``) runs the
whole harness point; its per-(step, layer, request) counts are checked against an independent
replay of the recorded selections through ``UpstreamHotBuffer``. Without that stand-in the CPU
row is ``unavailable`` and a page-mode point ``invalid``, and the sweep goes on."""
import numpy as np
import pytest
import torch

import backends.hisparse as hisparse_backend
from backends.kernels import sglang_peer as sp
from cli import compose, run_harness
from harness import results
from harness.lru_model import CoordinatorModel
from harness.sglang_model import UpstreamHotBuffer, modelled_peer
from harness.runner import run_point
from harness.selection import Trace
from harness.validate import validate

K, D = 16, 24
POINT = ["device=cpu", "model=tiny", "backend=hisparse", "hisparse.coordinator=sglang",
         f"top_k={K}", f"hisparse.device_buffer_size={D}", "page_size=8", "context_len=60",
         "batch_size=3", "kv_dtype=bf16", "steps=5", "timing.warmup_steps=1", "num_layers=2", "step_overlap=0.6",
         "report=false"]


def _run_modelled(d, *overrides):
    """One harness point in this process, upstream's kernel replaced by its Python model."""
    cfg = compose(*POINT, *overrides)
    validate(cfg)
    mp = pytest.MonkeyPatch()
    mp.setattr(hisparse_backend, "make_sglang_peer", modelled_peer)
    try:
        run_point(cfg, torch.device("cpu"), d, "python -m harness ...", "h")
    finally:
        mp.undo()
    return results.load(d).iloc[0]


@pytest.fixture(scope="module")
def model_point(tmp_path_factory):
    d = tmp_path_factory.mktemp("sglang_point")
    _run_modelled(d, f"selection.record={d}/sel.npz")
    return d


def test_point_with_the_upstream_model_is_correct(model_point):
    row = results.load(model_point).iloc[0]
    assert row["status"] == "ok", row["error"]
    assert row["coordinator"] == "sglang" and row["copy_engine"] == "uva_kernel"
    assert row["misses"] > 0 and row["hits"] > 0
    assert row["bytes_h2d"] == row["tokens_loaded"] * row["kv_row_bytes"]
    assert row["pages_loaded"] == 0 and row["stage_swap_in_us"] > 0


def test_counts_equal_an_independent_replay_of_upstream_policy(model_point):
    tr = Trace.load(model_point / "sel.npz")
    steps, layers, B, _ = tr.topk.shape
    st = results.load(model_point, steps=True).set_index(["step", "layer", "request"])
    prompt = [int(n) - 1 for n in tr.seq_lens[0]]
    growth = CoordinatorModel(layers, D, 8, "token")
    growth.prefill(range(B), prompt)
    models, long_seen = {}, set()
    for s in range(steps):
        seqs = [int(n) for n in tr.seq_lens[s]]
        growth.begin_step(range(B), seqs)
        for b, n in enumerate(seqs):
            if b not in long_seen:       # the peer takes the grown buffers until a request is long
                for layer in range(layers):
                    models[layer, b] = UpstreamHotBuffer.from_model(growth.buffer(layer, b))
            if n > D:
                long_seen.add(b)
        for layer in range(layers):
            for b, n in enumerate(seqs):
                want = models[layer, b].step(n, tr.topk[s, layer, b].tolist())  # as passed
                got = st.loc[(s, layer, b)]
                assert (got.hits, got.misses, got.tokens_loaded) == (want.hits, want.misses, want.misses), \
                    (s, layer, b)


def test_without_gpu_unavailable_and_page_mode_invalid_sweep_goes_on(tmp_path):
    args = [a for a in POINT if not a.startswith(("backend", "device=", "steps", "num_layers"))]
    run_harness("-m", "hisparse.load_granularity=token,page", "backend=all", "steps=2", "num_layers=1",
                *args, f"hydra.sweep.dir={tmp_path}")
    df = results.load(tmp_path)
    hs = df[df.backend == "hisparse"].set_index("load_granularity")
    assert hs.loc["token", "status"] == "unavailable" and "CUDA" in hs.loc["token", "error"]
    assert hs.loc["page", "status"] == "invalid" and "load_granularity=token" in hs.loc["page", "error"]
    assert (df[df.backend == "flashmla_sparse"]["status"] == "ok").all()
    assert set(hs["coordinator"]) == {"sglang"}


def test_selection_contract():
    n = np.array([40, 20])
    ok = np.array([[5, 39, 0, 9], [3, 1, -1, -1]])
    assert sp.selection_contract_error(ok, n, 24) is None
    assert "twice" in sp.selection_contract_error(np.array([[5, 7, 5, 9], [3, 1, -1, -1]]), n, 24)
    assert "outside" in sp.selection_contract_error(np.array([[5, 40, 1, 9], [3, 1, -1, -1]]), n, 24)
    assert "outside" in sp.selection_contract_error(np.array([[5, -2, 1, 9], [3, 1, -1, -1]]), n, 24)
    # -1 before a valid entry: not for a short request; no -1 at all in a long one (it races
    # with real positions in upstream's hash, whose empty key and hit marker are both -1)
    err = sp.selection_contract_error(np.array([[5, 7, 1, 9], [3, -1, 1, -1]]), n, 24)
    assert "batch row 1" in err and "short request" in err
    for long_row in ([-1, 7, 5, 9], [5, 7, 1, -1]):
        err = sp.selection_contract_error(np.array([long_row, [3, 1, -1, -1]]), n, 24)
        assert "batch row 0" in err and "long request" in err and "race" in err
    assert "batch row 1" in sp.selection_contract_error(
        np.array([[5, 6, 1, 9], [3, -1, 1, -1]]), n, 16)     # seq 20 > 16: row 1 is long here


def test_trace_breaking_the_contract_is_invalid_before_any_kernel(tmp_path):
    """A trace in the format (duplicates are rejected for every backend when it is read) that
    upstream's kernel cannot take: a short request (seq_len <= device_buffer_size) with -1
    before a valid entry."""
    steps, layers, B = 2, 1, 2
    rng = np.random.default_rng(0)
    seq = np.array([[20, 21], [21, 22]], dtype=np.int32)   # short requests: <= D = 24
    topk = np.stack([[[rng.permutation(int(seq[s, b]))[:K] for b in range(B)]] for s in range(steps)])
    topk = topk.astype(np.int32)
    topk[1, 0, 1, 3] = -1                               # a gap, step 1, batch row 1
    Trace(topk, seq).save(tmp_path / "gap.npz")
    args = [a for a in POINT if not a.startswith(("steps", "num_layers", "batch_size", "context"))]
    run_harness(*args, "selection=trace", f"selection.path={tmp_path}/gap.npz", "steps=2",
                "num_layers=1", "batch_size=2", f"hydra.run.dir={tmp_path}/run")
    row = results.load(tmp_path / "run").iloc[0]
    assert row["status"] == "invalid"
    assert "step 1, layer 0" in row["error"] and "batch row 1" in row["error"] and "-1 before" in row["error"]


def test_indexer_selection_meets_the_contract_after_each_layer(tmp_path):
    """With the indexer selecting inside the step nothing is checked up front: each layer's
    top-k is checked after the timed region, and the indexer's top-k passes."""
    row = _run_modelled(tmp_path, "selection=indexer", "steps=3", "num_layers=1")
    assert row["status"] == "ok", row["error"]
    assert row["selection"] == "indexer" and row["coordinator"] == "sglang" and row["misses"] > 0
