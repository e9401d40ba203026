"""Single-point runs through the CLI: the indexer selection path, and HiSparse counts on a
replayed trace against the independent LRU model."""
from pathlib import Path

import numpy as np
import pytest

from cli import run_harness
from harness import results
from harness.lru_model import HotBufferModel
from harness.selection import Trace

SMALL = ["context_len=300", "steps=3", "timing.warmup_steps=1", "num_layers=2", "batch_size=2",
         "report=false"]


@pytest.fixture(scope="module")
def indexer_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("idx")
    run_harness("selection=indexer", "top_k=32", *SMALL, f"selection.record={d}/sel.npz",
             f"hydra.run.dir={d}/run")
    return d


def test_indexer_selection_runs_both_backends(indexer_run):
    df = results.load(indexer_run / "run").set_index("backend")
    assert (df["status"] == "ok").all(), df["error"]
    assert (df["selection"] == "indexer").all() and df["fuse_topk"].all()
    assert (df["plan_builds_per_step"] == 1.0).all()  # one plan per step, reused by every layer
    for c in ("stage_select_us", "stage_indexer_us", "stage_topk_us", "stage_attention_us"):
        assert (df[c] > 0).all()
    # fused top-k + PAGED transform: the vLLM-style backend skips its own transform
    assert np.isnan(df.loc["flashmla_sparse", "stage_transform_us"])
    assert df.loc["hisparse", "stage_swap_in_us"] > 0
    # the same seeded indexer inputs give both backends the same selections
    assert df.loc["flashmla_sparse", "pages_touched"] == df.loc["hisparse", "pages_touched"]
    assert df.loc["flashmla_sparse", "tokens_selected"] == 2 * 2 * 2 * 32


def test_unfused_indexer_path_uses_the_transform_stage(indexer_run, tmp_path):
    run_harness("selection=indexer", "selection.fuse_topk=false", "backend=flashmla_sparse", "top_k=32",
             *SMALL, f"hydra.run.dir={tmp_path}/run")
    un = results.load(tmp_path / "run").iloc[0]
    fu = results.load(indexer_run / "run").set_index("backend").loc["flashmla_sparse"]
    assert un["status"] == "ok" and un["stage_transform_us"] > 0
    assert un["pages_touched"] == fu["pages_touched"]  # same index sets either way


def test_recorded_indexer_trace_replays_with_lru_model_counts(indexer_run, tmp_path):
    tr = Trace.load(indexer_run / "sel.npz")
    assert tr.topk.shape == (3, 2, 2, 32)
    run_harness("backend=hisparse", "selection=trace", f"selection.path={indexer_run}/sel.npz",
             "top_k=32", "hisparse.device_buffer_size=48", *[a for a in SMALL if "context" not in a],
             f"hydra.run.dir={tmp_path}/run")
    st = results.load(tmp_path / "run", steps=True).sort_values(["step", "layer", "request"])
    models = {}
    for s in range(3):
        for layer in range(2):
            for b in range(2):
                m = models.get((layer, b))
                if m is None:
                    m = models[(layer, b)] = HotBufferModel(48, 64, "token")
                    m.prefill(int(tr.seq_lens[0, b]) - 1)
                m.begin_step(int(tr.seq_lens[s, b]))
                want = m.step(int(tr.seq_lens[s, b]), tr.topk[s, layer, b].tolist())
                got = st[(st.step == s) & (st.layer == layer) & (st.request == b)].iloc[0]
                assert (got.hits, got.misses, got.tokens_loaded) == (want.hits, want.misses, want.tokens_loaded)


def test_index_query_precision_is_recorded_and_both_pass_their_check(indexer_run, tmp_path):
    """The default fp8 index query (vLLM's) and the bf16 one each pass the scenario's check
    against the reference of the same query; they select differently somewhere (the fp8
    quantization moves the logits by a few percent); a bad value stops before any kernel."""
    fp8 = results.load(indexer_run / "run").set_index("backend").loc["hisparse"]
    assert fp8["query_dtype"] == "fp8"
    run_harness("selection=indexer", "selection.query_dtype=bf16", "backend=hisparse", "top_k=32",
                *SMALL, f"selection.record={tmp_path}/sel.npz", f"hydra.run.dir={tmp_path}/run")
    bf16 = results.load(tmp_path / "run").iloc[0]
    assert bf16["status"] == "ok" and bf16["query_dtype"] == "bf16", bf16["error"]
    assert not np.array_equal(np.sort(Trace.load(tmp_path / "sel.npz").topk, axis=-1),
                              np.sort(Trace.load(indexer_run / "sel.npz").topk, axis=-1))
    r = run_harness("selection=indexer", "selection.query_dtype=fp16", *SMALL,
                    f"hydra.run.dir={tmp_path}/bad", check=False)
    assert r.returncode == 2 and "selection.query_dtype" in r.stderr and "bf16, fp8" in r.stderr


def test_index_query_correlation_drives_step_overlap(tmp_path):
    """Correlated index queries make consecutive selections overlap, so HiSparse hits more."""
    rates = {}
    for rho in (0.0, 0.95):
        run_harness("selection=indexer", f"selection.query_corr={rho}", "backend=hisparse", "top_k=32",
                    *SMALL, f"hydra.run.dir={tmp_path}/{rho}")
        row = results.load(tmp_path / str(rho)).iloc[0]
        assert row["status"] == "ok" and row["query_corr"] == rho
        rates[rho] = row["hit_rate"]
    assert rates[0.95] > rates[0.0] + 0.2, rates


def test_point_that_does_not_fit_is_oom_and_the_sweep_goes_on(tmp_path):
    # 2e8 tokens of context: a KV pool far beyond this machine's memory, rejected before allocating
    run_harness("-m", "context_len=200,200000000", "top_k=32", "backend=flashmla_sparse",
                *[a for a in SMALL if "context" not in a], f"hydra.sweep.dir={tmp_path}")
    df = results.load(tmp_path).set_index("context_len")
    assert df.loc[200, "status"] == "ok"
    big = df.loc[200000000]
    assert big["status"] == "oom" and "GiB" in big["error"]


def test_page_granularity_through_the_cli(tmp_path):
    common = ["backend=hisparse", "hisparse.load_granularity=page", "page_size=16", "top_k=32",
              *[a for a in SMALL if "context" not in a], "context_len=600"]
    # random top-32 over 600 tokens touches ~20 pages of 16: more than a 4-page buffer holds
    run_harness(*common, "hisparse.device_buffer_size=64", f"hydra.run.dir={tmp_path}/small")
    small = results.load(tmp_path / "small").iloc[0]
    assert small["status"] == "invalid" and "capacity 4" in small["error"] and "needs" in small["error"]
    run_harness(*common, "hisparse.device_buffer_size=512", "pattern=clustered", "step_overlap=0.5",
                f"hydra.run.dir={tmp_path}/ok")
    ok = results.load(tmp_path / "ok").iloc[0]
    assert ok["status"] == "ok" and ok["load_granularity"] == "page"
    assert ok["misses"] > 0 and ok["pages_loaded"] == ok["misses"]
    assert ok["tokens_loaded"] == 16 * ok["pages_loaded"]
    assert ok["bytes_h2d"] == ok["tokens_loaded"] * ok["kv_row_bytes"]
