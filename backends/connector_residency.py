"""Which KV pages of a batch stay resident on the GPU in the HiSparse connector design, and what
the design allocates for a batch (so max batch under a budget follows from real allocations).

Residency policy (static lease for a run), after vLLM's scheduler-side coordinator
(``vllm/v1/hisparse/coordinator.py``, ``HiSparseCoordinator``; ``docs/design/hisparse.md``):

* The device pool may hold ``floor(resident_fraction * total_pages)`` of the batch's logical KV
  pages (a page = ``page_size`` positions of one request, all layers alike: vLLM's block table is
  shared by the layers of a cache group). Everything fits: every page is resident, no request has
  a hot region, nothing is on the host (vLLM keeps a request's pages pinned while the pool has
  room; ``update_residency``).
* Short of room, requests move to host reading in scheduling (batch) order; a moved request's
  clean pages are released tail first ("so a prefix loses its tail pages before its head",
  ``_unpin_clean_pages``) to the tail of the pool's free queue (``BlockPool.unpin_blocks``),
  which hands blocks out oldest first (``free_block_queue``: allocation pops the head, a freed
  block joins the tail; ``vllm/v1/core/block_pool.py``), so pages are lost in release order:
  request 0's pages from its highest to page 0, then request 1's, ... The last ``ACTIVE_TAIL_PAGES`` pages of a request stay pinned (vLLM's
  ``ACTIVE_TAIL_PAGES``, ``vllm/v1/hisparse/types.py``); only a budget that the other pages
  cannot meet spills them too (beyond vLLM, which never spills them: this is what makes
  ``resident_fraction=0`` the pure host + hot-buffer design), again in request order, highest
  first. Result: a prefix of the batch is not resident (bar active tails), one request is partly
  resident, the rest fully resident.
* A request with any spilled page gets a hot region of ``device_buffer_size + 1`` rows per layer
  (the LRU rows and the newest token's reserved row, as vLLM's ``region_stride`` plus its newest
  slot); a fully resident request has none.

Not modelled: the transition watermark (vLLM moves requests once the free pool falls below
``max(hot cost, num_blocks // 10)`` to leave room for admissions; a static batch admits nothing)
and the asynchronous spill transaction (set-up here is untimed).

Device pool layout, one tensor per layer: ``[resident pages | hot regions | padding]``, rows
rounded up to a multiple of 64 (FlashMLA views a pool in 64-row blocks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from backends.kernels.swap_in import resolve_scratch_width

#: sealed pages this close to a request's block-table tail stay resident (vLLM's ACTIVE_TAIL_PAGES)
ACTIVE_TAIL_PAGES = 2
#: device and host pools hold a multiple of this many rows
POOL_ROW_ALIGN = 64
#: int32 / int64 element sizes of the bookkeeping tensors
_I32, _I64 = 4, 8


def resident_page_budget(total_pages: int, resident_fraction: float) -> int:
    """Pages the device pool may hold: ``floor(resident_fraction * total_pages)`` (with a 1e-9
    guard so that e.g. 0.29 * 100 gives 29)."""
    return min(total_pages, int(math.floor(resident_fraction * total_pages + 1e-9)))


def spill_order(pages_per_request: Sequence[int]) -> np.ndarray:
    """int64 ``[total_pages, 2]`` (request, page) in the order the pool loses them (module
    docstring): every request's pages outside its active tail, requests in batch order, pages
    from the highest down; then the active tails, likewise."""
    heads, tails = [], []
    for r, n in enumerate(int(x) for x in pages_per_request):
        keep = min(n, ACTIVE_TAIL_PAGES)
        heads += [(r, p) for p in range(n - keep - 1, -1, -1)]
        tails += [(r, p) for p in range(n - 1, n - keep - 1, -1)]
    return np.asarray(heads + tails, dtype=np.int64).reshape(-1, 2)


def plan_residency(pages_per_request: Sequence[int], resident_pages: int) -> np.ndarray:
    """bool ``[batch, max_pages]``: True where a request's logical page is resident when the pool
    holds ``resident_pages`` pages (entries past a request's pages are False)."""
    n = np.asarray(pages_per_request, dtype=np.int64)
    total = int(n.sum())
    if not 0 <= resident_pages <= total:
        raise ValueError(f"resident_pages must be in [0, {total}], got {resident_pages}")
    mask = np.arange(int(n.max(initial=0)))[None, :] < n[:, None]
    spilled = spill_order(n)[: total - resident_pages]
    mask[spilled[:, 0], spilled[:, 1]] = False
    return mask


def pages_of(max_positions: Sequence[int], page_size: int) -> np.ndarray:
    """int64 pages each request needs for the positions it reaches."""
    return -(-np.asarray(max_positions, dtype=np.int64) // page_size)


@dataclass(frozen=True)
class ConnectorLayout:
    """What the design allocates for one batch (bytes over all simulated layers).

    ``pages`` int64 ``[batch]`` logical pages of each request, ``resident`` bool
    ``[batch, max_pages]`` the residency plan; ``pool_rows`` device rows per
    layer, ``hot_base`` first hot-region row, ``hot_stride`` rows per hot region
    (``device_buffer_size + 1``), ``host_rows`` pinned host rows per layer (spilled pages),
    ``hot_requests`` requests with a hot region; ``device_bytes`` = pools + bookkeeping,
    ``host_bytes`` = host pools.
    """

    pages: np.ndarray
    resident: np.ndarray
    resident_pages: int
    total_pages: int
    hot_requests: int
    hot_base: int
    hot_stride: int
    pool_rows: int
    host_rows: int
    pool_bytes: int
    metadata_bytes: int
    host_bytes: int

    @property
    def device_bytes(self) -> int:
        return self.pool_bytes + self.metadata_bytes

    @property
    def resident_page_share(self) -> float:
        """Fraction of the batch's KV pages resident on the GPU."""
        return self.resident_pages / self.total_pages if self.total_pages else 1.0


def k_pad(top_k: int) -> int:
    """The resolver's padded selection width (a power of two >= 16)."""
    return max(16, 1 << max(0, int(top_k) - 1).bit_length())


def metadata_bytes(*, batch: int, max_pages: int, state_rows: int, top_k: int,
                   device_buffer_size: int, num_layers: int, num_counts: int,
                   page_size: int) -> int:
    """Device bytes of the bookkeeping: residency and host tables ``[batch, max_pages]`` and hot
    state ``[batch]`` (int32), per layer slot map and LRU ``[state_rows, D]`` (int32), output
    rows ``[batch, top_k]`` (int32) and counts ``[batch, num_counts]`` (int64), and one miss plan
    ``[state_rows, 1 + 2 top_k]`` and resolve scratch ``[state_rows, resolve_scratch_width(k_pad,
    D, max_pages * page_size, upstream=True)]`` (int32)."""
    D, L = device_buffer_size, num_layers
    scratch = resolve_scratch_width(k_pad(top_k), D, max_pages * page_size, upstream=True)
    return (_I32 * (2 * batch * max_pages + batch)
            + L * (_I32 * 2 * state_rows * D + _I32 * batch * top_k + _I64 * batch * num_counts)
            + _I32 * state_rows * (1 + 2 * top_k + scratch))


def connector_layout(max_positions: Sequence[int], *, top_k: int, page_size: int, row_bytes: int,
                     num_layers: int, device_buffer_size: int, resident_fraction: float,
                     num_counts: int) -> ConnectorLayout:
    """The layout for requests reaching ``max_positions`` tokens each (the residency plan of
    ``resident_fraction``, module docstring). ``state_rows`` of the per-layer hot state is
    ``max(hot_requests, 1)`` so every kernel argument points at memory."""
    n = pages_of(max_positions, page_size)
    total = int(n.sum())
    budget = resident_page_budget(total, resident_fraction)
    resident = plan_residency(n, budget)
    spilled = n - resident.sum(axis=1)
    hot = int((spilled > 0).sum())
    stride = device_buffer_size + 1
    rows = budget * page_size + hot * stride
    pool_rows = -(-rows // POOL_ROW_ALIGN) * POOL_ROW_ALIGN
    host_rows = int(spilled.sum()) * page_size
    meta = metadata_bytes(batch=len(n), max_pages=int(n.max(initial=0)), state_rows=max(hot, 1),
                          top_k=top_k, device_buffer_size=device_buffer_size,
                          num_layers=num_layers, num_counts=num_counts, page_size=page_size)
    return ConnectorLayout(pages=n, resident=resident, resident_pages=budget, total_pages=total,
                           hot_requests=hot, hot_base=budget * page_size, hot_stride=stride,
                           pool_rows=pool_rows, host_rows=host_rows,
                           pool_bytes=num_layers * pool_rows * row_bytes, metadata_bytes=meta,
                           host_bytes=num_layers * host_rows * row_bytes)


def max_resident_pages(budget_bytes: int, max_positions: Sequence[int], *, top_k: int,
                       page_size: int, row_bytes: int, num_layers: int, device_buffer_size: int,
                       num_counts: int) -> int:
    """The most pages the pool can keep resident with the layout's ``device_bytes`` within
    ``budget_bytes`` (the pool leases pages while it has room, after the hot regions the spilled
    requests need); -1 when even spilling every page does not fit. Exact: evaluates the layout's
    byte count for every possible number of spilled pages."""
    n = pages_of(max_positions, page_size)
    total = int(n.sum())
    order = spill_order(n)
    newly = np.zeros(total, dtype=np.int64)            # 1 where a spill is a request's first
    newly[np.unique(order[:, 0], return_index=True)[1]] = 1
    first = np.concatenate([[0], np.cumsum(newly)])    # first[s]: requests hit by s spills
    spilled = np.arange(total + 1, dtype=np.int64)
    rows = (total - spilled) * page_size + first * (device_buffer_size + 1)
    pool = num_layers * (-(-rows // POOL_ROW_ALIGN) * POOL_ROW_ALIGN) * row_bytes
    meta = np.array([metadata_bytes(batch=len(n), max_pages=int(n.max(initial=0)), state_rows=max(h, 1),
                                    top_k=top_k, device_buffer_size=device_buffer_size,
                                    num_layers=num_layers, num_counts=num_counts,
                                    page_size=page_size)
                     for h in range(len(n) + 1)], dtype=np.int64)
    fits = np.nonzero(pool + meta[first] <= budget_bytes)[0]
    return total - int(fits[0]) if fits.size else -1
