"""A small, obviously-correct pure-Python model of the HiSparse connector design's semantics
(``backends/hisparse_connector.py``): which pages are resident, and per layer step which selected
positions are served from a resident page, a hot row (exact LRU) or copied from host. It is the
independent reference the backend's residency plan and fused resolver are tested against; the
hot rows reuse ``harness.lru_model.HotBufferModel`` (token granularity).

Residency (vLLM's order, see ``backends/connector_residency.py`` for the sources): the pool holds
``floor(resident_fraction * total_pages)`` pages; pages are lost request by request in batch
order, within a request from its highest page down, a request's last two pages (the active tail)
only after every other page of the batch, again request by request, highest first. A request
with a spilled page has a hot buffer; its resident positions are answered by their page and never
reach the hot buffer's LRU (they are handed to the hot-buffer model as -1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Set

from harness.lru_model import HotBufferModel

TAIL_PAGES = 2


def pool_pages(total_pages: int, resident_fraction: float) -> int:
    """Pages the device pool holds (``floor``, guarded against 0.29 * 100 = 28.999...)."""
    return min(total_pages, int(math.floor(resident_fraction * total_pages + 1e-9)))


def resident_pages(pages_per_request: Sequence[int], budget: int) -> List[Set[int]]:
    """Per request, the set of its logical pages that stay resident when the pool holds ``budget``
    pages."""
    order = []
    for r, n in enumerate(pages_per_request):
        tail = min(n, TAIL_PAGES)
        order += [(r, p) for p in reversed(range(n - tail))]
    for r, n in enumerate(pages_per_request):
        tail = min(n, TAIL_PAGES)
        order += [(r, p) for p in reversed(range(n - tail, n))]
    keep = [set(range(n)) for n in pages_per_request]
    for r, p in order[: sum(pages_per_request) - budget]:
        keep[r].discard(p)
    return keep


@dataclass
class ConnectorStep:
    """One layer step of one request.

    ``tier`` per selection entry: 'resident', 'hot' or 'none' (-1 / out of range);
    ``hot_offsets`` per entry its row in the request's hot region (None unless 'hot'); counts
    in rows; ``loaded``: (position, hot slot) of each row copied from host, ascending position.
    """

    tier: List[str]
    hot_offsets: List[int]
    resident_hits: int
    hot_hits: int
    misses: int
    loaded: List[tuple] = field(default_factory=list)

    @property
    def hits(self) -> int:
        return self.resident_hits + self.hot_hits


class ConnectorModel:
    """Residency of a batch plus one ``HotBufferModel`` per (layer, request with a hot buffer)."""

    def __init__(self, pages_per_request: Sequence[int], resident_fraction: float, *,
                 num_layers: int, device_buffer_size: int, page_size: int):
        self.P, self.D = page_size, device_buffer_size
        self.pages = list(pages_per_request)
        self.budget = pool_pages(sum(self.pages), resident_fraction)
        self.resident = resident_pages(self.pages, self.budget)
        self.hot_requests = [r for r, n in enumerate(self.pages) if len(self.resident[r]) < n]
        self.buffers: Dict[tuple, HotBufferModel] = {
            (layer, r): HotBufferModel(device_buffer_size, page_size, "token")
            for layer in range(num_layers) for r in self.hot_requests}

    def is_resident(self, req: int, position: int) -> bool:
        return position // self.P in self.resident[req]

    def prefill(self, prompt_lens: Sequence[int]) -> None:
        for (layer, r), buf in self.buffers.items():
            buf.prefill(prompt_lens[r])

    def begin_step(self, seq_lens: Sequence[int]) -> None:
        for (layer, r), buf in self.buffers.items():
            buf.begin_step(seq_lens[r])

    def step(self, layer: int, seq_lens: Sequence[int],
             selections: Sequence[Sequence[int]]) -> List[ConnectorStep]:
        """One layer step of the whole batch (``selections[r]``: request ``r``'s positions)."""
        out = []
        for r, (n, sel) in enumerate(zip(seq_lens, selections)):
            sel = [int(p) for p in sel]
            valid = [0 <= p < n for p in sel]
            res = [v and self.is_resident(r, p) for p, v in zip(sel, valid)]
            tier = ["resident" if x else ("hot" if v else "none") for x, v in zip(res, valid)]
            if (layer, r) not in self.buffers:
                assert "hot" not in tier, f"request {r} has no hot buffer but selects a spilled page"
                out.append(ConnectorStep(tier, [None] * len(sel), sum(res), 0, 0))
                continue
            masked = [-1 if x else p for p, x in zip(sel, res)]
            hot = self.buffers[(layer, r)].step(n, masked)
            offsets = [o if t == "hot" else None for o, t in zip(hot.offsets, tier)]
            out.append(ConnectorStep(tier, offsets, sum(res), hot.hits, hot.misses, hot.loaded))
        return out
