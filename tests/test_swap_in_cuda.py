"""The CUDA resolve (``backends/kernels/swap_in_cuda.py``, ``swap_in_resolve.cu``).

On the GPU: the coordinator with ``ResolveLaunch(kernel='cuda')`` against the pure-Python model
(``Rig`` of ``test_hisparse_coordinator``: slots, counts, device bytes, slot map and LRU order
after every call) in token and page mode with raw selections (duplicates, -1, positions past
seq_len, the newest token, overflow), and, at the benchmark's shape (top_k 2048, 4096 hot
slots, batch 64), bit-equal to the Triton resolve in every output (device rows, counts, miss
plan, slot map, LRU) over all-hit, mixed and all-miss steps. Here: the shape rules, the bad-input
messages, and the library compiling for sm_90a when nvcc is present.
"""
import json
import shutil

import pytest
import torch

from backends.hisparse_coordinator import HiSparseCoordinator
from backends.kernels.swap_in import RESOLVE_KERNELS, ResolveLaunch
from backends.kernels.swap_in_cuda import (MAX_DYNAMIC_SMEM, build_resolve_library,
                                           cuda_resolve_shape)
from cli import run_harness
from harness import results
from harness.validate import ConfigError, check_value
from test_hisparse_coordinator import Rig

CUDA = ResolveLaunch(kernel="cuda")


def test_shape_rules():
    s = cuda_resolve_shape(2048, 4096)
    assert (s.threads, s.ept, s.lpt, s.hash_size) == (1024, 2, 4, 8192)
    assert s.smem == (3 * 8192 + 4096) * 4
    s = cuda_resolve_shape(12, 24)                 # small: one warp, one entry / lane a thread
    assert (s.threads, s.ept, s.lpt, s.hash_size) == (32, 1, 1, 64)
    s = cuda_resolve_shape(2048, 4096, num_warps=8)
    assert (s.threads, s.ept, s.lpt) == (256, 8, 16)
    s = cuda_resolve_shape(3000, 3001)             # not powers of two
    assert s.threads * s.ept >= 3000 and s.threads * s.lpt >= 3001 and s.hash_size == 16384
    assert cuda_resolve_shape(4096, 16384).hash_size == 8192       # 16384 would not fit
    with pytest.raises(ValueError, match="top_k <= 2048 and hot units <= 4096 at 8 warps"):
        cuda_resolve_shape(2049, 4096, num_warps=8)
    with pytest.raises(ValueError, match=f"shared memory .* more than {MAX_DYNAMIC_SMEM} B"):
        cuda_resolve_shape(8192, 16384)
    with pytest.raises(ValueError, match="num_warps must be one of"):
        cuda_resolve_shape(64, 128, num_warps=3)


def test_kernel_option_validation():
    assert RESOLVE_KERNELS == ("triton", "cuda") and ResolveLaunch().kernel == "triton"
    with pytest.raises(ValueError, match=r"ResolveLaunch.kernel must be one of \('triton', 'cuda'\)"):
        ResolveLaunch(kernel="cub")
    kw = dict(num_layers=1, max_requests=2, max_seq_len=64, row_bytes=8, top_k=8)
    with pytest.raises(ValueError, match="kernel 'cuda' needs a CUDA device and lru_order "
                                         "'upstream'.*cpu"):
        HiSparseCoordinator(device="cpu", resolve_launch=CUDA, **kw)


def test_hisparse_resolve_kernel_setting(tmp_path):
    """``hisparse.resolve_kernel``: a bad value names the field and the allowed ones; ``cuda``
    with the position order or beyond the kernel's shapes stops before any kernel runs (exit 2);
    a point records the resolve that ran (``auto`` resolved: Triton on the CPU, CUDA on a GPU
    where it can run); ``cuda`` on the CPU is an ``unavailable`` row."""
    with pytest.raises(ConfigError, match=r"hisparse.resolve_kernel='cub'.*auto, triton, cuda"):
        check_value("hisparse.resolve_kernel", "cub")
    r = run_harness("backend=hisparse", "hisparse.resolve_kernel=cuda",
                    "hisparse.lru_order=position", f"hydra.run.dir={tmp_path}/a", check=False)
    assert r.returncode == 2 and "hisparse.resolve_kernel='cuda'" in r.stderr and \
        "lru_order=upstream" in r.stderr
    r = run_harness("backend=hisparse", "hisparse.resolve_kernel=cuda", "top_k=16384",
                    "context_len=40000", f"hydra.run.dir={tmp_path}/b", check=False)
    assert r.returncode == 2 and "the CUDA resolve" in r.stderr and "Triton resolve" in r.stderr
    run_harness("-m", "backend=hisparse", "hisparse.resolve_kernel=auto,cuda", "top_k=16",
                "page_size=16", "batch_size=2", "context_len=256", "steps=2", "timing.warmup_steps=1",
                "num_layers=1",
                f"hydra.sweep.dir={tmp_path}/c")
    df = results.load(tmp_path / "c")
    got = dict(zip(df["status"] + "/" + df["resolve_kernel"].astype(str), df["error"]))
    assert set(got) == {"ok/triton", "unavailable/cuda"}, got
    assert "needs a CUDA device" in got["unavailable/cuda"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_library_compiles_for_sm90a(tmp_path):
    """Every compiled (entries, lanes) instance is in ptxas' report, for sm_90a; a second build
    with the same source and flags is reused (no recompile)."""
    lib = build_resolve_library(arch="90a", build_dir=tmp_path)
    meta = json.loads(lib.with_suffix(".json").read_text())
    kernels = [k for k in meta["ptxas"] if "resolve_upstream_kernel" in k["kernel"]]
    assert len(kernels) == 20 and all(k["arch"] == "sm_90a" for k in kernels)
    assert all(k["registers"] and k["registers"] <= 64 for k in kernels)  # 1024-thread bound
    mtime = lib.stat().st_mtime_ns
    assert build_resolve_library(arch="90a", build_dir=tmp_path) == lib
    assert lib.stat().st_mtime_ns == mtime


@pytest.mark.gpu
@pytest.mark.parametrize("gran", ["token", "page"])
def test_raw_selections_against_model(gran):
    """As the Triton resolve's test of the same name: unvalidated random selections with many
    repeats, -1, positions >= seq_len and the newest token, top_k 12, short / crossing / long
    requests, page-mode overflow; every call checked against the model."""
    rig = Rig(gran=gran, top_k=12, D=24, P=4, seed=3)
    rig.c.set_resolve_launch(CUDA)
    reqs, lens = [1, 2, 0], [12, 21, 60]
    rig.prefill(reqs, lens)
    n_over = n_miss = n_hit = 0
    for step in range(9):
        seq = [n + 1 + step for n in lens]
        sel = []
        for s in seq:
            hi = s + 6 if step % 2 else min(s, 28)
            row = rig.rng.integers(-1, hi, 12)
            row[rig.rng.integers(0, 12, 3)] = row[0]
            if step % 3 == 0:
                row[rig.rng.integers(0, 12)] = s - 1
            sel.append(row)
        for res in rig.swap(reqs, seq, sel, validate=False):
            n_over += sum(r.overflow for r in res)
            n_miss += sum(r.misses for r in res)
            n_hit += sum(r.hits for r in res)
    assert n_miss > 0 and n_hit > 0
    assert (n_over > 0) == (gran == "page")


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
def test_hit_mixed_miss_steps_against_model(pdl):
    """All-hit, mixed and all-miss steps of distinct positions (top_k 16, 32 slots), with the
    copy launched plainly and as a programmatic dependent of the resolve."""
    rig = Rig(top_k=16, D=32, P=4, max_seq=200, seed=23)
    rig.c.set_resolve_launch(CUDA)
    rig.c.set_copy_engine("uva_kernel", pdl=pdl)
    reqs, lens = [2, 0, 1], [90, 120, 150]
    rig.prefill(reqs, lens)
    for step, kind in enumerate(["hit", "mixed", "hit", "miss", "mixed", "hit"]):
        seq = [n + 1 + step for n in lens]
        res = rig.swap(reqs, seq, rig.kind_selection(reqs, seq, kind))
        want = {"hit": lambda x: x.misses == 0, "miss": lambda x: x.hits == 0,
                "mixed": lambda x: 0 < x.misses < rig.K}[kind]
        assert all(want(x) for layer in res for x in layer), (step, kind)


def _coordinator(kernel, *, top_k, D, batch, max_seq, num_warps=None):
    return HiSparseCoordinator(num_layers=1, max_requests=batch, max_seq_len=max_seq, row_bytes=16,
                            top_k=top_k, device_buffer_size=D, page_size=64, device="cuda",
                            resolve_launch=ResolveLaunch(kernel=kernel, num_warps=num_warps),
                            seed=5)


@pytest.mark.gpu
@pytest.mark.parametrize("num_warps", [None, 8])
def test_bit_equal_to_triton_at_benchmark_shape(num_warps):
    """top_k 2048, 4096 hot slots, batch 64, 32K context (int64 request ids): the CUDA and the
    Triton resolve, stepped on the same selections from the same state, agree in every output
    over all-hit, mixed (85 % overlap, with duplicates and -1) and all-miss steps."""
    K, D, B, S = 2048, 4096, 64, 32768
    cs = {k: _coordinator(k, top_k=K, D=D, batch=B, max_seq=S + 16, num_warps=num_warps)
          for k in ("triton", "cuda")}
    g = torch.Generator().manual_seed(7)
    reqs = torch.randperm(B, generator=g)
    lens = (S - torch.randint(0, 512, (B,), generator=g)).tolist()
    rows = torch.randint(0, 256, (B, S + 16, 16), dtype=torch.uint8, device="cuda")
    for c in cs.values():
        for r in range(B):
            c.load_host_kv(0, r, rows[r, :lens[reqs.tolist().index(r)] + 8])
        c.prefill(reqs.tolist(), lens)
    req_dev = reqs.to(torch.int64).cuda()
    prev = None
    for step, kind in enumerate(["miss", "hit", "mixed", "mixed", "miss", "hit"]):
        seq = [n + 1 + step for n in lens]
        sel = torch.empty(B, K, dtype=torch.int32)
        for b in range(B):
            fresh = torch.randperm(seq[b] - 1, generator=g)[:K].to(torch.int32)
            if kind == "hit":
                row = prev[b]
            elif kind == "mixed":
                keep = int(0.85 * K)
                row = torch.cat([prev[b][torch.randperm(K, generator=g)[:keep]], fresh[:K - keep]])
                row[torch.randint(0, K, (8,), generator=g)] = int(row[0])  # repeats
                row[torch.randint(0, K, (4,), generator=g)] = -1
            else:
                row = fresh
            sel[b] = row
        prev = sel
        seq_dev = torch.tensor(seq, dtype=torch.int32, device="cuda")
        outs = {}
        for k, c in cs.items():
            c.begin_step(reqs.tolist(), seq)
            outs[k] = c.swap_in_selected_pages(req_dev, seq_dev, sel.cuda(), 0).clone()
        torch.cuda.synchronize()
        t, u = cs["triton"], cs["cuda"]
        assert torch.equal(outs["triton"], outs["cuda"]), (step, kind)
        assert torch.equal(t.counts[0, :B], u.counts[0, :B]), (step, kind)
        n = int(t.counts[0, :B, 1].max())
        assert torch.equal(t.plan[:B, :1], u.plan[:B, :1])
        for lo in (1, 1 + t.max_misses):
            assert torch.equal(t.plan[:B, lo:lo + n], u.plan[:B, lo:lo + n]), (step, kind)
        assert torch.equal(t.slot_unit[0], u.slot_unit[0]) and torch.equal(t.lru[0], u.lru[0])
        misses = int(t.counts[0, :B, 1].sum())
        assert (misses == 0) == (kind == "hit"), (step, kind, misses)


def test_failed_build_is_not_retried(monkeypatch, tmp_path):
    """A build that fails (no nvcc, a compile error) is remembered for the process: ``auto``
    asks at every point, and must not recompile each time."""
    from backends.kernels import swap_in_cuda
    from backends.kernels.flashmla_peer import PeerUnavailable
    calls = []

    def failing_build(arch, build_dir):
        calls.append(arch)
        raise PeerUnavailable("nvcc failed (1) building the test library")
    monkeypatch.setattr(swap_in_cuda.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(swap_in_cuda, "build_resolve_library", failing_build)
    for _ in range(3):
        with pytest.raises(PeerUnavailable, match="nvcc failed"):
            swap_in_cuda.CudaResolve.load(arch="90a", build_dir=tmp_path)
    assert calls == ["90a"]
