"""Host pools the GPU reads in place (``backends/host_memory.py``), and the coordinator over them."""
import numpy as np
import pytest
import torch

from backends.hisparse_coordinator import HiSparseCoordinator
from backends.copy_engines import row_tile, word_view
import backends.host_memory as host_memory
from backends.host_memory import (HUGE_PAGE, HUGETLB_PAGE, HostRows, anon_huge_fraction,
                                  copy_pool_rows, hugetlb_free_bytes)
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


def _fake_hugepages(tmp_path, free_2m, free_1g):
    for kb, free in ((2048, free_2m), (1048576, free_1g)):
        d = tmp_path / f"hugepages-{kb}kB"
        d.mkdir()
        (d / "free_hugepages").write_text(f"{free}\n")
    return str(tmp_path)


@pytest.mark.parametrize("alloc", ["hugetlb_2m", "hugetlb_1g"])
def test_hugetlb_without_enough_free_pages_names_the_pool_to_reserve(alloc, tmp_path,
                                                                     monkeypatch):
    """Too few free pages of the size: MemoryError naming the allocation, the pages needed and
    held, and the sysfs file that reserves them, before anything is mapped; the coordinator
    turns it into its OOM error (a sweep's status row)."""
    monkeypatch.setattr(host_memory, "_HUGEPAGES_DIR", _fake_hugepages(tmp_path, 1, 0))
    page = HUGETLB_PAGE[alloc]
    assert hugetlb_free_bytes(page) == (page if alloc == "hugetlb_2m" else 0)
    rows = (3 * page // 656 + 1, 656)                # 3 pages and a byte: 4 pages needed
    with pytest.raises(MemoryError, match=rf"host_alloc {alloc} needs 4 free {page >> 20} MiB "
                       rf"huge pages, the kernel has {1 if alloc == 'hugetlb_2m' else 0}: .*"
                       rf"hugepages-{page >> 10}kB/nr_hugepages"):
        HostRows(rows, alloc, cuda=False)
    from harness.bench.swap_in import pool_fits          # the bench skips such a pool
    ok, why = pool_fits(rows[0] * rows[1], alloc)
    assert not ok and f"host_alloc {alloc} needs 4 free" in why
    from backends.hisparse_coordinator import HiSparseOOMError
    with pytest.raises(HiSparseOOMError, match=f"{alloc} host memory.*needs"):
        HiSparseCoordinator(num_layers=1, max_requests=4, max_seq_len=1 << 20, row_bytes=656,
                            top_k=4, host_alloc=alloc, device="cpu")


def test_hugetlb_free_bytes_reads_the_kernels_pool(tmp_path, monkeypatch):
    monkeypatch.setattr(host_memory, "_HUGEPAGES_DIR", _fake_hugepages(tmp_path, 7, 2))
    assert hugetlb_free_bytes(2 << 20) == 7 * (2 << 20)
    assert hugetlb_free_bytes(1 << 30) == 2 << 30
    assert hugetlb_free_bytes(16 << 30) == 0             # no such pool


@pytest.mark.parametrize("cuda", [False, pytest.param(True, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("alloc", ["hugetlb_2m", "hugetlb_1g"])
def test_hugetlb_rows_hold_what_is_written_where_pages_are_reserved(alloc, cuda):
    """Where the machine has free pages of the size (none are reserved by this test): the rows
    lie in a mapping aligned to the page, hold what is written, and (on CUDA) a GPU kernel reads
    them in place."""
    page = HUGETLB_PAGE[alloc]
    if hugetlb_free_bytes(page) < page:
        pytest.skip(f"no free {page >> 20} MiB huge pages here")
    m = HostRows((3000, 656), alloc, cuda=cuda)
    assert m.tensor.data_ptr() % page == 0 and m.huge_fraction == 1.0
    x = torch.randint(0, 256, (3000, 656), dtype=torch.uint8,
                      generator=torch.Generator().manual_seed(9))
    m.tensor.copy_(x)
    assert torch.equal(m.tensor, x)
    if cuda:
        assert m.tensor.is_pinned()
        idx = np.random.default_rng(9).choice(3000, 500, replace=False)
        dev = torch.zeros((500, 656), dtype=torch.uint8, device="cuda")
        copy_pool_rows(dev, np.arange(500), m.tensor, idx)
        assert torch.equal(dev.cpu(), x[torch.from_numpy(idx)])


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


def test_copy_pool_rows_rejects_row_lists_the_kernel_would_overrun():
    """The UVA kernel bounds neither list: mismatched lengths or rows outside a pool raise a
    ValueError naming the list (on every path) instead of reading or writing past a pool."""
    pool = torch.zeros((10, 16), dtype=torch.uint8)
    rows = torch.ones((4, 16), dtype=torch.uint8)
    with pytest.raises(ValueError, match="src_rows has 3 entries, dst_rows 4"):
        copy_pool_rows(pool, [0, 1, 2, 3], rows, [0, 1, 2])
    with pytest.raises(ValueError, match=r"dst_rows must be in \[0, 10\), got 0 .. 10"):
        copy_pool_rows(pool, [0, 1, 2, 10], rows)
    with pytest.raises(ValueError, match=r"src_rows must be in \[0, 4\), got -1 .. 2"):
        copy_pool_rows(pool, [0, 1, 2, 3], rows, [0, 1, 2, -1])
    with pytest.raises(ValueError, match=r"src_rows must be in \[0, 4\)"):
        copy_pool_rows(pool, np.arange(5), rows)            # src_rows None: rows 0 .. 4 of 4
    assert not pool.any()


class _FakePool:
    """What ``_uva_device`` asks of a pool, without a GPU."""

    def __init__(self, device, pinned=False, contiguous=True):
        self.device, self.is_cuda = torch.device(device), torch.device(device).type == "cuda"
        self._pinned, self._contiguous = pinned, contiguous

    def is_pinned(self):
        return self._pinned

    def is_contiguous(self):
        return self._contiguous


def test_uva_copy_only_between_one_device_and_contiguous_page_locked_memory():
    """``copy_pool_rows`` takes its UVA kernel only where the kernel is right: never across two
    CUDA devices (a pointer of one read by the other's kernel), never into a strided ``dst``
    (the kernel ignores strides) nor from a strided host ``src`` (its contiguous copy would be
    pageable); the launch goes to the pools' device, not the current one."""
    from backends.host_memory import _uva_device
    dev0, dev1 = _FakePool("cuda:0"), _FakePool("cuda:1")
    host = _FakePool("cpu", pinned=True)
    assert _uva_device(dev1, host) == torch.device("cuda:1")
    assert _uva_device(host, dev1) == torch.device("cuda:1")
    assert _uva_device(dev1, _FakePool("cuda:1", contiguous=False)) == torch.device("cuda:1")
    assert _uva_device(dev0, dev1) is None and _uva_device(dev1, dev0) is None
    assert _uva_device(_FakePool("cuda:0", contiguous=False), host) is None
    assert _uva_device(_FakePool("cpu", pinned=True, contiguous=False), dev0) is None
    assert _uva_device(dev0, _FakePool("cpu", pinned=True, contiguous=False)) is None
    assert _uva_device(dev0, _FakePool("cpu")) is None               # pageable
    assert _uva_device(host, _FakePool("cpu", pinned=True)) is None  # no device


@pytest.mark.gpu
def test_copy_pool_rows_with_strided_pools_on_the_gpu():
    """A strided device ``dst`` and a strided page-locked ``src`` give the CPU's result."""
    g = torch.Generator().manual_seed(6)
    rng = np.random.default_rng(6)
    big = HostRows((400, 656), "pinned").tensor
    big.copy_(torch.randint(0, 256, big.shape, dtype=torch.uint8, generator=g))
    src = big[::2]                                    # pinned, strided
    dev_big = torch.randint(0, 256, (300, 656), dtype=torch.uint8, generator=g).cuda()
    dst = dev_big[::3]                                # 100 strided device rows
    s, d = rng.choice(200, 50, replace=False), rng.choice(100, 50, replace=False)
    want = dev_big.clone()
    want[::3][torch.from_numpy(d).cuda()] = src[torch.from_numpy(s)].cuda()
    copy_pool_rows(dst, d, src, s)
    assert torch.equal(dev_big, want)


@pytest.mark.gpu
def test_copy_pool_rows_on_a_device_other_than_the_current_one():
    """Pools on cuda:1 while cuda:0 is current, and rows moved between two devices."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices (GPU test)")
    g = torch.Generator().manual_seed(7)
    rows = torch.randint(0, 256, (64, 656), dtype=torch.uint8, generator=g)
    pool = HostRows((128, 656), "pinned").tensor
    pool.zero_()
    idx = np.random.default_rng(7).choice(128, 64, replace=False)
    with torch.cuda.device(0):
        copy_pool_rows(pool, idx, rows.to("cuda:1"))
        assert torch.equal(pool[torch.from_numpy(idx)], rows)
        d1 = torch.zeros((128, 656), dtype=torch.uint8, device="cuda:1")
        copy_pool_rows(d1, idx, pool, idx)
        assert torch.equal(d1.cpu(), pool)
        d0 = torch.zeros((128, 656), dtype=torch.uint8, device="cuda:0")
        copy_pool_rows(d0, idx, d1, idx)
        assert torch.equal(d0.cpu(), pool)


@pytest.mark.gpu
@pytest.mark.parametrize("alloc", ["pinned", "registered", "thp"])
def test_copy_pool_rows_between_the_gpu_and_every_host_pool(alloc):
    """Device rows into a page-locked pool (the fill) and pool rows into device rows (the hot
    buffers' set-up), by the UVA kernel: each equals the same copy done on the CPU (untouched
    rows kept), readable by the CPU right after the call."""
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
