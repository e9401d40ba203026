"""Host memory the GPU reads in place (zero copy over UVA): the offloading designs' host KV pools.

Five allocations (``HOST_ALLOCS``):

* ``pinned``: ``torch.empty(pin_memory=True)``, i.e. cudaHostAlloc through torch's caching host
  allocator (4 KiB pages; torch rounds the block up to a power of two; a freed block is kept for
  the next allocation of the process).
* ``registered``: a plain (pageable) ``torch.empty`` CPU tensor, then page-locked and mapped for
  the device with ``cudaHostRegister``: what SGLang's host KV pool does on CUDA
  (``alloc_with_host_register`` in ``sglang/srt/mem_cache/memory_pool_host.py``).
* ``thp``: an anonymous mapping aligned to 2 MiB, advised ``MADV_HUGEPAGE`` (transparent huge
  pages), then page-locked and mapped for the device with ``cudaHostRegister``. Fewer, larger
  pages: the GPU's translation of host addresses misses less when the rows a step reads are
  scattered over a pool of gigabytes (``BENCHMARKS.md`` 6d). Whether the kernel backs the
  mapping with huge pages depends on ``/sys/kernel/mm/transparent_hugepage``; ``huge_fraction``
  says how much of it got them.
* ``hugetlb_2m`` / ``hugetlb_1g``: an anonymous mapping in explicit huge pages of 2 MiB / 1 GiB
  (``MAP_HUGETLB``) from the kernel's reserved pool, then page-locked and mapped for the device
  with ``cudaHostRegister``. Every byte is in huge pages or the allocation fails: the pool must
  hold enough free pages (``/sys/kernel/mm/hugepages/hugepages-<size>kB/nr_hugepages``, set by
  root), which :func:`hugetlb_free_bytes` reads; without them HostRows raises MemoryError naming
  that file before anything is mapped.

Without CUDA none is page-locked: each is plain pageable memory (``thp`` and ``hugetlb_*`` the
same mapping, unregistered); the Triton interpreter reads it directly.
"""
from __future__ import annotations

import mmap
import weakref
from typing import Dict, Sequence

import numpy as np
import torch
import triton

from backends.copy_engines import row_tile, word_view
from backends.kernels.host_copy import copy_indexed_rows_kernel

HOST_ALLOCS = ("pinned", "registered", "thp", "hugetlb_2m", "hugetlb_1g")
HUGE_PAGE = 2 << 20
#: explicit huge page sizes in bytes, by allocation name
HUGETLB_PAGE = {"hugetlb_2m": 2 << 20, "hugetlb_1g": 1 << 30}
_MAP_HUGETLB, _MAP_HUGE_SHIFT = 0x40000, 26            # Linux <sys/mman.h>, every architecture
_HUGEPAGES_DIR = "/sys/kernel/mm/hugepages"


def _unregister(ptr: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(ptr)


class HostRows:
    """A uint8 host tensor of ``shape`` in ``alloc`` memory (module docstring); ``tensor`` is
    valid while this object lives (with ``thp`` the registration ends and the mapping goes when
    it is collected, so keep it as long as any kernel may read ``tensor``).

    Raises ValueError for an unknown ``alloc``, MemoryError / RuntimeError when the memory cannot
    be allocated or registered.
    """

    def __init__(self, shape: Sequence[int], alloc: str = "pinned", cuda: bool = True):
        if alloc not in HOST_ALLOCS:
            raise ValueError(f"host_alloc must be one of {HOST_ALLOCS}, got {alloc!r}")
        self.alloc, self.shape = alloc, tuple(int(n) for n in shape)
        self.nbytes = int(np.prod(self.shape))
        if alloc == "pinned":
            self.tensor = torch.empty(self.shape, dtype=torch.uint8, pin_memory=cuda)
            return
        if alloc == "registered":
            self.tensor = torch.empty(self.shape, dtype=torch.uint8)
            if cuda:
                self._register(self.tensor.data_ptr(), self.nbytes)
            return
        if alloc == "thp":
            self._map = mmap.mmap(-1, self.nbytes + HUGE_PAGE,
                                  flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self._map.madvise(mmap.MADV_HUGEPAGE)
        else:
            self._map = _hugetlb_map(self.nbytes, alloc)
        flat = torch.frombuffer(self._map, dtype=torch.uint8)
        skip = (-flat.data_ptr()) % HUGE_PAGE
        self.tensor = flat[skip:skip + self.nbytes].view(self.shape)
        self.tensor.view(-1)[::4096].fill_(1)      # first touch: the huge pages are faulted in
        if not cuda:
            return
        # the whole mapping: torch's is_pinned() asks about the storage's first byte
        self._register(flat.data_ptr(), flat.numel())

    def _register(self, ptr: int, nbytes: int) -> None:
        """Page-locks ``[ptr, ptr + nbytes)`` for the device until this object is collected."""
        err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed: {err}")
        weakref.finalize(self, _unregister, ptr)

    @property
    def huge_fraction(self) -> float:
        """Share of the bytes backed by huge pages: transparent ones (NaN where not readable),
        1.0 for ``hugetlb_*`` (no other page backs such a mapping)."""
        if self.alloc in HUGETLB_PAGE:
            return 1.0
        return anon_huge_fraction(self.tensor.data_ptr(), self.nbytes)


def hugetlb_shortage(nbytes: int, alloc: str) -> str:
    """Why ``nbytes`` of ``alloc`` (``hugetlb_2m`` / ``hugetlb_1g``) huge pages cannot be
    mapped now: the pages needed and free and the sysfs file that reserves them; '' when the
    kernel's pool has enough free pages."""
    page_bytes = HUGETLB_PAGE[alloc]
    need = -(-nbytes // page_bytes)
    free = hugetlb_free_bytes(page_bytes) // page_bytes
    if free >= need:
        return ""
    return (f"host_alloc {alloc} needs {need} free {page_bytes >> 20} MiB huge pages, the kernel "
            f"has {free}: reserve them first (as root: echo N > "
            f"{_HUGEPAGES_DIR}/hugepages-{page_bytes >> 10}kB/nr_hugepages)")


def hugetlb_free_pages() -> Dict[str, int]:
    """Free explicit huge pages per ``hugetlb_*`` allocation name (0 where the kernel has none)."""
    return {a: hugetlb_free_bytes(p) // p for a, p in HUGETLB_PAGE.items()}


def hugetlb_free_bytes(page_bytes: int) -> int:
    """Bytes of free explicit huge pages of ``page_bytes`` the kernel holds (0 where it has no
    such pool or it cannot be read)."""
    try:
        with open(f"{_HUGEPAGES_DIR}/hugepages-{page_bytes >> 10}kB/free_hugepages") as f:
            return int(f.read()) * page_bytes
    except (OSError, ValueError):
        return 0


def _hugetlb_map(nbytes: int, alloc: str) -> mmap.mmap:
    """An anonymous private mapping of ``nbytes`` rounded up to whole huge pages of ``alloc``'s
    size (``MAP_HUGETLB``). MemoryError, before mapping, when the kernel's pool has too few free
    pages (the message names the file that sets it), or when the mapping fails."""
    shortage = hugetlb_shortage(nbytes, alloc)
    if shortage:
        raise MemoryError(shortage)
    page_bytes = HUGETLB_PAGE[alloc]
    size = -(-nbytes // page_bytes) * page_bytes
    flags = (mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_HUGETLB
             | (page_bytes.bit_length() - 1) << _MAP_HUGE_SHIFT)
    try:
        return mmap.mmap(-1, size, flags=flags)
    except OSError as e:
        raise MemoryError(f"mapping {size} bytes in {page_bytes >> 20} MiB huge pages failed: {e}"
                          ) from e


def copy_pool_rows(dst: torch.Tensor, dst_rows, src: torch.Tensor, src_rows=None,
                   rows_per_program: int = 8) -> None:
    """``dst[dst_rows] = src[src_rows]`` (set-up, not timed): ``dst`` and ``src`` uint8 ``[R,
    row_bytes]`` pools on the device or in host memory, ``dst_rows`` int64 ``[n]`` (distinct;
    numpy or torch), ``src_rows`` int64 ``[n]`` (None: rows ``0 .. n-1`` of ``src``). When one
    pool is on a CUDA device and the other is on that device or page-locked host memory, one
    Triton kernel copies the rows, reading or writing the host pool in place over UVA (no
    pageable staging copy, no CPU gather or scatter), and the call returns once it is done, so
    the CPU may read ``dst`` right away; otherwise the rows go through the CPU (``_uva_device``).
    Raises ValueError when the two row lists differ in length or name a row outside a pool."""
    as_rows = lambda r: torch.as_tensor(np.ascontiguousarray(r, dtype=np.int64)  # noqa: E731
                                        if not isinstance(r, torch.Tensor) else r).long()
    dst_idx = as_rows(dst_rows)
    n = dst_idx.numel()
    src_idx = torch.arange(n) if src_rows is None else as_rows(src_rows)
    if src_idx.numel() != n:
        raise ValueError(f"src_rows has {src_idx.numel()} entries, dst_rows {n}")
    if n == 0:
        return
    # the kernel does not bound its row indices: out-of-range rows would read or write past a
    # pool (a host pool included), where the CPU path raises
    for name, idx, pool in (("dst_rows", dst_idx, dst), ("src_rows", src_idx, src)):
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= pool.shape[0]:
            raise ValueError(f"{name} must be in [0, {pool.shape[0]}), got {lo} .. {hi}")
    dev = _uva_device(dst, src)
    if dev is None:
        dst.index_copy_(0, dst_idx.to(dst.device), src[src_idx.to(src.device)].to(dst.device))
        return
    with torch.cuda.device(dev):       # Triton launches on the current device and its stream
        s, d = word_view(src.contiguous()), word_view(dst)
        copy_indexed_rows_kernel[(triton.cdiv(n, rows_per_program),)](
            s, d, src_idx.to(dev), dst_idx.to(dev), n,
            **row_tile(s), ROWS=rows_per_program, num_warps=4)
        torch.cuda.current_stream(dev).synchronize()


def _uva_device(dst: torch.Tensor, src: torch.Tensor):
    """The CUDA device whose kernel may copy ``copy_pool_rows``' rows in place, or None (the
    rows go through torch): one pool on a CUDA device, the other on the same device or in
    page-locked host memory; ``dst`` contiguous (the kernel writes row ``r`` at ``r`` rows from
    its start, whatever the strides); a host ``src`` contiguous (``contiguous()`` of a strided
    page-locked tensor is a pageable copy the GPU cannot read)."""
    cuda = dst if dst.is_cuda else src
    if not cuda.is_cuda or not dst.is_contiguous():
        return None
    for t in (dst, src):
        if t.is_cuda and t.device != cuda.device:
            return None
        if not t.is_cuda and not (t.is_pinned() and t.is_contiguous()):
            return None
    return cuda.device


def anon_huge_fraction(ptr: int, nbytes: int) -> float:
    """Share of ``[ptr, ptr + nbytes)`` in mappings' AnonHugePages (/proc/self/smaps, Linux);
    NaN where smaps cannot be read."""
    try:
        text = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return float("nan")
    huge, inside = 0, False
    for line in text:
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < ptr + nbytes and hi > ptr
        elif inside and head == "AnonHugePages:":
            huge += int(line.split()[1]) * 1024
    return min(1.0, huge / nbytes) if nbytes else float("nan")
