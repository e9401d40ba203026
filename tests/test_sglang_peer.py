"""SGLang's HiSparse swap-in kernel as a peer (backends/kernels/sglang_peer/; the model of
upstream's kernel and the lockstep comparison: harness/sglang_model.py).

CPU: the state mapping (ours <-> upstream's buffers) round-trips against harness/lru_model.py,
the pure-Python model of upstream's policy agrees with ours in lockstep (exactly in our default
``lru_order=upstream``; in ``position`` order but the order of hit slots, which makes free
running traces diverge), our coordinator equals upstream's model free running for 50 steps
(slots, LRU, hits, misses, bytes), and the whole peer pipeline runs against our coordinator with
the model standing in for the kernel. The build (nvcc, no GPU) runs when the upstream sources
are staged. GPU: upstream's compiled kernel against our coordinator, in lockstep and free running.
"""
import shutil

import numpy as np
import pytest
import torch

from backends.hisparse_coordinator import HiSparseCoordinator
from backends.kernels.swap_in import ResolveLaunch
from backends.kernels import sglang_peer as sp
from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported
from harness import sglang_model as sm
from harness.lru_model import CoordinatorModel, HotBufferModel


def _canon_row(sel, seq, K):
    v = sorted({int(p) for p in sel if 0 <= p < seq})
    return v + [-1] * (K - len(v))


def _random_sel(rng, seq, K, dup=True):
    row = rng.integers(0, seq, K)
    if dup:
        row[rng.integers(0, K)] = row[0]
        row[rng.integers(0, K)] = -1
    if rng.random() < 0.5:
        row[rng.integers(0, K)] = seq - 1          # the newest token
    return row


# ------------------------------------------------------------------ state mapping
def test_state_round_trip_against_lru_model():
    rng = np.random.default_rng(0)
    L, R, D, P, K = 2, 3, 12, 4, 5
    m = CoordinatorModel(L, D, P, "token")
    reqs, lens = [0, 1, 2], [7, 30, 12]
    m.prefill(reqs, lens)
    for step in range(6):
        seqs = [n + step for n in lens]
        m.begin_step(reqs, seqs)
        for layer in range(L):
            m.swap_in(reqs, seqs, [_random_sel(rng, s, K) for s in seqs], layer)
    su = torch.tensor([[m.buffer(l, r).slot_unit for r in range(R)] for l in range(L)],
                      dtype=torch.int32)
    lru = torch.tensor([[m.buffer(l, r).lru for r in range(R)] for l in range(L)],
                       dtype=torch.int32)
    tokens, lru16 = sp.to_upstream_state(su, lru, P)
    assert tokens.dtype == torch.int32 and tokens.shape == (L, R, D + P)
    assert lru16.dtype == torch.int16 and lru16.shape == (L, R, D)
    assert (tokens[..., D:] == -1).all()
    assert torch.equal(tokens[..., :D], su) and torch.equal(lru16.to(torch.int32), lru)
    su2, lru2 = sp.from_upstream_state(tokens, lru16)
    for l in range(L):
        for r in range(R):
            assert su2[l, r].tolist() == m.buffer(l, r).slot_unit
            assert lru2[l, r].tolist() == m.buffer(l, r).lru
    with pytest.raises(ValueError):
        sp.to_upstream_state(su, lru[..., :-1], P)


def test_host_and_device_locs_match_coordinator():
    c = HiSparseCoordinator(num_layers=1, max_requests=3, max_seq_len=40, row_bytes=16, top_k=4,
                            device_buffer_size=8, page_size=4, device="cpu", seed=3)
    c.load_host_kv(0, 0, torch.zeros(37, 16, dtype=torch.uint8))
    c.load_host_kv(0, 2, torch.zeros(9, 16, dtype=torch.uint8))
    hl = sp.host_cache_locs(c.host_page_table, c.page_size)
    assert hl.dtype == torch.int64 and hl.is_contiguous() and hl.shape == (3, c.max_pages * 4)
    for r, n in ((0, 37), (2, 9)):
        np.testing.assert_array_equal(hl[r, :n].numpy(), c.host_rows_of(r, np.arange(n)))
        assert (hl[r, -(-n // 4) * 4:] == -1).all()
    assert (hl[1] == -1).all()
    locs = sp.device_buffer_locs(3, 8, 4)
    assert locs.dtype == torch.int32 and locs.shape == (3, 12)
    for r in range(3):
        assert locs[r].tolist() == [c.request_slot_base(r) + s for s in range(12)]


def test_canonical_selection_and_back():
    rng = np.random.default_rng(1)
    B, K = 4, 9
    seq = torch.tensor([5, 40, 3, 100])
    topk = torch.tensor(np.stack([_random_sel(rng, 120, K) for _ in range(B)]), dtype=torch.int32)
    topk[2] = -1
    canon, where = sp.canonical_selection(topk, seq)
    assert canon.dtype == torch.int32 and canon.is_contiguous()
    for b in range(B):
        assert canon[b].tolist() == _canon_row(topk[b].tolist(), int(seq[b]), K)
    back = sp.uncanonical(canon, where)             # the "slot" of an entry = its position
    valid = (topk >= 0) & (topk < seq[:, None])
    assert torch.equal(back, torch.where(valid, topk, -1))


# ------------------------------------------------------------------ the upstream model
def _lockstep(D, P, K, seqs, steps, seed, order):
    """Ours (HotBufferModel in ``order``) and upstream's model from the same state every step;
    returns the number of steps whose LRU orders differ."""
    rng = np.random.default_rng(seed)
    ours = [HotBufferModel(D, P, "token", order) for _ in seqs]
    for b, s in enumerate(seqs):
        ours[b].prefill(s)
    lru_differs = 0
    for step in range(steps):
        for b, s0 in enumerate(seqs):
            s = s0 + step
            ours[b].begin_step(s)
            up = sm.UpstreamHotBuffer.from_model(ours[b])
            sel = _random_sel(rng, s, K).tolist()
            if step % 3 == 2 and s > D:                       # mostly resident: many hits
                res = [u for u in ours[b].slot_unit if u >= 0]
                sel = list(rng.choice(res, K, replace=False))
            canon = _canon_row(sel, s, K)
            a, u = ours[b].step(s, canon), up.step(s, canon)
            assert [-1 if o is None else o for o in u.offsets] == a.offsets
            assert (u.hits, u.misses, u.loaded) == (a.hits, a.misses, a.loaded)
            assert up.tokens == ours[b].slot_unit
            n_hit_slots = a.hits - int((s - 1) in canon) if s > D else 0
            cut = D - n_hit_slots
            assert up.lru[:cut] == ours[b].lru[:cut]
            assert sorted(up.lru[cut:]) == sorted(ours[b].lru[cut:])
            lru_differs += up.lru != ours[b].lru
    return lru_differs


def test_upstream_model_equals_ours_in_lockstep_but_hit_order():
    assert _lockstep(D=16, P=4, K=8, seqs=[9, 16, 17, 60], steps=12, seed=2, order="position") > 0
    _lockstep(D=8, P=4, K=8, seqs=[30], steps=8, seed=3, order="position")      # top_k == D


def test_upstream_model_equals_ours_in_lockstep_upstream_order():
    assert _lockstep(D=16, P=4, K=8, seqs=[9, 16, 17, 60], steps=12, seed=2, order="upstream") == 0
    assert _lockstep(D=8, P=4, K=8, seqs=[30], steps=8, seed=3, order="upstream") == 0


def test_free_running_hit_order_changes_later_misses():
    """Hits keep their previous LRU order upstream, ascending position here: after step 2 the
    orders differ, step 3 evicts a different slot, step 4 hits upstream and misses here."""
    D, seq = 4, 100                                     # top_k 3
    trace = [[0, -1, -1], [0, 1, -1], [10, 11, 12], [0, -1, -1]]
    for order, want in (("position", [(0, 0), (0, 0), (3, 3), (1, 0)]),
                        ("upstream", [(0, 0), (0, 0), (3, 3), (0, 0)])):
        ours = HotBufferModel(D, 1, "token", order)
        ours.prefill(seq)                               # slots hold 0..3, LRU [0, 1, 2, 3]
        up = sm.UpstreamHotBuffer.from_model(ours)
        got = [(ours.step(seq, s).misses, up.step(seq, s).misses) for s in trace]
        assert (ours.lru != up.lru) == (order == "position")
        assert got == want, order


def test_upstream_model_refuses_duplicates_and_keeps_untouched_outputs():
    up = sm.UpstreamHotBuffer(4, [0, 1, 2, 3], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="duplicate"):
        up.step(50, [7, 7, -1])
    st = up.step(50, [1, -1, 49])
    assert st.offsets == [1, None, 4] and st.hits == 2 and st.misses == 0
    short = sm.UpstreamHotBuffer(8).step(3, [2, 0, 1, 5])   # count = min(seq, K) = 3
    assert short.offsets == [2, 0, 1, -1]


# ------------------------------------------------------------------ the peer pipeline on CPU
def _pair(device, *, L=2, R=3, max_seq=96, row_bytes=16, K=8, D=24, P=4, seed=0,
          resolve_kernel="triton"):
    """Ours and the peer's pools: same config, seed and host KV, hence identical pools; ours
    resolves with ``resolve_kernel``."""
    kw = dict(num_layers=L, max_requests=R, max_seq_len=max_seq, row_bytes=row_bytes, top_k=K,
              device_buffer_size=D, page_size=P, device=device, seed=seed)
    ours = HiSparseCoordinator(**kw, resolve_launch=ResolveLaunch(kernel=resolve_kernel))
    pools = HiSparseCoordinator(**kw)
    g = torch.Generator().manual_seed(seed + 1)
    kv = torch.randint(0, 256, (L, R, max_seq, row_bytes), dtype=torch.uint8, generator=g)
    for c in (ours, pools):
        for r in range(R):
            c.load_host_kv_all_layers(r, kv[:, r])
    return ours, pools, kv


def _lockstep_peer(ours, pools, peer, kv, reqs, lens, steps, seed, dtype=torch.int32):
    rng = np.random.default_rng(seed)
    dev = ours.device
    for c in (ours, pools):
        c.prefill(reqs, lens)
    totals = []
    for step in range(steps):
        seqs = [n + 1 + step for n in lens]
        for c in (ours, pools):
            c.begin_step(reqs, seqs)
        sel = np.stack([_random_sel(rng, s, ours.top_k) for s in seqs])
        for layer in range(ours.num_layers):
            rep = sm.compare_step(ours, peer, torch.tensor(reqs, dtype=dtype, device=dev),
                                  torch.tensor(seqs, dtype=dtype, device=dev),
                                  torch.tensor(sel, dtype=torch.int32, device=dev), layer)
            bad = [k for k in ("slots", "slot_map", "misses", "hits", "pool", "lru_prefix",
                               "lru_hit_set", "model") if not rep[k]]
            assert not bad, (step, layer, bad, rep)
            out = peer.out[:len(reqs)]
            pool = pools.device_pool(layer).cpu()
            for b, r in enumerate(reqs):       # the bytes behind upstream's slots
                live = peer.last_selection[b] >= 0
                rows = pool[out[b][live].cpu().long()]
                pos = peer.last_selection[b][live].cpu().long()
                assert torch.equal(rows, kv[layer, r, pos])
            totals.append((rep["n_hits"], rep["n_misses"], rep["lru_exact"]))
    return totals


def test_peer_pipeline_with_model_kernel_against_coordinator():
    ours, pools, kv = _pair("cpu")
    peer = sm.modelled_peer(pools)
    totals = _lockstep_peer(ours, pools, peer, kv, reqs=[2, 0, 1], lens=[10, 23, 50], steps=5,
                            seed=4, dtype=torch.int64)
    assert sum(m for _, m, _ in totals) > 0 and sum(h for h, _, _ in totals) > 0
    assert all(exact for _, _, exact in totals)        # our default order is upstream's


def _free_running(pools, peer, kv, reqs, lens, steps, seed):
    """The peer on its own (no syncing from ours) for ``steps`` decode steps of layer 0: every
    step's misses, upstream state and the device bytes behind its output slots equal the
    pure-Python model of upstream's policy, started from the grown buffers."""
    dev = pools.device
    K, D = pools.top_k, pools.device_buffer_size
    pools.prefill(reqs, lens)
    peer.prefill(reqs)
    growth = CoordinatorModel(1, D, pools.page_size, "token")
    growth.prefill(reqs, lens)
    models = {r: sm.UpstreamHotBuffer.from_model(growth.buffer(0, r)) for r in reqs}
    rng = np.random.default_rng(seed)
    for step in range(steps):
        seqs = [n + 1 + step for n in lens]
        pools.begin_step(reqs, seqs)
        peer.begin_step(reqs, seqs)
        growth.begin_step(reqs, seqs)
        sel = np.stack([_random_sel(rng, s, K) for s in seqs])
        out = peer.swap_in(torch.tensor(reqs, device=dev), torch.tensor(seqs, device=dev),
                           torch.tensor(sel, dtype=torch.int32, device=dev), 0).cpu()
        su, lru = (t.cpu() for t in peer.state(0))
        misses = peer.last_counts()["misses"].cpu()
        pool = pools.device_pool(0).cpu()
        for b, (r, s) in enumerate(zip(reqs, seqs)):
            if s <= D + 1:                      # not long before this step: grown in order
                models[r] = sm.UpstreamHotBuffer.from_model(growth.buffer(0, r))
            st = models[r].step(s, _canon_row(sel[b], s, K))
            assert int(misses[b]) == st.misses
            assert su[r].tolist() == models[r].tokens and lru[r].tolist() == models[r].lru
            live = torch.from_numpy((sel[b] >= 0) & (sel[b] < s))
            assert torch.equal(pool[out[b][live].long()], kv[0, r, torch.from_numpy(sel[b])[live].long()])
            assert (out[b][~live] == -1).all()


def test_peer_free_running_with_model_kernel():
    _, pools, kv = _pair("cpu", L=1)
    peer = sm.modelled_peer(pools)
    _free_running(pools, peer, kv, reqs=[1, 0], lens=[20, 40], steps=8, seed=5)


def _contract_row(rng, resident, s, K, D):
    """A selection row upstream's kernel takes as is (``selection_contract_error``: distinct
    positions < ``s``): a short request's compacted with -1 at the end; a long request's ``K``
    positions (no -1: an indexer's top-k of a request longer than ``K``), >= 2 of them among
    the ``resident`` ones, the others misses or further hits and sometimes the newest token, in
    random order (misses are taken in selection order)."""
    if s <= D:
        n = int(rng.integers(1, min(s, K) + 1))
        return np.concatenate([rng.permutation(s)[:n], np.full(K - n, -1)])
    resident = [u for u in resident if 0 <= u < s - 1]
    n_hit = int(rng.integers(2, K // 2 + 1))
    hits = rng.choice(resident, n_hit, replace=False)
    rest = np.setdiff1d(np.arange(s - 1), hits)
    newest = rng.random() < 0.5
    row = np.concatenate([hits, rng.choice(rest, K - n_hit - newest, replace=False),
                          [s - 1] * newest]).astype(np.int64)
    rng.shuffle(row)
    return row


def _free_running_vs_upstream(device, make_peer, steps=50, seed=11, resolve_kernel="triton"):
    """Our coordinator (default ``lru_order=upstream``, resolving with ``resolve_kernel``) and
    upstream's kernel (``make_peer``),
    each from its own state, on the same selections for ``steps`` decode steps of layer 0: a
    request that crosses ``D`` at step 8 and two long ones. At every step the returned rows,
    hits, misses, slot maps and LRU orders are identical and the rows hold the selected KV."""
    K, D, P = 16, 48, 16
    ours, pools, kv = _pair(device, L=1, K=K, D=D, P=P, row_bytes=32, max_seq=200, seed=seed,
                            resolve_kernel=resolve_kernel)
    assert ours.lru_order == "upstream" and ours.resolve_launch.kernel == resolve_kernel
    peer = make_peer(pools)
    reqs, lens = [2, 0, 1], [40, 60, 100]
    rng = np.random.default_rng(seed)
    for c in (ours, pools):
        c.prefill(reqs, lens)
    peer.prefill(reqs)
    req_t = torch.tensor(reqs, dtype=torch.int32, device=device)
    long_hits = 0
    for step in range(steps):
        seqs = [n + 1 + step for n in lens]
        for c in (ours, pools):
            c.begin_step(reqs, seqs)
        peer.begin_step(reqs, seqs)
        su = ours.slot_unit[0].cpu()
        sel = np.stack([_contract_row(rng, su[r].tolist(), s, K, D) for r, s in zip(reqs, seqs)])
        assert sp.selection_contract_error(sel, np.array(seqs), D) is None
        seq_t = torch.tensor(seqs, dtype=torch.int32, device=device)
        sel_t = torch.tensor(sel, dtype=torch.int32, device=device)
        out_o = ours.swap_in_selected_pages(req_t, seq_t, sel_t, 0).cpu()
        out_p = peer.swap_in_direct(req_t, seq_t, sel_t, 0).cpu()
        c_o = {k: v.cpu() for k, v in ours.last_counts.items()}
        c_p = {k: v.cpu() for k, v in peer.last_counts().items()}
        # upstream leaves the output of a -1 entry untouched (TOKEN_HIT == -1 == HASH_EMPTY in
        # its kernel), so it holds whatever an earlier call wrote there; ours writes -1
        live_t = torch.from_numpy(sel >= 0)
        assert torch.equal(out_o[live_t], out_p[live_t]), step
        assert (out_o[~live_t] == -1).all(), step
        assert torch.equal(c_o["hits"], c_p["hits"]) and torch.equal(c_o["misses"], c_p["misses"]), \
            (step, c_o["hits"], c_p["hits"], c_o["misses"], c_p["misses"])
        su_p, lru_p = (t.cpu() for t in peer.state(0))
        idx = torch.tensor(reqs)
        assert torch.equal(ours.slot_unit[0].cpu()[idx], su_p[idx]), step
        assert torch.equal(ours.lru[0].cpu()[idx], lru_p[idx]), step
        for name, c in (("ours", ours), ("upstream", pools)):
            pool = c.device_pool(0).cpu()
            for b, r in enumerate(reqs):
                live = torch.from_numpy(sel[b] >= 0)
                got = pool[(out_o if name == "ours" else out_p)[b][live].long()]
                assert torch.equal(got, kv[0, r, torch.from_numpy(sel[b])[live].long()]), (name, step)
        long_hits += sum(int(c_o["hits"][b]) >= 2 for b, s in enumerate(seqs) if s > D)
    assert long_hits >= 2 * steps            # every long row of every step had >= 2 hits


def test_free_running_50_steps_equal_upstream_model():
    """CPU: our coordinator against upstream's policy (``UpstreamHotBuffer`` standing in for
    the kernel through ``ModelSwapInKernel``), free running."""
    _free_running_vs_upstream("cpu", sm.modelled_peer)


# ------------------------------------------------------------------ contract, config, no GPU
def _fake_header(params=sp.EXPECTED_PARAMS, tpl=sp.EXPECTED_TEMPLATE):
    return ("// synthetic\ntemplate <\n    " + ",\n    ".join(tpl) + ">\n__global__ void "
            + sp.KERNEL_NAME + "(\n    " + ",\n    ".join(
                p.replace("* ", "* __restrict__ ") for p in params) + ") {\n}\n")


def test_contract_check():
    sp.check_kernel_contract(_fake_header())
    changed = list(sp.EXPECTED_PARAMS)
    changed.insert(13, "int64_t new_arg")
    with pytest.raises(PeerUnavailable, match="#13 is 'int64_t new_arg'"):
        sp.check_kernel_contract(_fake_header(params=changed))
    with pytest.raises(PeerUnavailable, match="template parameters"):
        sp.check_kernel_contract(_fake_header(tpl=sp.EXPECTED_TEMPLATE[:4]))
    with pytest.raises(PeerUnavailable, match="no __global__"):
        sp.check_kernel_contract("int main() {}")


def test_staged_header_matches_contract():
    st = sp.staged_sources()
    if st is None:
        pytest.skip("no staged sglang sources (python -m backends.kernels.sglang_peer stage ...)")
    sp.check_kernel_contract(st.header_text)


def test_config_limits_and_smem():
    assert sp.smem_bytes(2048, 4096) == 42000          # < 48 KiB: no opt-in
    assert sp.smem_bytes(2048, 8192) > 48 * 1024
    sp.KernelConfig(2048, 4096).validate()
    for cfg in (sp.KernelConfig(64, 32), sp.KernelConfig(16, 40000), sp.KernelConfig(16, 32, 100),
                sp.KernelConfig(30000, 30000)):
        with pytest.raises(PeerUnsupported):
            cfg.validate()
    cmd = sp.nvcc_command(sp.KernelConfig(2048, 4096), sp.DEFAULT_BUILD_DIR / "src",
                          sp.DEFAULT_BUILD_DIR / "x.cu", sp.DEFAULT_BUILD_DIR / "x.so", "90a")
    assert "-gencode=arch=compute_90a,code=sm_90a" in cmd and "-DSGL_CUDA_ARCH=900" in cmd
    assert "-DPEER_TOP_K=2048" in cmd and "-DPEER_HOT_BUFFER=4096" in cmd


def test_without_cuda_peer_unavailable():
    c = HiSparseCoordinator(num_layers=1, max_requests=1, max_seq_len=32, row_bytes=16, top_k=4,
                            device_buffer_size=8, page_size=4, device="cpu")
    with pytest.raises(PeerUnavailable, match="CUDA"):
        sp.SGLangHiSparsePeer(c)
    pc = HiSparseCoordinator(num_layers=1, max_requests=1, max_seq_len=32, row_bytes=16,
                             top_k=4, device_buffer_size=8, page_size=4, device="cpu",
                             load_granularity="page")
    with pytest.raises(PeerUnsupported, match="token-granular"):
        sp.SGLangHiSparsePeer(pc, kernel=sm.ModelSwapInKernel(sp.KernelConfig(4, 8)))


@pytest.mark.slow
def test_build_and_load_without_gpu(tmp_path):
    """nvcc builds our launcher around the staged upstream header; ctypes loads the library and
    reads back the compiled configuration (no GPU needed for that)."""
    st = sp.staged_sources()
    if st is None or shutil.which("nvcc") is None:
        pytest.skip("needs staged sglang sources and nvcc")
    shutil.copytree(sp.DEFAULT_BUILD_DIR / "src", tmp_path / "src")
    cfg = sp.KernelConfig(16, 48, 128)
    lib = sp.build_library(cfg, arch="90a", build_dir=tmp_path)
    k = sp.SGLangSwapInKernel(lib, cfg)
    assert k.config()[:4] == (128, 16, 48, sp.smem_bytes(16, 48))
    usage = sp.ptxas_usage(lib.with_suffix(".log").read_text())
    assert len(usage) == 16 and all(u["registers"] for u in usage)
    assert sp.build_library(cfg, arch="90a", build_dir=tmp_path) == lib   # reused, no rebuild
    with pytest.raises(PeerUnavailable):
        k.kernel_attrs()


# ------------------------------------------------------------------ GPU: the real kernel
def _gpu_peer(pools, **kw):
    try:
        return sp.SGLangHiSparsePeer(pools, **kw)
    except PeerUnavailable as e:
        pytest.skip(f"sglang peer unavailable: {e}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_gpu_lockstep_small_random(dtype):
    ours, pools, kv = _pair("cuda", K=16, D=48, P=16, row_bytes=32, max_seq=200)
    peer = _gpu_peer(pools)
    totals = _lockstep_peer(ours, pools, peer, kv, reqs=[2, 0, 1], lens=[20, 47, 120],
                            steps=12, seed=6, dtype=dtype)
    assert sum(m for _, m, _ in totals) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("resolve_kernel", ["triton", "cuda"])
def test_gpu_lockstep_dsv32_size(resolve_kernel):
    """top_k 2048, D 4096, 64-token pages, 656 B rows: upstream's kernel (block 960) on a long
    and a short request, ~60% overlap between steps, against our coordinator (either resolve)."""
    K, D, P = 2048, 4096, 64
    ours, pools, kv = _pair("cuda", L=1, R=2, max_seq=20000, row_bytes=656, K=K, D=D, P=P,
                            resolve_kernel=resolve_kernel)
    assert pools.host_kv.is_pinned()
    peer = _gpu_peer(pools)
    attrs = peer.kernel.kernel_attrs(record=True)
    assert attrs["registers"] > 0 and attrs["dynamic_smem"] == sp.smem_bytes(K, D)
    rng = np.random.default_rng(7)
    reqs, lens = [1, 0], [16000, 3000]
    for c in (ours, pools):
        c.prefill(reqs, lens)
    prev = [None, None]
    for step in range(4):
        seq = [n + 1 + step for n in lens]
        for c in (ours, pools):
            c.begin_step(reqs, seq)
        sel = []
        for b, s in enumerate(seq):
            row = rng.permutation(s)[:K] if prev[b] is None else \
                np.concatenate([prev[b][:1200], rng.permutation(s)[:K - 1200]])
            prev[b] = row
            sel.append(row)
        rep = sm.compare_step(ours, peer, torch.tensor(reqs, device="cuda"),
                              torch.tensor(seq, device="cuda"),
                              torch.tensor(np.stack(sel), dtype=torch.int32, device="cuda"), 0)
        bad = [k for k in ("slots", "slot_map", "misses", "hits", "pool", "lru_prefix",
                           "lru_hit_set", "model") if not rep[k]]
        assert not bad, (step, bad, rep)


@pytest.mark.gpu
@pytest.mark.parametrize("resolve_kernel", ["triton", "cuda"])
def test_gpu_free_running_50_steps_equal_sglang_kernel(resolve_kernel):
    """GPU: our coordinator (either resolve) against SGLang's compiled kernel, each free running
    on its own state for 50 steps: identical slots, hits, misses, slot maps and LRU at every
    step."""
    _free_running_vs_upstream("cuda", _gpu_peer, resolve_kernel=resolve_kernel)


@pytest.mark.gpu
def test_gpu_free_running_matches_upstream_model():
    _, pools, kv = _pair("cuda", L=1, K=16, D=48, P=16, row_bytes=32, max_seq=200)
    _free_running(pools, _gpu_peer(pools), kv, reqs=[1, 0], lens=[30, 60], steps=15, seed=8)

