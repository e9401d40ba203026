"""Host pools the GPU reads in place (``backends/host_memory.py``), and the coordinator over them."""
import numpy as np
import pytest
import torch

from backends.hisparse_coordinator import HiSparseCoordinator
from backends.copy_engines import row_tile, word_view
from backends.host_memory import HUGE_PAGE, HostRows, anon_huge_fraction, copy_pool_rows
from backends.kernels.host_copy import copy_indexed_rows_kernel
from harness.lru_model import CoordinatorModel


@pytest.mark.parametrize("alloc", ["pinned", "registered", "thp"])
def test_host_rows_hold_what_is_written(alloc):
    m = HostRows((300, 656), alloc, cuda=False)
    assert m.tensor.shape == (300, 656) and m.tensor.dtype == torch.uint8
    x = torch.randint(0, 256, (300, 656), dtype=torch.uint8)
    m.tensor.copy_(x)
    assert torch.equal(m.tensor, x)
    if alloc == "thp":
        assert m.tensor.data_ptr() % HUGE_PAGE == 0      # aligned for whole huge pages
        f = m.huge_fraction
        assert np.isnan(f) or 0.0 <= f <= 1.0


def test_host_rows_reject_an_unknown_allocation():
    with pytest.raises(ValueError, match="host_alloc must be one of .*pinned.*registered.*thp"):
        HostRows((4, 4), "hugetlbfs", cuda=False)
    with pytest.raises(ValueError, match="host_alloc must be one of"):
        HiSparseCoordinator(num_layers=1, max_requests=1, max_seq_len=64, row_bytes=16, top_k=4,
                            host_alloc="malloc", device="cpu")


@pytest.mark.parametrize("row_bytes", [656, 42])      # 16-byte groups / 2-byte words
def test_indexed_row_kernel_writes_exactly_the_named_rows(row_bytes):
    """``copy_indexed_rows_kernel`` (the host pool's fill on the GPU; here through the
    interpreter): ``dst[dst_rows[i]] = src[src_rows[i]]`` for every i, every other row untouched,
    with a row count that is not a multiple of the program's rows."""
    g = torch.Generator().manual_seed(3)
    n, pool_rows, rows_per_program = 37, 200, 8
    src = torch.randint(0, 256, (n, row_bytes), dtype=torch.uint8, generator=g)
    pool = torch.randint(0, 256, (pool_rows, row_bytes), dtype=torch.uint8, generator=g)
    want = pool.clone()
    src_rows = torch.randperm(n, generator=g)
    dst_rows = torch.randperm(pool_rows, generator=g)[:n]
    want[dst_rows] = src[src_rows]
    s, d = word_view(src), word_view(pool)
    copy_indexed_rows_kernel[(-(-n // rows_per_program),)](
        s, d, src_rows, dst_rows, n, **row_tile(s), ROWS=rows_per_program)
    assert torch.equal(pool, want)


def test_copy_pool_rows_on_the_cpu_scatters_and_gathers_the_rows():
    g = torch.Generator().manual_seed(4)
    pool = HostRows((90, 656), "registered", cuda=False).tensor
    pool.copy_(torch.randint(0, 256, pool.shape, dtype=torch.uint8, generator=g))
    want = pool.clone()
    rows = torch.randint(0, 256, (40, 656), dtype=torch.uint8, generator=g)
    idx = np.random.default_rng(4).choice(90, 30, replace=False)
    want[torch.from_numpy(idx)] = rows[:30]
    copy_pool_rows(pool, idx, rows)                 # src_rows None: rows 0 .. n-1
    assert torch.equal(pool, want)
    pick = np.random.default_rng(5).choice(40, 30, replace=False)
    want[torch.from_numpy(idx)] = rows[torch.from_numpy(pick)]
    copy_pool_rows(pool, idx, rows, pick)
    assert torch.equal(pool, want)


@pytest.mark.gpu
@pytest.mark.parametrize("alloc", ["pinned", "registered", "thp"])
def test_copy_pool_rows_between_the_gpu_and_every_host_pool(alloc):
    """Device rows into a page-locked pool (the fill) and pool rows into device rows (the hot
    buffers' set-up), by the UVA kernel: each equals the same copy done on the CPU (untouched
    rows kept), readable by the CPU right after the call."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (GPU test)")
    g = torch.Generator().manual_seed(5)
    rng = np.random.default_rng(5)
    pool = HostRows((50000, 656), alloc).tensor
    pool.copy_(torch.randint(0, 256, pool.shape, dtype=torch.uint8, generator=g))
    want = pool.clone()
    rows = torch.randint(0, 256, (12345, 656), dtype=torch.uint8, generator=g)
    idx = rng.choice(50000, 12345, replace=False)
    want[torch.from_numpy(idx)] = rows
    copy_pool_rows(pool, idx, rows.cuda())
    assert torch.equal(pool, want)
    dev = torch.randint(0, 256, (3000, 656), dtype=torch.uint8, generator=g).cuda()
    dev_want = dev.clone()
    src, dst = rng.choice(50000, 2000, replace=False), rng.choice(3000, 2000, replace=False)
    dev_want[torch.from_numpy(dst).cuda()] = want[torch.from_numpy(src)].cuda()
    copy_pool_rows(dev, dst, pool, src)
    assert torch.equal(dev, dev_want)


def test_huge_fraction_of_memory_outside_any_mapping_is_zero():
    f = anon_huge_fraction(8, 4096)
    assert f == 0.0 or np.isnan(f)


def test_coordinator_on_thp_memory_matches_the_model():
    """The swap-in over a huge-page host pool loads the same rows and keeps the same LRU as the
    pure-Python model (the pool's memory is the only difference from the default)."""
    rng = np.random.default_rng(5)
    K, D, S, B = 8, 16, 120, 2
    c = HiSparseCoordinator(num_layers=1, max_requests=B, max_seq_len=S + 8, row_bytes=64,
                            top_k=K, device_buffer_size=D, page_size=8, host_alloc="thp",
                            device="cpu")
    assert c.host_alloc == "thp" and c.host_kv.data_ptr() % HUGE_PAGE == 0
    model = CoordinatorModel(1, D, 8, "token")
    rows = {r: torch.randint(0, 256, (S + 8, 64), dtype=torch.uint8) for r in range(B)}
    for r in range(B):
        c.load_host_kv(0, r, rows[r])
    c.prefill(list(range(B)), [S - 1] * B)
    model.prefill(list(range(B)), [S - 1] * B)
    for step in range(4):
        seq = S + step
        c.begin_step(list(range(B)), [seq] * B)
        model.begin_step(list(range(B)), [seq] * B)
        sel = np.stack([rng.choice(seq - 1, K, replace=False) for _ in range(B)]).astype(np.int32)
        out = c.swap_in_selected_pages(torch.arange(B, dtype=torch.int32),
                                       torch.full((B,), seq, dtype=torch.int32),
                                       torch.from_numpy(sel), 0)
        want = model.swap_in(list(range(B)), [seq] * B, sel, 0)
        assert c.last_counts["misses"].tolist() == [w.misses for w in want]
        assert sum(w.misses for w in want) > 0
        for b in range(B):       # the device row behind each entry holds the selected row
            got = c.device_kv[0, out[b].long()]
            assert torch.equal(got, rows[b][torch.from_numpy(sel[b]).long()])


@pytest.mark.gpu
def test_every_host_pool_on_the_gpu_serves_the_same_rows():
    """On CUDA (host memory read in place over UVA by the copy kernel): the same steps over a
    pinned, a registered and a THP pool give the same slot tables, counts and device rows, and
    every device row is the selected host row."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (GPU test)")
    rng = np.random.default_rng(11)
    K, D, S, B = 256, 512, 20000, 8
    kw = dict(num_layers=1, max_requests=B, max_seq_len=S + 16, row_bytes=656, top_k=K,
              device_buffer_size=D, page_size=64, device="cuda", seed=2)
    pools = {a: HiSparseCoordinator(host_alloc=a, **kw) for a in ("pinned", "registered", "thp")}
    assert HiSparseCoordinator(**kw).host_alloc == "registered"      # SGLang's, the default
    assert pools["thp"].host_kv.data_ptr() % HUGE_PAGE == 0
    for c in pools.values():                      # page-locked: the UVA copy kernel's check
        assert c.host_kv.is_pinned()
    rows = [torch.randint(0, 256, (S + 16, 656), dtype=torch.uint8) for _ in range(B)]
    for c in pools.values():
        for r in range(B):
            c.load_host_kv(0, r, rows[r])
        c.prefill(list(range(B)), [S - 1] * B)
    req = torch.arange(B, dtype=torch.int32, device="cuda")
    for step in range(3):
        seq = S + step
        sel = np.stack([rng.choice(seq - 1, K, replace=False) for _ in range(B)]).astype(np.int32)
        outs = {}
        for a, c in pools.items():
            c.begin_step(list(range(B)), [seq] * B)
            outs[a] = c.swap_in_selected_pages(req, torch.full((B,), seq, dtype=torch.int32,
                                                               device="cuda"),
                                               torch.from_numpy(sel).cuda(), 0).clone()
        for a, c in pools.items():
            assert torch.equal(outs["pinned"], outs[a])
            assert torch.equal(pools["pinned"].last_counts["misses"], c.last_counts["misses"])
            dev = c.device_kv[0]
            for b in range(B):
                assert torch.equal(dev[outs[a][b].long()].cpu(),
                                   rows[b][torch.from_numpy(sel[b]).long()])
