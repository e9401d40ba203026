"""HiSparse coordinator: per-request GPU hot buffers over a pinned host KV pool.

Between the indexer and sparse attention of every layer, ``swap_in_selected_pages`` turns a
top-k selection of request-local token positions into global device row ids of that layer's
device pool, loading the missing KV rows from the host ("swap-in"). KV rows are opaque bytes
(uint8 rows of ``row_bytes``).

Tiers
-----
* Host pool: uint8 ``[num_layers, host_rows, row_bytes]`` (pinned when CUDA is present).
  Host rows are handed out in pages of ``page_size`` rows from a free list, shuffled (like a
  long-running server whose frees have scattered it; the default) or in order
  (``host_page_order='sequential'``: a fresh pool, as SGLang's host KV pool hands out its free
  slots in index order); position ``p`` of request ``r`` lives in host row
  ``host_page_table[r, p // P] * P + p % P``.
* Device pool: uint8 ``[num_layers, num_slots, row_bytes]``; ``device_pool(layer)`` is the flat
  ``[num_slots, row_bytes]`` view attention gathers from. Request ``r`` owns device rows
  ``r * (D + P) ..``: ``D`` rows of hot buffer then one reserved page of ``P`` rows.

Swap-in semantics (``D = device_buffer_size``, unit = token, or page in page mode)
--------------------------------------------------------------------------------
* Short request (``seq_len <= D``): position ``p`` is at device row ``base + p``; no host traffic;
  ``hits`` = distinct selected units.
* Long request: the newest unit is resident in the reserved page and counts as a hit when
  selected; other selected units are hits if resident, else misses; the i-th miss takes the i-th
  least-recently-used slot not hit this step; new LRU order = untouched slots, then the slots the
  misses filled (in miss order), then the hits (most recent last). Exact LRU per (layer,
  request). Duplicates count once; -1 (and positions >= seq_len) give -1. The order of misses
  and hits is ``lru_order``: ``upstream`` (default, SGLang's kernel): misses in selection order
  (a unit's first entry), hits in their previous LRU order; ``position``: both ascending unit.
* After ``prefill`` the hot buffer holds positions ``0 .. min(prompt_len, D) - 1`` with LRU order
  = position order.

Reserved page (the newest token)
--------------------------------
``begin_step`` simulates attention's KV write of the newest token (position ``seq_len - 1``) for
every layer. Token mode: it goes to device row ``base + D`` (reserved offset 0), overwriting the
previous newest token, which from then on is only on the host (a miss if selected later).
Page mode: the reserved page holds the newest token's whole logical page ``np = (seq_len-1) // P``
so far, positions ``np*P .. seq_len-1``, at reserved offset ``p % P``. When the newest token
moves into a new page, the reserved page is re-labelled to that page (its rows from the old page
are dead: every position they could answer for is now older than the new page, so selections
reach them through the host as a hot-page miss); each ``begin_step`` writes whatever rows of the
current newest page are not yet there (normally just the new token). A page loaded into a hot
page slot is therefore always complete: it is older than the newest page, so
``tokens_loaded = misses * page_size`` exactly (rows actually copied).

Page-mode overflow: if a long request selects more distinct non-reserved pages than the hot
buffer holds (``D / P``), the call leaves that request's state untouched, writes -1 for all its
entries, sets ``overflow = 1`` and ``pages_needed`` in the counts. ``find_page_overflow`` detects
it on the host from a known selection, before timing.

Counts (``last_counts`` / ``layer_counts(layer)``, int64 ``[batch]`` device tensors, per call):
``hits``, ``misses`` (units), ``tokens_loaded`` (rows copied host->device), ``pages_loaded`` (0 in
token mode), ``bytes_h2d`` (= tokens_loaded * row_bytes), ``overflow`` (0/1), ``pages_needed``
(page mode, long requests: distinct non-reserved pages selected; else 0).

The bookkeeping is one Triton kernel (one program per batch row; ``upstream``: a stamp table
indexed by unit finds the hits of one LRU walk without sorting, cumsums compact hits, evictable
slots and misses; ``position``: sort/dedupe the selection, binary-search each hot slot's unit in
it; ``backends/kernels/swap_in.py``) and, for the default ``uva_kernel`` engine, the copy is a
second Triton kernel reading pinned host memory in place: no host sync inside the call.
``resolve_selection`` and ``copy_planned_misses`` expose the two stages separately (for stage
timing). The resolve's scratch (the stamp table: ``max_requests x cdiv(max_seq_len, unit)``
int32 in the upstream order) is shared by all layers and counted in ``allocations``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import triton

from backends.copy_engines import COPY_ENGINES, make_copy_engine
from backends.host_memory import HOST_ALLOCS, HostRows, copy_pool_rows
from backends.kernels.swap_in import (COUNT_FIELDS, MAX_TOP_K, NUM_COUNT_FIELDS,
                                      PTX_SCATTER_MODES, ResolveLaunch,
                                      next_pow2, resolve_scratch_width, resolve_swap_in_kernel)
from backends.kernels.swap_in_cuda import CudaResolve, cuda_resolve_shape

LOAD_GRANULARITIES = ("token", "page")
#: the host pool's allocation by default: SGLang's (``backends/host_memory.py``)
DEFAULT_HOST_ALLOC = "registered"
#: order of misses and hits in the LRU update (module docstring)
LRU_ORDERS = ("upstream", "position")
#: order of the host pool's free pages (module docstring)
HOST_PAGE_ORDERS = ("shuffled", "sequential")


class HiSparseOOMError(MemoryError):
    """A host or device allocation of the coordinator failed (record as ``status=oom``)."""


class PageOverflowError(ValueError):
    """A page-mode selection needs more distinct pages than the hot buffer holds."""


def _alloc(what: str, shape, dtype, device) -> torch.Tensor:
    nbytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    try:
        return torch.empty(shape, dtype=dtype, device=device)
    except (torch.OutOfMemoryError, RuntimeError, MemoryError) as e:
        raise HiSparseOOMError(f"allocating the {what} ({nbytes / 2**30:.2f} GiB on {device}) "
                               f"failed: {e}") from e


def alloc_host_rows(what: str, shape, host_alloc: str, cuda: bool) -> HostRows:
    """``HostRows`` of ``shape`` (uint8) in ``host_alloc`` memory; HiSparseOOMError when it
    cannot be allocated."""
    try:
        return HostRows(shape, host_alloc, cuda)
    except (RuntimeError, MemoryError, OSError) as e:
        raise HiSparseOOMError(f"allocating the {what} ({int(np.prod(shape)) / 2**30:.2f} GiB of "
                               f"{host_alloc} host memory) failed: {e}") from e


def _as_int_array(x, name: str) -> np.ndarray:
    a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {a.dtype}")
    return a.astype(np.int64).reshape(-1)


def validate_selection(topk_indices, seq_lens) -> None:
    """Checks a selection before timing: every entry is -1 or a position in ``[0, seq_len)``.

    ``topk_indices`` int ``[batch, top_k]``, ``seq_lens`` int ``[batch]`` (>= 1). Synchronises
    (reads both to the host); call it outside timed regions. Raises ValueError naming the batch
    row, the entry and the allowed range.
    """
    t = topk_indices.detach().cpu().numpy() if isinstance(topk_indices, torch.Tensor) \
        else np.asarray(topk_indices)
    if t.ndim != 2 or t.dtype.kind not in "iu":
        raise ValueError(f"topk_indices must be an integer [batch, top_k] array, got "
                         f"{t.dtype} {t.shape}")
    s = _as_int_array(seq_lens, "seq_lens")
    if s.shape[0] != t.shape[0]:
        raise ValueError(f"seq_lens has {s.shape[0]} rows, topk_indices {t.shape[0]}")
    if (s < 1).any():
        b = int(np.argmax(s < 1))
        raise ValueError(f"seq_lens[{b}] = {s[b]}; sequence lengths must be >= 1")
    bad = (t < -1) | (t >= s[:, None])
    if bad.any():
        b, k = (int(v[0]) for v in np.nonzero(bad))
        raise ValueError(f"topk_indices[{b}, {k}] = {t[b, k]}: entries must be -1 or a position "
                         f"in [0, seq_len={s[b]})")


def checked_selections(workload):
    """Yields ``(where, positions int32 [B, top_k], seq_lens int32 [B])`` for every (step, layer)
    of a selection known up front (``workload.topk``; nothing for the indexer's), each checked
    by ``validate_selection`` first (raises BackendInvalid naming the step and layer)."""
    from backends.base import BackendInvalid
    if workload.topk is None:
        return
    for s in range(workload.steps):
        for layer in range(workload.num_layers):
            where = f"step {s}, layer {layer}"
            try:
                validate_selection(workload.topk[s, layer], workload.seq_lens[s])
            except ValueError as e:
                raise BackendInvalid(f"{where}: {e}") from e
            yield where, workload.topk[s, layer], workload.seq_lens[s]


def selected_page_demand(topk_indices, seq_lens, page_size: int) -> np.ndarray:
    """Distinct pages each batch row selects, the newest token's page excluded; int64 [batch].

    These are the hot page slots a page-mode step of a long request needs.
    """
    t = topk_indices.detach().cpu().numpy() if isinstance(topk_indices, torch.Tensor) \
        else np.asarray(topk_indices)
    s = _as_int_array(seq_lens, "seq_lens")
    out = np.zeros(t.shape[0], dtype=np.int64)
    for b in range(t.shape[0]):
        pages = {int(p) // page_size for p in t[b] if 0 <= p < s[b]}
        pages.discard(int(s[b] - 1) // page_size)
        out[b] = len(pages)
    return out


def find_page_overflow(topk_indices, seq_lens, page_size: int,
                       device_buffer_size: int) -> List[Tuple[int, int]]:
    """``(batch_row, pages_needed)`` of the long rows whose page demand exceeds ``D / P`` slots."""
    s = _as_int_array(seq_lens, "seq_lens")
    need = selected_page_demand(topk_indices, s, page_size)
    cap = device_buffer_size // page_size
    return [(b, int(need[b])) for b in range(len(s))
            if s[b] > device_buffer_size and need[b] > cap]


class HiSparseCoordinator:
    """Hot-buffer coordinator of HiSparse (see the module docstring for the semantics).

    Args:
      num_layers: layers with a KV cache.
      max_requests: request pool size; request pool indices are ``0 .. max_requests-1`` and a
        batch holds at most ``max_requests`` distinct requests.
      max_seq_len: longest sequence (tokens) a request may reach.
      row_bytes: bytes of one token's KV row per layer (1152 for bf16, 656 for fp8_ds_mla).
      top_k: selection width of ``swap_in_selected_pages``.
      device_buffer_size: hot slots per (layer, request), ``D``; default ``2 * top_k``; must be
        ``>= top_k`` and, in page mode, a multiple of ``page_size``.
      page_size: host allocation page and reserved page, in tokens.
      load_granularity: 'token' (upstream SGLang) or 'page' (whole logical pages).
      copy_engine: 'uva_kernel' (default, no host sync), 'memcpy' or 'staged'.
      host_alloc: the host pool's memory (``backends/host_memory.py``): 'registered' (default:
        pageable memory registered with cudaHostRegister, as SGLang's host pool), 'pinned'
        (cudaHostAlloc), 'thp' (2 MiB transparent huge pages, registered), or 'hugetlb_2m' /
        'hugetlb_1g' (explicit huge pages from the kernel's reserved pool, registered).
      lru_order: 'upstream' (default: SGLang's kernel) or 'position' (module docstring).
      resolve_launch: the resolve kernel's launch configuration (default: ``ResolveLaunch()``).
      host_rows: host pool rows per layer; default enough for every request at ``max_seq_len``
        (rounded up to pages).
      device: where the hot buffers live ('cuda' or 'cpu' for the Triton interpreter).
      host_page_order: 'shuffled' (default) or 'sequential': the free host pages' order (module
        docstring).
      seed: seed of the shuffled host page order.
    Raises ValueError for bad arguments, HiSparseOOMError when an allocation fails.
    """

    def __init__(self, *, num_layers: int, max_requests: int, max_seq_len: int, row_bytes: int,
                 top_k: int, device_buffer_size: Optional[int] = None, page_size: int = 64,
                 load_granularity: str = "token", copy_engine: str = "uva_kernel",
                 lru_order: str = "upstream", resolve_launch: Optional[ResolveLaunch] = None,
                 host_rows: Optional[int] = None, host_alloc: str = DEFAULT_HOST_ALLOC,
                 host_page_order: str = "shuffled", device="cuda",
                 seed: int = 0):
        if host_page_order not in HOST_PAGE_ORDERS:
            raise ValueError(f"host_page_order must be one of {HOST_PAGE_ORDERS}, "
                             f"got {host_page_order!r}")
        self._configure(num_layers=num_layers, max_requests=max_requests, max_seq_len=max_seq_len,
                        row_bytes=row_bytes, top_k=top_k, device_buffer_size=device_buffer_size,
                        page_size=page_size, load_granularity=load_granularity,
                        copy_engine=copy_engine, lru_order=lru_order, host_rows=host_rows,
                        host_alloc=host_alloc, device=device)
        self.set_resolve_launch(resolve_launch or ResolveLaunch())
        cuda = self.device.type == "cuda"
        for attr, (what, shape, dtype, on_host) in self.allocations().items():
            if on_host:                   # the host KV pool (uint8), kept alive with its memory
                self._host_memory = alloc_host_rows(what, shape, self.host_alloc, cuda)
                setattr(self, attr, self._host_memory.tensor)
            else:
                setattr(self, attr, _alloc(what, shape, dtype, self.device))
        self._init_state(copy_engine, seed, host_page_order)

    def _configure(self, *, num_layers: int, max_requests: int, max_seq_len: int, row_bytes: int,
                   top_k: int, device_buffer_size: Optional[int], page_size: int,
                   load_granularity: str, copy_engine: str, lru_order: str,
                   host_rows: Optional[int], host_alloc: str, device) -> None:
        """Checks the arguments and derives every size (no allocation)."""
        for name, v in (("num_layers", num_layers), ("max_requests", max_requests),
                        ("max_seq_len", max_seq_len), ("row_bytes", row_bytes),
                        ("top_k", top_k), ("page_size", page_size)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if load_granularity not in LOAD_GRANULARITIES:
            raise ValueError(f"load_granularity must be one of {LOAD_GRANULARITIES}, "
                             f"got {load_granularity!r}")
        if copy_engine not in COPY_ENGINES:
            raise ValueError(f"copy_engine must be one of {COPY_ENGINES}, got {copy_engine!r}")
        if lru_order not in LRU_ORDERS:
            raise ValueError(f"lru_order must be one of {LRU_ORDERS}, got {lru_order!r}")
        if host_alloc not in HOST_ALLOCS:
            raise ValueError(f"host_alloc must be one of {HOST_ALLOCS}, got {host_alloc!r}")
        self.host_alloc = host_alloc
        if top_k > MAX_TOP_K:
            raise ValueError(f"top_k must be <= {MAX_TOP_K} (the resolve's counters), got {top_k}")
        D = 2 * top_k if device_buffer_size is None else device_buffer_size
        if not isinstance(D, (int, np.integer)) or D < top_k:
            raise ValueError(f"device_buffer_size must be an integer >= top_k ({top_k}), got {D!r}")
        if load_granularity == "page" and D % page_size:
            raise ValueError(f"device_buffer_size ({D}) must be a multiple of page_size "
                             f"({page_size}) when load_granularity='page'")
        self.num_layers, self.max_requests = int(num_layers), int(max_requests)
        self.max_seq_len, self.row_bytes, self.top_k = int(max_seq_len), int(row_bytes), int(top_k)
        self.device_buffer_size, self.page_size = int(D), int(page_size)
        self.load_granularity, self.copy_engine_name = load_granularity, copy_engine
        self.lru_order = lru_order
        self.upstream = lru_order == "upstream"
        self.device = torch.device(device)
        self.page_mode = load_granularity == "page"
        self.unit = self.page_size if self.page_mode else 1
        self.hot_units = self.device_buffer_size // self.unit          # C
        self.slots_per_request = self.device_buffer_size + self.page_size
        self.num_slots = self.max_requests * self.slots_per_request
        if self.num_slots >= 2 ** 31:
            raise ValueError(f"max_requests * (device_buffer_size + page_size) = {self.num_slots} "
                             f"device rows exceed int32 slot ids")
        self.max_pages = triton.cdiv(self.max_seq_len, self.page_size)
        if host_rows is None:
            host_rows = self.max_requests * self.max_pages * self.page_size
        if not isinstance(host_rows, (int, np.integer)) or host_rows < self.page_size:
            raise ValueError(f"host_rows must be an integer >= page_size, got {host_rows!r}")
        self.host_pages = int(host_rows) // self.page_size
        self.host_rows = self.host_pages * self.page_size
        if self.host_rows >= 2 ** 31:
            raise ValueError(f"host_rows ({self.host_rows}) exceed int32 row ids")
        self.max_misses = min(self.top_k, self.hot_units)
        self.k_pad = max(16, next_pow2(self.top_k))
        self.search_steps = self.k_pad.bit_length() + 1
        self.stamp_units = triton.cdiv(self.max_seq_len, self.unit)   # upstream: stamp table
        self.scratch_width = resolve_scratch_width(self.k_pad, self.hot_units, self.stamp_units,
                                                   self.upstream)

    @classmethod
    def footprint_of(cls, **kwargs) -> Tuple[int, int]:
        """``(device bytes, host bytes)`` a coordinator with these arguments allocates (the
        constructor's keyword arguments; ``seed`` and ``resolve_launch`` change nothing and are
        ignored), computed without allocating."""
        obj = cls.__new__(cls)
        kwargs.pop("resolve_launch", None)
        kwargs.pop("seed", None)
        obj._configure(**{"device_buffer_size": None, "page_size": 64, "load_granularity": "token",
                          "copy_engine": "uva_kernel", "lru_order": "upstream", "host_rows": None,
                          "host_alloc": DEFAULT_HOST_ALLOC, "device": "cpu", **kwargs})
        return obj.footprint()

    def _init_state(self, copy_engine: str, seed: int, host_page_order: str) -> None:
        """Initial contents of the buffers, the copy engine and the host-side state."""
        L, R, C = self.num_layers, self.max_requests, self.hot_units
        self.device_kv.zero_()            # deterministic bytes in never-written rows
        self.slot_unit.fill_(-1)
        self.lru.copy_(torch.arange(C, dtype=torch.int32, device=self.device).expand(L, R, C))
        self.host_page_table.fill_(-1)
        self.counts.zero_()
        self.plan.zero_()
        try:
            self.set_copy_engine(copy_engine)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            raise HiSparseOOMError(f"allocating the {copy_engine} copy engine's buffers failed: "
                                   f"{e}") from e

        # Host-side set-up state (not touched inside swap_in_selected_pages).
        # taken from the end: in order, page 0 first, for 'sequential'
        self.host_page_order = host_page_order
        self._free_pages: List[int] = (
            np.random.default_rng(seed).permutation(self.host_pages).tolist()
            if host_page_order == "shuffled" else list(range(self.host_pages - 1, -1, -1)))
        self._pages: Dict[int, List[int]] = {}          # req -> host pages, logical order
        self._host_table_np = np.full((R, self.max_pages), -1, dtype=np.int64)
        self._host_len = np.zeros(R, dtype=np.int64)    # positions written to the host pool
        self._filled = np.zeros(R, dtype=np.int64)      # positions 0.. resident in order
        self._seq_len = np.zeros(R, dtype=np.int64)     # seq_len at the last begin_step
        self._reserved_page = np.full(R, -1, dtype=np.int64)
        self._reserved_rows = np.zeros(R, dtype=np.int64)
        self._active = np.zeros(R, dtype=bool)
        self._last_layer: Optional[int] = None
        self._last_batch = 0
        self._plan_layer: Optional[int] = None
        self._plan_batch = 0

    def allocations(self) -> Dict[str, Tuple[str, Tuple[int, ...], torch.dtype, bool]]:
        """Every buffer the coordinator allocates: attribute -> (what, shape, dtype, on host).
        The one source of the allocation sizes (``footprint`` sums them)."""
        L, R, C = self.num_layers, self.max_requests, self.hot_units
        return {
            "host_kv": ("host KV pool", (L, self.host_rows, self.row_bytes), torch.uint8, True),
            "device_kv": ("device hot buffers", (L, self.num_slots, self.row_bytes), torch.uint8, False),
            "slot_unit": ("slot map", (L, R, C), torch.int32, False),
            "lru": ("LRU order", (L, R, C), torch.int32, False),
            "host_page_table": ("host page table", (R, self.max_pages), torch.int32, False),
            "out": ("slot tables", (L, R, self.top_k), torch.int32, False),
            "plan": ("miss plan", (R, 1 + 2 * self.max_misses), torch.int32, False),
            "counts": ("counts", (L, R, NUM_COUNT_FIELDS), torch.int64, False),
            "scratch": ("resolve scratch (all layers)", (R, self.scratch_width), torch.int32, False),
        }

    def footprint(self) -> Tuple[int, int]:
        """``(device bytes, host bytes)`` of ``allocations`` (the copy engine's staging aside)."""
        dev = host = 0
        for _, shape, dtype, on_host in self.allocations().values():
            n = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
            host, dev = (host + n, dev) if on_host else (host, dev + n)
        return dev, host

    def set_resolve_launch(self, launch: ResolveLaunch) -> None:
        """Sets the resolve kernel's launch configuration (set-up, between calls)."""
        if not isinstance(launch, ResolveLaunch):
            raise ValueError(f"resolve_launch must be a ResolveLaunch, got {type(launch).__name__}")
        if launch.kernel == "cuda":
            if self.device.type != "cuda" or not self.upstream:
                raise ValueError("resolve_launch.kernel 'cuda' needs a CUDA device and "
                                 f"lru_order 'upstream' (got {self.device.type}, "
                                 f"{'upstream' if self.upstream else 'position'})")
            self.cuda_resolve_shape = cuda_resolve_shape(self.top_k, self.hot_units,
                                                         launch.num_warps)
            self.cuda_resolve = CudaResolve.load()          # built here, outside timed calls
        self.resolve_launch = launch
        self.block_c, self.resolve_warps = launch.resolved(self.k_pad, self.hot_units,
                                                           self.upstream)
        # inline PTX only where it runs: a CUDA launch (the interpreter takes tl.store)
        self.resolve_ptx_scatter = (PTX_SCATTER_MODES[launch.ptx_scatter]
                                    if self.device.type == "cuda" else 0)

    def set_copy_engine(self, copy_engine: str, rows_per_program: Optional[int] = None,
                        pdl: Optional[bool] = None) -> None:
        """Switches the copy engine (set-up, between calls); see ``backends/copy_engines.py``
        (``pdl``: the uva_kernel engine's programmatic dependent launch, ``make_copy_engine``;
        with it the resolve lets the copy launch while it runs)."""
        if copy_engine not in COPY_ENGINES:
            raise ValueError(f"copy_engine must be one of {COPY_ENGINES}, got {copy_engine!r}")
        self.engine = make_copy_engine(
            copy_engine, capacity_rows=self.max_requests * self.max_misses * self.unit,
            row_bytes=self.row_bytes, device=self.device, rows_per_program=rows_per_program,
            pdl=pdl)
        self.copy_engine_name = copy_engine

    # ---------------------------------------------------------------- sizes and views
    def device_pool(self, layer_id: int) -> torch.Tensor:
        """uint8 ``[num_slots, row_bytes]`` device rows of one layer (attention gathers here)."""
        self._check_layer(layer_id)
        return self.device_kv[layer_id]

    def request_slot_base(self, req_pool_index: int) -> int:
        """First device row of a request (its hot buffer; the reserved page is at ``+ D``)."""
        return int(req_pool_index) * self.slots_per_request

    def device_working_set_bytes(self) -> int:
        """Bytes of the device hot buffers (all layers, all requests, reserved pages included)."""
        return self.device_kv.numel()

    def device_metadata_bytes(self) -> int:
        """Bytes of the device bookkeeping (slot maps, LRU, page table, outputs, plan, scratch)."""
        return sum(t.numel() * t.element_size() for t in (
            self.slot_unit, self.lru, self.host_page_table, self.out, self.plan, self.counts,
            self.scratch))

    def host_bytes(self) -> int:
        """Bytes of the host KV pool (all layers)."""
        return self.host_kv.numel()

    # ---------------------------------------------------------------- host pool set-up
    def _check_layer(self, layer_id: int) -> None:
        if not isinstance(layer_id, (int, np.integer)) or not 0 <= layer_id < self.num_layers:
            raise ValueError(f"layer_id must be in [0, {self.num_layers}), got {layer_id!r}")

    def _check_req(self, r: int, name: str = "req_pool_index") -> int:
        if not 0 <= int(r) < self.max_requests:
            raise ValueError(f"{name} must be in [0, {self.max_requests}), got {r}")
        return int(r)

    def _ensure_host_pages(self, req: int, n_positions: int) -> None:
        if n_positions > self.max_seq_len:
            raise ValueError(f"request {req}: {n_positions} positions exceed max_seq_len "
                             f"{self.max_seq_len}")
        pages = self._pages.setdefault(req, [])
        need = triton.cdiv(n_positions, self.page_size) - len(pages)
        if need <= 0:
            return
        if need > len(self._free_pages):
            raise HiSparseOOMError(f"host pool exhausted: request {req} needs {need} more pages "
                                   f"of {self.page_size} rows, {len(self._free_pages)} free of "
                                   f"{self.host_pages}")
        new = [self._free_pages.pop() for _ in range(need)]
        first = len(pages)
        pages.extend(new)
        self._host_table_np[req, first:first + need] = new
        self.host_page_table[req, first:first + need] = torch.tensor(
            new, dtype=torch.int32).to(self.device)

    def host_rows_of(self, req_pool_index: int, positions) -> np.ndarray:
        """Host rows (int64) of a request's positions; they must have been allocated."""
        req = self._check_req(req_pool_index)
        p = np.asarray(positions, dtype=np.int64)
        pages = self._host_table_np[req, p // self.page_size]
        if (pages < 0).any():
            raise ValueError(f"request {req}: positions without host pages (load them first)")
        return pages * self.page_size + p % self.page_size

    def load_host_kv(self, layer_id: int, req_pool_index: int, rows: torch.Tensor,
                     start_position: int = 0) -> None:
        """Writes a request's logical KV rows into the host pool (set-up, not timed).

        ``rows`` uint8 ``[n, row_bytes]``: KV rows of positions ``start_position ..
        start_position + n - 1`` of layer ``layer_id``. Allocates host pages as needed (from the
        shuffled free list); raises HiSparseOOMError when the host pool is full.
        """
        self._check_layer(layer_id)
        req = self._check_req(req_pool_index)
        if not isinstance(rows, torch.Tensor) or rows.dtype != torch.uint8 or rows.dim() != 2 \
                or rows.shape[1] != self.row_bytes:
            raise ValueError(f"rows must be a uint8 [n, row_bytes={self.row_bytes}] tensor, got "
                             f"{getattr(rows, 'dtype', type(rows))} "
                             f"{tuple(getattr(rows, 'shape', ()))}")
        if start_position < 0:
            raise ValueError(f"start_position must be >= 0, got {start_position}")
        n = rows.shape[0]
        end = start_position + n
        self._ensure_host_pages(req, end)
        copy_pool_rows(self.host_kv[layer_id], self.host_rows_of(req, np.arange(start_position, end)),
                       rows)
        if start_position <= self._host_len[req]:
            self._host_len[req] = max(self._host_len[req], end)

    def load_host_kv_all_layers(self, req_pool_index: int, rows: torch.Tensor,
                                start_position: int = 0) -> None:
        """``load_host_kv`` for every layer; ``rows`` uint8 ``[num_layers, n, row_bytes]``."""
        if not isinstance(rows, torch.Tensor) or rows.dim() != 3 or \
                rows.shape[0] != self.num_layers:
            raise ValueError(f"rows must be a uint8 [num_layers={self.num_layers}, n, row_bytes] "
                             f"tensor, got {tuple(getattr(rows, 'shape', ()))}")
        for layer in range(self.num_layers):
            self.load_host_kv(layer, req_pool_index, rows[layer], start_position)

    def release(self, req_pool_index: int) -> None:
        """Frees a request's host pages and forgets its hot buffers."""
        req = self._check_req(req_pool_index)
        self._free_pages.extend(self._pages.pop(req, []))
        self._host_table_np[req] = -1
        self.host_page_table[req].fill_(-1)
        self._host_len[req] = 0
        self._active[req] = False

    # ---------------------------------------------------------------- device set-up
    def _copy_host_to_device(self, reqs: List[int], positions: List[np.ndarray],
                             offsets: List[np.ndarray]) -> None:
        """Copies host rows of ``positions`` to device rows ``base(req) + offsets``, all layers."""
        if not reqs:
            return
        src = np.concatenate([self.host_rows_of(r, p) for r, p in zip(reqs, positions)])
        dst = np.concatenate([self.request_slot_base(r) + o for r, o in zip(reqs, offsets)])
        if len(src) == 0:
            return
        for layer in range(self.num_layers):
            copy_pool_rows(self.device_kv[layer], dst, self.host_kv[layer], src)

    def _check_batch_host(self, req_pool_indices, lens, name: str):
        reqs = _as_int_array(req_pool_indices, "req_pool_indices")
        n = _as_int_array(lens, name)
        if reqs.shape != n.shape:
            raise ValueError(f"req_pool_indices has {reqs.size} entries, {name} {n.size}")
        for r in reqs:
            self._check_req(r, "req_pool_indices entry")
        if len(set(reqs.tolist())) != len(reqs):
            raise ValueError("req_pool_indices must be distinct within a batch")
        return reqs, n

    def _grow(self, reqs, targets) -> None:
        """Makes positions ``filled .. target-1`` resident in position order (all layers)."""
        rs, ps = [], []
        for r, t in zip(reqs, targets):
            if t > self._filled[r]:
                rs.append(int(r))
                ps.append(np.arange(self._filled[r], t, dtype=np.int64))
        self._copy_host_to_device(rs, ps, ps)
        for r, p in zip(rs, ps):
            units = np.unique(p // self.unit)
            u = torch.from_numpy(units.astype(np.int32)).to(self.device)
            self.slot_unit[:, r, u.long()] = u
            self._filled[r] = p[-1] + 1

    def prefill(self, req_pool_indices, prompt_lens) -> None:
        """Initialises the hot buffers after prefill (set-up, not timed).

        For each request: hot buffer = positions ``0 .. min(prompt_len, D) - 1`` (copied from the
        host pool, which must hold them), LRU order = position order, reserved page empty.
        """
        reqs, lens = self._check_batch_host(req_pool_indices, prompt_lens, "prompt_lens")
        for r, n in zip(reqs, lens):
            if not 0 <= n <= self.max_seq_len:
                raise ValueError(f"prompt_lens entry {n} must be in [0, {self.max_seq_len}]")
            if self._host_len[r] < min(n, self.device_buffer_size):
                raise ValueError(f"request {r}: the host pool holds {self._host_len[r]} positions,"
                                 f" prefill needs {min(n, self.device_buffer_size)}")
        C = self.hot_units
        for r in reqs:
            self.slot_unit[:, r].fill_(-1)
            self.lru[:, r].copy_(torch.arange(C, dtype=torch.int32, device=self.device))
        self._filled[reqs] = 0
        self._seq_len[reqs] = lens
        self._reserved_page[reqs] = -1
        self._reserved_rows[reqs] = 0
        self._active[reqs] = True
        self._grow(reqs, np.minimum(lens, self.device_buffer_size))

    def begin_step(self, req_pool_indices, seq_lens) -> None:
        """Starts a decode step (set-up, not timed; synchronises).

        ``seq_lens`` include the newest token. Simulates attention's KV write of the newest token
        (position ``seq_len - 1``, read from the host pool) into every layer: a short request's
        hot buffer grows in position order; a long request's newest token goes to its reserved
        page (module docstring). ``seq_len`` may not decrease between steps of a request.
        """
        reqs, lens = self._check_batch_host(req_pool_indices, seq_lens, "seq_lens")
        D, P = self.device_buffer_size, self.page_size
        for r, n in zip(reqs, lens):
            if not self._active[r]:
                raise ValueError(f"request {r} has not been prefilled")
            if not 1 <= n <= self.max_seq_len:
                raise ValueError(f"seq_lens entry {n} must be in [1, {self.max_seq_len}]")
            if n < self._seq_len[r]:
                raise ValueError(f"request {r}: seq_len {n} < previous {self._seq_len[r]}")
            if self._host_len[r] < n:
                raise ValueError(f"request {r}: the host pool holds {self._host_len[r]} positions,"
                                 f" seq_len is {n}")
        self._grow(reqs, np.minimum(lens, D))
        rs, ps, offs = [], [], []
        for r, n in zip(reqs, lens):
            self._seq_len[r] = n
            if n <= D:
                continue
            newest = n - 1
            if self.page_mode:
                page = newest // P
                if self._reserved_page[r] != page or self._reserved_rows[r] > newest % P + 1:
                    self._reserved_page[r], self._reserved_rows[r] = page, 0
                p = np.arange(page * P + self._reserved_rows[r], newest + 1, dtype=np.int64)
                self._reserved_rows[r] = newest % P + 1
                o = D + p % P
            else:
                p = np.array([newest], dtype=np.int64)
                o = np.array([D], dtype=np.int64)
            rs.append(int(r))
            ps.append(p)
            offs.append(o)
        self._copy_host_to_device(rs, ps, offs)

    # ---------------------------------------------------------------- the timed call
    def swap_in_selected_pages(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                               topk_indices: torch.Tensor, layer_id: int) -> torch.Tensor:
        """Resolves one layer's selection into device rows, loading the misses.

        Args (device tensors): ``req_pool_indices`` int32/int64 ``[B]`` (distinct),
        ``seq_lens`` int32/int64 ``[B]`` (newest token included; as given to the last
        ``begin_step``), ``topk_indices`` int32 ``[B, top_k]`` request-local positions,
        -1 padded (check with ``validate_selection`` before timing).
        Returns int32 ``[B, top_k]``: global row ids into ``device_pool(layer_id)`` (-1 stays
        -1); a view of a per-layer buffer, valid until this layer's next call. Counts go to
        ``layer_counts(layer_id)``. No host sync for the 'uva_kernel' engine.
        Equivalent to ``resolve_selection`` followed by ``copy_planned_misses``.
        """
        out = self.resolve_selection(req_pool_indices, seq_lens, topk_indices, layer_id)
        self.copy_planned_misses(layer_id)
        return out

    def resolve_selection(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                          topk_indices: torch.Tensor, layer_id: int) -> torch.Tensor:
        """Stage 1 of the swap-in (one Triton kernel): hit detection, LRU update, miss -> slot
        assignment, output slot table, counts and the miss plan. The missed rows are *not* in
        the device pool until ``copy_planned_misses(layer_id)`` runs (for stage timing)."""
        self._check_layer(layer_id)
        B = self._check_call(req_pool_indices, seq_lens, topk_indices)
        out = self.out[layer_id, :B]
        counts = self.counts[layer_id, :B]
        self._last_layer, self._last_batch = layer_id, B
        self._plan_layer, self._plan_batch = layer_id, B
        if B == 0:
            return out
        pdl = self.device.type == "cuda" and getattr(self.engine, "pdl", False)
        if self.resolve_launch.kernel == "cuda":
            self.cuda_resolve.launch(
                self.cuda_resolve_shape, req_idx=req_pool_indices, seq_lens=seq_lens,
                topk=topk_indices, slot_unit=self.slot_unit[layer_id], lru=self.lru[layer_id],
                host_table=self.host_page_table, out=out, plan=self.plan, counts=counts,
                D=self.device_buffer_size, slots_per_req=self.slots_per_request,
                row_bytes=self.row_bytes, max_misses=self.max_misses, n_units=self.stamp_units,
                unit=self.unit, page=self.page_size, page_mode=self.page_mode,
                launch_dependents=pdl)
            return out
        resolve_swap_in_kernel[(B,)](
            req_pool_indices, seq_lens, topk_indices, topk_indices.stride(0),
            self.slot_unit[layer_id], self.lru[layer_id],
            self.host_page_table, self.host_page_table.stride(0),
            out, out.stride(0),
            self.plan, self.plan.stride(0),
            counts, counts.stride(0),
            self.scratch, self.scratch.stride(0),
            self.top_k, self.hot_units, self.device_buffer_size, self.slots_per_request,
            self.row_bytes, self.max_misses, self.stamp_units,
            UNIT=self.unit, PAGE=self.page_size, PAGE_MODE=self.page_mode,
            K_PAD=self.k_pad, LOG_K_PAD=self.k_pad.bit_length() - 1, BLOCK_C=self.block_c,
            SEARCH_STEPS=self.search_steps, UPSTREAM=self.upstream,
            PTX_SCATTER=self.resolve_ptx_scatter,
            LAUNCH_DEPENDENTS=pdl,
            num_warps=self.resolve_warps)
        return out

    def copy_planned_misses(self, layer_id: int) -> None:
        """Stage 2 of the swap-in: the copy engine loads the rows planned by the latest
        ``resolve_selection`` (which must have been for ``layer_id``)."""
        self._check_layer(layer_id)
        if self._plan_layer != layer_id:
            raise ValueError(f"the miss plan is for layer {self._plan_layer}, not {layer_id}: "
                             f"call resolve_selection for this layer first")
        self.engine.copy(self.host_kv[layer_id], self.device_kv[layer_id], self.plan,
                         self._plan_batch, self.unit)
        self._plan_layer = None

    def _check_call(self, req_pool_indices, seq_lens, topk_indices) -> int:
        for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens),
                        ("topk_indices", topk_indices)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.device != self.device and not (t.device.type == self.device.type == "cuda"):
                raise ValueError(f"{name} must be on {self.device}, got {t.device}")
        if topk_indices.dtype != torch.int32 or topk_indices.dim() != 2 or \
                topk_indices.shape[1] != self.top_k or topk_indices.stride(1) != 1:
            raise ValueError(f"topk_indices must be int32 [batch, top_k={self.top_k}] with unit "
                             f"column stride, got {topk_indices.dtype} "
                             f"{tuple(topk_indices.shape)}")
        B = topk_indices.shape[0]
        for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens)):
            if t.dtype not in (torch.int32, torch.int64) or t.shape != (B,) or \
                    (B > 0 and t.stride(0) != 1):
                raise ValueError(f"{name} must be a contiguous int32/int64 [batch={B}] tensor, "
                                 f"got {t.dtype} {tuple(t.shape)}")
        if B > self.max_requests:
            raise ValueError(f"batch {B} exceeds max_requests {self.max_requests}")
        return B

    # ---------------------------------------------------------------- counts and checks
    def layer_counts(self, layer_id: int) -> Dict[str, torch.Tensor]:
        """Counts of this layer's latest call: name -> int64 ``[batch]`` device tensor."""
        self._check_layer(layer_id)
        B = self._last_batch
        return {name: self.counts[layer_id, :B, i] for i, name in enumerate(COUNT_FIELDS)}

    @property
    def last_counts(self) -> Dict[str, torch.Tensor]:
        """Counts of the latest ``swap_in_selected_pages`` call (any layer)."""
        if self._last_layer is None:
            return {name: self.counts[0, :0, i] for i, name in enumerate(COUNT_FIELDS)}
        return self.layer_counts(self._last_layer)

    def validate_selection(self, topk_indices, seq_lens, req_pool_indices=None) -> None:
        """``validate_selection`` plus: width ``top_k``; with ``req_pool_indices``, distinct
        prefilled requests whose ``seq_lens`` match their last ``begin_step``. Synchronises."""
        validate_selection(topk_indices, seq_lens)
        if topk_indices.shape[1] != self.top_k:
            raise ValueError(f"topk_indices must have top_k={self.top_k} columns, got "
                             f"{topk_indices.shape[1]}")
        if req_pool_indices is not None:
            reqs, lens = self._check_batch_host(req_pool_indices, seq_lens, "seq_lens")
            for r, n in zip(reqs, lens):
                if not self._active[r] or self._seq_len[r] != n:
                    raise ValueError(f"request {r}: seq_len {n} was not set up by begin_step "
                                     f"(last: {self._seq_len[r]})")

    def find_page_overflow(self, topk_indices, seq_lens) -> List[Tuple[int, int]]:
        """Page mode: ``(batch_row, pages_needed)`` of rows that would overflow the hot buffer
        (capacity ``page_capacity``); always empty in token mode."""
        if not self.page_mode:
            return []
        return find_page_overflow(topk_indices, seq_lens, self.page_size,
                                  self.device_buffer_size)

    @property
    def page_capacity(self) -> int:
        """Hot page slots per (layer, request) in page mode (``D / page_size``)."""
        return self.device_buffer_size // self.page_size

    def overflow_error(self, topk_indices, seq_lens) -> Optional[PageOverflowError]:
        """A PageOverflowError naming the worst row's pages needed and the capacity, or None."""
        rows = self.find_page_overflow(topk_indices, seq_lens)
        if not rows:
            return None
        b, need = max(rows, key=lambda x: x[1])
        return PageOverflowError(
            f"page-mode overflow: {len(rows)} request(s) select more distinct pages than the hot "
            f"buffer holds; worst: batch row {b} needs {need} pages, capacity "
            f"{self.page_capacity} (device_buffer_size={self.device_buffer_size} / "
            f"page_size={self.page_size})")
