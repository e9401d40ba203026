"""Host memory the GPU reads in place (zero copy over UVA): the offloading designs' host KV pools.

Three allocations (``HOST_ALLOCS``):

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

Without CUDA none is page-locked: each is plain pageable memory (``thp`` the same mapping,
unregistered); the Triton interpreter reads it directly.
"""
from __future__ import annotations

import mmap
import weakref
from typing import Sequence

import numpy as np
import torch

HOST_ALLOCS = ("pinned", "registered", "thp")
HUGE_PAGE = 2 << 20


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
        self._map = mmap.mmap(-1, self.nbytes + HUGE_PAGE,
                              flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._map.madvise(mmap.MADV_HUGEPAGE)
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
        """Share of the bytes backed by transparent huge pages (NaN where not readable)."""
        return anon_huge_fraction(self.tensor.data_ptr(), self.nbytes)


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
