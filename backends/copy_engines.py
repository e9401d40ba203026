"""Copy engines of the HiSparse swap-in: move the rows of a miss plan from the host pool to the
device hot buffers. All three leave byte-identical device pools.

A *miss plan* (written on the device by ``resolve_swap_in_kernel``) is int32
``[batch, 1 + 2*max_misses]``: ``[0]`` the number of missed units of that batch row,
``[1 : 1+M]`` each unit's first host row, ``[1+M : 1+2M]`` its first device row; a unit is
``unit_rows`` consecutive rows on both sides (1 in token mode, ``page_size`` in page mode).

* ``uva_kernel`` (default): one Triton kernel reads the pinned host rows in place over UVA
  (zero copy) and writes the device rows; its grid is fixed by the plan's capacity or is a
  persistent grid of a given size (``UvaKernelEngine``'s launch parameters), so it needs no
  host sync (CUDA-graph capturable).
* ``memcpy``: reads the plan back to the host (a sync), then issues one async copy per run of
  units contiguous on both the host and the device side (at least one per page in page mode).
* ``staged``: reads the plan back (a sync), gathers the rows on the CPU into a pinned staging
  buffer, copies it to the device in one transfer, then scatters the rows into their slots.

Pools: ``host_layer`` uint8 ``[host_rows, row_bytes]`` (pinned CPU memory when CUDA is present),
``device_layer`` uint8 ``[num_slots, row_bytes]`` on the device.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import triton

from backends.kernels.host_copy import (copy_planned_rows_kernel,
                                        copy_planned_rows_persistent_kernel)
from backends.kernels.kv_format import row_alignment
from backends.kernels.swap_in import next_pow2

COPY_ENGINES = ("uva_kernel", "memcpy", "staged")


def word_view(rows: torch.Tensor) -> torch.Tensor:
    """Views uint8 rows ``[n, row_bytes]`` as the widest integer words dividing ``row_bytes``."""
    row_bytes = rows.shape[-1]
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if row_bytes % size == 0:
            return rows.view(dtype)
    return rows


def row_tile(words: torch.Tensor) -> dict:
    """The row-copy kernels' tile constants (``copy_row_tile``) for rows viewed as ``words``
    ``[n, WORDS]`` (``word_view``): ``WORDS``, ``VEC`` (words per 16-byte group where the row
    allows) and ``GROUP_BLOCK`` (groups a row, rounded up to a power of two)."""
    n_words = words.shape[1]
    vec = row_alignment(n_words, cap=max(1, 16 // words.element_size()))
    return {"WORDS": n_words, "VEC": vec, "GROUP_BLOCK": next_pow2(n_words // vec)}


def _check_pools(host_layer: torch.Tensor, device_layer: torch.Tensor) -> None:
    for name, t in (("host_layer", host_layer), ("device_layer", device_layer)):
        if t.dtype != torch.uint8 or t.dim() != 2 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous uint8 [rows, row_bytes] tensor, "
                             f"got {t.dtype} {tuple(t.shape)}")
    if host_layer.shape[1] != device_layer.shape[1]:
        raise ValueError(f"host_layer and device_layer rows differ: {host_layer.shape[1]} vs "
                         f"{device_layer.shape[1]} bytes")


class CopyEngine:
    """Copies the rows named by a miss plan from ``host_layer`` into ``device_layer``."""

    name = "base"
    needs_host_sync = True

    def copy(self, host_layer: torch.Tensor, device_layer: torch.Tensor, plan: torch.Tensor,
             batch: int, unit_rows: int) -> None:
        """Copies ``unit_rows`` rows per planned unit of plan rows ``0 .. batch-1``."""
        _check_pools(host_layer, device_layer)
        if plan.dtype != torch.int32 or plan.dim() != 2 or plan.shape[1] % 2 != 1 or \
                not 0 <= batch <= plan.shape[0] or unit_rows < 1:
            raise ValueError(f"plan must be int32 [>= batch={batch}, 1 + 2*max_misses] and "
                             f"unit_rows >= 1, got {plan.dtype} {tuple(plan.shape)}, {unit_rows}")
        self._copy(host_layer, device_layer, plan, batch, unit_rows)

    def _copy(self, host_layer, device_layer, plan, batch, unit_rows) -> None:
        raise NotImplementedError

    @staticmethod
    def _plan_on_host(plan: torch.Tensor, batch: int):
        """(counts [B], src [B, M], dst [B, M]) as numpy int64 arrays (synchronises)."""
        p = plan[:batch].cpu().numpy().astype(np.int64)
        m = (p.shape[1] - 1) // 2
        return p[:, 0], p[:, 1:1 + m], p[:, 1 + m:1 + 2 * m]

    @staticmethod
    def _expand_rows(counts, src, dst, unit_rows: int):
        """Flat host rows and device rows of every copied row, in plan order (numpy int64)."""
        s = np.concatenate([src[b, :counts[b]] for b in range(len(counts))]) if len(counts) else \
            np.zeros(0, np.int64)
        d = np.concatenate([dst[b, :counts[b]] for b in range(len(counts))]) if len(counts) else \
            np.zeros(0, np.int64)
        k = np.arange(unit_rows, dtype=np.int64)
        return (s[:, None] + k).reshape(-1), (d[:, None] + k).reshape(-1)


#: Triton ``cache_modifier`` values the uva_kernel engine accepts for its host loads / stores
LOAD_CACHE_MODIFIERS = ("", ".ca", ".cg", ".cv")
STORE_CACHE_MODIFIERS = ("", ".wb", ".cg", ".cs", ".wt")


class UvaKernelEngine(CopyEngine):
    """Zero-copy Triton gather from mapped pinned host memory; no host sync.

    Launch parameters (``backends/kernels/host_copy.py``):

    * ``rows_per_program``: rows each program has in flight per step (a [rows, words] tile;
      a power of two);
    * ``num_warps``: warps per program (1, 2, 4, 8 or 16);
    * ``programs``: 0 = the capacity grid ``(batch, cdiv(max_misses * unit_rows, rows))``;
      N > 0 = a persistent grid of N programs walking the batch's planned rows flat;
    * ``load_cache`` / ``store_cache``: Triton cache modifiers of the host load and the device
      store (``LOAD_CACHE_MODIFIERS`` / ``STORE_CACHE_MODIFIERS``; '' = Triton's default);
    * ``pdl``: on CUDA, launch with programmatic dependent launch (``launch_pdl``): the copy's
      programs start while the kernel before it (the resolve) still runs and wait for its writes
      (``gdc_wait``) before they read the plan, so the copy's launch overlaps the resolve
      (``backends/kernels/host_copy.py``); False: a plain launch after it. Ignored by the
      interpreter (device tensors on the CPU).
    """

    name = "uva_kernel"
    needs_host_sync = False

    def __init__(self, rows_per_program: int = 4, num_warps: int = 4, programs: int = 0,
                 load_cache: str = "", store_cache: str = "", pdl: bool = False):
        if not isinstance(rows_per_program, int) or rows_per_program < 1 or \
                rows_per_program & (rows_per_program - 1):
            raise ValueError(f"rows_per_program must be a power of two >= 1, "
                             f"got {rows_per_program!r}")
        if num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {num_warps!r}")
        if not isinstance(programs, int) or programs < 0:
            raise ValueError(f"programs must be an integer >= 0 (0: the capacity grid), "
                             f"got {programs!r}")
        if load_cache not in LOAD_CACHE_MODIFIERS:
            raise ValueError(f"load_cache must be one of {LOAD_CACHE_MODIFIERS}, "
                             f"got {load_cache!r}")
        if store_cache not in STORE_CACHE_MODIFIERS:
            raise ValueError(f"store_cache must be one of {STORE_CACHE_MODIFIERS}, "
                             f"got {store_cache!r}")
        if not isinstance(pdl, bool):
            raise ValueError(f"pdl must be a bool, got {pdl!r}")
        self.rows_per_program = rows_per_program
        self.num_warps = num_warps
        self.programs = programs
        self.load_cache = load_cache
        self.store_cache = store_cache
        self.pdl = pdl

    def launch_config(self) -> dict:
        """The launch parameters as keyword arguments of this class (JSON-serialisable)."""
        return {"rows_per_program": self.rows_per_program, "num_warps": self.num_warps,
                "programs": self.programs, "load_cache": self.load_cache,
                "store_cache": self.store_cache, "pdl": self.pdl}

    def _copy(self, host_layer, device_layer, plan, batch, unit_rows):
        if device_layer.is_cuda and not host_layer.is_cuda and not host_layer.is_pinned():
            raise ValueError("host_layer must be pinned for the uva_kernel engine on CUDA "
                             "(the kernel reads it in place over UVA)")
        if batch == 0:
            return
        src = word_view(host_layer)
        dst = word_view(device_layer)
        max_misses = (plan.shape[1] - 1) // 2
        tile = dict(UNIT_ROWS=unit_rows, **row_tile(src), ROWS=self.rows_per_program,
                    LOAD_CACHE=self.load_cache, STORE_CACHE=self.store_cache,
                    num_warps=self.num_warps)
        if self.pdl and device_layer.is_cuda:
            tile.update(WAIT_PRIOR=True, launch_pdl=True)
        if self.programs:
            copy_planned_rows_persistent_kernel[(self.programs,)](
                src, dst, plan, plan.stride(0), max_misses, batch,
                BATCH_BLOCK=max(16, next_pow2(batch)), **tile)
        else:
            grid = (batch, triton.cdiv(max_misses * unit_rows, self.rows_per_program))
            copy_planned_rows_kernel[grid](src, dst, plan, plan.stride(0), max_misses, **tile)


def uva_engine_per_sm(device: torch.device, programs_per_sm: int = 0,
                      **launch) -> UvaKernelEngine:
    """A ``UvaKernelEngine`` whose persistent grid is ``programs_per_sm`` x the SM count of
    ``device`` (0: the capacity grid); ``launch``: its other keyword arguments."""
    if not isinstance(programs_per_sm, int) or programs_per_sm < 0:
        raise ValueError(f"programs_per_sm must be an integer >= 0, got {programs_per_sm!r}")
    dev = torch.device(device)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
    return UvaKernelEngine(programs=programs_per_sm * sms, **launch)


class MemcpyEngine(CopyEngine):
    """One async copy per run of units contiguous on the host and on the device."""

    name = "memcpy"

    @staticmethod
    def copy_runs(counts, src, dst, unit_rows: int):
        """``(host_row, device_row, n_rows)`` of each maximal run of units that are consecutive
        on both sides, in plan order (numpy inputs as returned by ``_plan_on_host``)."""
        runs = []
        for b in range(len(counts)):
            n = int(counts[b])
            if n == 0:
                continue
            s, d = src[b, :n], dst[b, :n]
            breaks = np.nonzero((np.diff(s) != unit_rows) | (np.diff(d) != unit_rows))[0] + 1
            starts = [0] + breaks.tolist()
            ends = breaks.tolist() + [n]
            runs.extend((int(s[a]), int(d[a]), (e - a) * unit_rows) for a, e in zip(starts, ends))
        return runs

    def _copy(self, host_layer, device_layer, plan, batch, unit_rows):
        for hs, ds, nr in self.copy_runs(*self._plan_on_host(plan, batch), unit_rows):
            device_layer[ds:ds + nr].copy_(host_layer[hs:hs + nr], non_blocking=True)


class StagedEngine(CopyEngine):
    """CPU gather into a pinned staging buffer, one host->device copy, device-side scatter.

    ``capacity_rows``: the most rows one call moves (batch * max_misses * unit_rows).
    The staging buffer is reused: before the CPU overwrites it, the previous call's transfer is
    waited for (an event), so an in-flight copy never reads half-rewritten rows.
    """

    name = "staged"

    def __init__(self, capacity_rows: int, row_bytes: int, device: torch.device):
        self.device = torch.device(device)
        pin = self.device.type == "cuda"
        self.staging = torch.empty((capacity_rows, row_bytes), dtype=torch.uint8, pin_memory=pin)
        self.dst_rows = torch.empty(capacity_rows, dtype=torch.int64, pin_memory=pin)
        self.staging_dev = torch.empty((capacity_rows, row_bytes), dtype=torch.uint8,
                                       device=self.device)
        self.dst_rows_dev = torch.empty(capacity_rows, dtype=torch.int64, device=self.device)
        self._done: Optional[torch.cuda.Event] = None

    def _copy(self, host_layer, device_layer, plan, batch, unit_rows):
        counts, src, dst = self._plan_on_host(plan, batch)
        s, d = self._expand_rows(counts, src, dst, unit_rows)
        n = len(s)
        if n == 0:
            return
        if n > self.staging.shape[0]:
            raise ValueError(f"staged copy of {n} rows exceeds the staging capacity "
                             f"{self.staging.shape[0]}")
        if self._done is not None:
            self._done.synchronize()
        torch.index_select(host_layer, 0, torch.from_numpy(s), out=self.staging[:n])
        self.dst_rows[:n].copy_(torch.from_numpy(d))
        self.staging_dev[:n].copy_(self.staging[:n], non_blocking=True)
        self.dst_rows_dev[:n].copy_(self.dst_rows[:n], non_blocking=True)
        if self.device.type == "cuda":
            self._done = torch.cuda.Event()
            self._done.record()
        device_layer.index_copy_(0, self.dst_rows_dev[:n], self.staging_dev[:n])


#: the uva_kernel launch on CUDA, measured on the H200 (``python -m harness.bench run swap_in
#: --section gather``, BENCHMARKS.md section 3): a persistent grid of 16 one-warp programs per
#: SM, one row each in flight, gives 39.3 GB/s for 2048 scattered 656 B rows (the capacity grid
#: with 4 rows per program: 35.7) and 45.5 GB/s for 16384 (42.7); launched with programmatic
#: dependent launch (``pdl``), so its launch overlaps the resolve before it
UVA_CUDA_LAUNCH = dict(rows_per_program=1, num_warps=1, programs_per_sm=16, pdl=True)


def make_copy_engine(name: str, *, capacity_rows: int, row_bytes: int, device: torch.device,
                     rows_per_program: Optional[int] = None,
                     pdl: Optional[bool] = None) -> CopyEngine:
    """The copy engine called ``name`` (one of ``COPY_ENGINES``).

    ``capacity_rows``: most rows one call moves (sizes the staged engine's buffers);
    ``rows_per_program``: uva_kernel tile height of the capacity grid; None: on CUDA the
    persistent launch ``UVA_CUDA_LAUNCH``, under the interpreter (which pays per program rather
    than per row) the capacity grid with 256 rows a program; ``pdl``: the uva_kernel launch's
    programmatic dependent launch (``UvaKernelEngine``; None: ``UVA_CUDA_LAUNCH``'s on CUDA,
    off under the interpreter).
    """
    if name == "uva_kernel":
        dev = torch.device(device)
        if pdl is None:
            pdl = dev.type == "cuda" and UVA_CUDA_LAUNCH["pdl"]
        if rows_per_program is not None:
            return UvaKernelEngine(rows_per_program=rows_per_program, pdl=pdl)
        if dev.type != "cuda":
            return UvaKernelEngine(rows_per_program=256, pdl=pdl)
        return uva_engine_per_sm(dev, **{**UVA_CUDA_LAUNCH, "pdl": pdl})
    if name == "memcpy":
        return MemcpyEngine()
    if name == "staged":
        return StagedEngine(capacity_rows, row_bytes, device)
    raise ValueError(f"copy_engine must be one of {COPY_ENGINES}, got {name!r}")
