"""A small, obviously-correct pure-Python model of the HiSparse coordinator's bookkeeping.

It is the independent reference the GPU coordinator (``backends/hisparse_coordinator.py``) is
tested against. One ``HotBufferModel`` per (layer, request); everything is lists, sets and dicts.

Semantics (units are tokens for ``load_granularity='token'``, logical pages of ``page_size``
positions for ``'page'``; ``C = device_buffer_size / unit`` hot unit slots):

* A request is *short* while ``seq_len <= device_buffer_size``: position ``p`` sits at device
  offset ``p`` (hot buffer in position order), every selected position is a hit, nothing loads.
* After prefill (and as a short request grows) hot unit slot ``s`` holds unit ``s``; the LRU
  order is slot order (unit 0 least recent).
* A *long* request's newest unit (the token ``seq_len - 1``, or the page holding it) lives in the
  reserved page at device offsets ``D ..``; selected, it counts as a hit and takes no hot slot.
  Token mode: offset ``D``. Page mode: offset ``D + p % page_size``.
* Every other selected unit (duplicates and -1 ignored) is a hit when some hot slot holds it,
  else a miss. The i-th miss takes the i-th least-recently-used slot that this step does not
  hit. New LRU order: untouched slots (previous relative order), then the slots filled by the
  misses (miss order), then the hit slots (most recent last). ``lru_order`` orders misses and
  hits: ``upstream`` (SGLang's kernel): misses by their first entry in the selection, hits in
  their previous LRU order; ``position``: both by ascending unit.
* Page mode: if a step selects more distinct non-reserved pages than ``C``, that is an overflow:
  nothing changes, every output is -1, ``pages_needed`` reports the demand.
* Device offset of position ``p`` in hot unit slot ``s``: ``s * unit + p % unit``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence


@dataclass
class StepResult:
    """What one swap-in step of one (layer, request) produced.

    ``offsets``: request-local device offset per selection entry (-1 for -1 / invalid / overflow).
    Counts are in units (tokens or pages); ``tokens_loaded`` counts rows copied host -> device.
    ``loaded``: (unit, hot slot) of each miss, in miss order.
    """

    offsets: List[int]
    hits: int
    misses: int
    tokens_loaded: int
    pages_loaded: int
    overflow: bool
    pages_needed: int
    loaded: List[tuple] = field(default_factory=list)

    def bytes_h2d(self, row_bytes: int) -> int:
        return self.tokens_loaded * row_bytes


LRU_ORDERS = ("upstream", "position")


class HotBufferModel:
    """The hot buffer of one (layer, request)."""

    def __init__(self, device_buffer_size: int, page_size: int, load_granularity: str,
                 lru_order: str = "upstream"):
        if load_granularity not in ("token", "page"):
            raise ValueError(f"load_granularity must be 'token' or 'page', "
                             f"got {load_granularity!r}")
        if lru_order not in LRU_ORDERS:
            raise ValueError(f"lru_order must be one of {LRU_ORDERS}, got {lru_order!r}")
        self.upstream = lru_order == "upstream"
        self.D = device_buffer_size
        self.P = page_size
        self.page_mode = load_granularity == "page"
        self.unit = page_size if self.page_mode else 1
        if self.D % self.unit:
            raise ValueError("device_buffer_size must be a multiple of page_size in page mode")
        self.C = self.D // self.unit
        self.slot_unit: List[int] = [-1] * self.C
        self.lru: List[int] = list(range(self.C))
        self.filled = 0  # positions 0 .. filled-1 sit in position order

    def prefill(self, prompt_len: int) -> None:
        self.slot_unit = [-1] * self.C
        self.lru = list(range(self.C))
        self.filled = 0
        self._grow(min(prompt_len, self.D))

    def begin_step(self, seq_len: int) -> None:
        self._grow(min(seq_len, self.D))

    def _grow(self, upto: int) -> None:
        for p in range(self.filled, upto):
            self.slot_unit[p // self.unit] = p // self.unit
        self.filled = max(self.filled, upto)

    def resident_units(self) -> Dict[int, int]:
        """unit -> hot slot, for the slots that hold something."""
        return {u: s for s, u in enumerate(self.slot_unit) if u >= 0}

    def step(self, seq_len: int, selection: Sequence[int]) -> StepResult:
        valid = [p for p in selection if 0 <= p < seq_len]
        if seq_len <= self.D:
            units = {p // self.unit for p in valid}
            offsets = [p if 0 <= p < seq_len else -1 for p in selection]
            return StepResult(offsets, len(units), 0, 0, 0, False, 0)

        newest = (seq_len - 1) // self.unit
        wanted = list(dict.fromkeys(p // self.unit for p in valid if p // self.unit != newest))
        if not self.upstream:
            wanted.sort()
        newest_hit = any(p // self.unit == newest for p in valid)
        if self.page_mode and len(wanted) > self.C:
            return StepResult([-1] * len(selection), 0, 0, 0, 0, True, len(wanted))

        resident = self.resident_units()
        hits = [u for u in wanted if u in resident]
        misses = [u for u in wanted if u not in resident]
        if self.upstream:                       # hits in their previous LRU order
            hit_units = set(hits)
            hits = [self.slot_unit[s] for s in self.lru if self.slot_unit[s] in hit_units]
        hit_slots = [resident[u] for u in hits]
        hit_set = set(hit_slots)
        evictable = [s for s in self.lru if s not in hit_set]
        taken = evictable[:len(misses)]
        for u, s in zip(misses, taken):
            self.slot_unit[s] = u
        self.lru = evictable[len(misses):] + taken + hit_slots

        slot_of = dict(zip(hits, hit_slots))
        slot_of.update(zip(misses, taken))
        offsets = []
        for p in selection:
            if not 0 <= p < seq_len:
                offsets.append(-1)
            elif p // self.unit == newest:
                offsets.append(self.D + (p % self.P if self.page_mode else 0))
            else:
                offsets.append(slot_of[p // self.unit] * self.unit + p % self.unit)
        return StepResult(offsets, len(hits) + int(newest_hit), len(misses),
                          len(misses) * self.unit, len(misses) if self.page_mode else 0,
                          False, len(wanted) if self.page_mode else 0,
                          list(zip(misses, taken)))


class CoordinatorModel:
    """``HotBufferModel`` per (layer, request), with the coordinator's batch-shaped API."""

    def __init__(self, num_layers: int, device_buffer_size: int, page_size: int,
                 load_granularity: str, lru_order: str = "upstream"):
        self.num_layers = num_layers
        self.args = (device_buffer_size, page_size, load_granularity, lru_order)
        self.buffers: Dict[tuple, HotBufferModel] = {}

    def buffer(self, layer: int, req: int) -> HotBufferModel:
        if (layer, req) not in self.buffers:
            self.buffers[(layer, req)] = HotBufferModel(*self.args)
        return self.buffers[(layer, req)]

    def prefill(self, reqs: Sequence[int], prompt_lens: Sequence[int]) -> None:
        for r, n in zip(reqs, prompt_lens):
            for layer in range(self.num_layers):
                self.buffer(layer, r).prefill(n)

    def begin_step(self, reqs: Sequence[int], seq_lens: Sequence[int]) -> None:
        for r, n in zip(reqs, seq_lens):
            for layer in range(self.num_layers):
                self.buffer(layer, r).begin_step(n)

    def swap_in(self, reqs: Sequence[int], seq_lens: Sequence[int],
                selections: Sequence[Sequence[int]], layer: int) -> List[StepResult]:
        return [self.buffer(layer, r).step(n, sel)
                for r, n, sel in zip(reqs, seq_lens, selections)]
