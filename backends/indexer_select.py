"""``selection=indexer``: the lightning indexer and top-k run inside the measured step.

Per simulated layer an index-key cache (fp8, 132 B per token at dsv32; paged with the workload's
block table) holds seeded random keys for every position; per (step, layer) the index queries
``[B, index_heads, index_dim]`` bf16 and head weights ``[B, index_heads]`` float32 are seeded;
the logits take the query in ``query_dtype`` (``fp8``: quantized per head as vLLM's indexer does,
the default of ``selection.query_dtype``; or ``bf16`` as given).
The step's top-k plan is built once from the sequence lengths (``IndexerMetadata.for_decode``)
and reused by every layer. Stages: ``indexer`` (logits) and ``topk`` (top-k, fused with the
PAGED transform when the backend takes global slots and ``selection.fuse_topk``; otherwise
logical positions, as HiSparse needs). ``select`` = indexer + topk.

The scenario checks every layer step's selection against the torch reference by scores
(``harness.scenarios.decode``).
"""
from __future__ import annotations

from typing import List, Optional

import torch

from backends.kernels.indexer import QUERY_DTYPES, indexer_logits_paged
from backends.kernels.topk import plan_build_count
from backends.kernels.topk_transform import IndexerMetadata
from backends.kernels.index_cache import IndexKeyCache

#: stages the selection adds to a layer step (``select`` = ``indexer`` + ``topk``)
STAGES = ("select", "indexer", "topk")
#: result columns that make report variants of a backend fed by the indexer
VARIANT_AXES = ("fuse_topk", "query_dtype")


class IndexerSelector:
    """The lightning indexer + top-k of a decode workload ``wl`` (its model, block table, page
    size, sequence lengths; ``wl.generator(*seed)`` gives seeded torch generators)."""

    def __init__(self, wl, fuse_topk: bool, query_corr: float = 0.0, key_format: str = "fp8",
                 query_dtype: str = "fp8"):
        if not 0.0 <= query_corr <= 1.0:
            raise ValueError(f"selection.query_corr must be in [0, 1], got {query_corr}")
        if query_dtype not in QUERY_DTYPES:
            raise ValueError(f"selection.query_dtype must be one of {', '.join(QUERY_DTYPES)}, "
                             f"got {query_dtype!r}")
        self.wl, self.fuse, self.query_corr = wl, fuse_topk, float(query_corr)
        self.query_dtype = query_dtype
        self._prev_q: dict = {}
        m, dev = wl.model, wl.device
        self.caches: List[IndexKeyCache] = []
        slots = torch.arange(wl.num_pages * wl.page_size, device=dev)
        for layer in range(wl.num_layers):
            cache = IndexKeyCache.allocate(wl.num_pages, wl.page_size, m.index_dim, key_format, dev)
            keys = torch.randn(slots.numel(), m.index_dim, generator=wl.generator(4, layer),
                               device=dev)
            cache.write_slots(slots, keys)
            self.caches.append(cache)
            del keys
        self.max_len = wl.max_positions
        self.meta: Optional[IndexerMetadata] = None
        self.plan_builds: List[int] = []
        self.plan_us: List[float] = []
        self.logits: Optional[torch.Tensor] = None
        self._q = self._w = None

    def cache_bytes(self) -> int:
        return sum(c.data.numel() * c.data.element_size() for c in self.caches)

    def begin_step(self, step: int, seq_lens: torch.Tensor, timer) -> None:
        """Builds the step's plan (once; timed on its own with ``timer``, outside the layer
        samples)."""
        before = plan_build_count()
        timer.begin()
        self.meta = timer.run("plan", lambda: IndexerMetadata.for_decode(
            seq_lens, self.wl.block_table, self.wl.page_size, self.wl.top_k, max_len=self.max_len,
            fuse_topk=self.fuse))
        self.plan_us.append(timer.end()["plan"])
        self.plan_builds.append(plan_build_count() - before)

    def inputs(self, step: int, layer: int):
        """Index queries bf16 [B, index_heads, index_dim] (an AR(1) process over steps with
        correlation ``query_corr``) and head weights float32 [B, index_heads] (fixed per layer)."""
        m, dev, b = self.wl.model, self.wl.device, self.wl.batch_size
        g = self.wl.generator(5, step, layer)
        noise = torch.randn(b, m.index_heads, m.index_dim, generator=g, device=dev)
        prev = self._prev_q.get(layer) if step > 0 else None
        rho = self.query_corr
        q = noise if prev is None else rho * prev + (1.0 - rho * rho) ** 0.5 * noise
        self._prev_q[layer] = q
        gw = self.wl.generator(6, layer)
        w = torch.randn(b, m.index_heads, generator=gw, device=dev) * m.index_heads ** -0.5
        return q.to(torch.bfloat16), w

    def select(self, step: int, layer: int, seq_lens: torch.Tensor, timer,
               want_slots: bool) -> torch.Tensor:
        """int32 [B, top_k]: global slots (fused PAGED transform) when ``want_slots`` and fused,
        else request-local positions; -1 padded. Inputs are made before the caller's timer."""
        q, w = self._q, self._w
        cache = self.caches[layer]
        self.logits = timer.run("indexer", lambda: indexer_logits_paged(
            q, w, cache.data, self.wl.block_table, seq_lens, max_len=self.max_len,
            query_dtype=self.query_dtype))
        if want_slots and self.fuse:
            return timer.run("topk", lambda: self.meta.select(self.logits))
        return timer.run("topk", lambda: self.meta.positions(self.logits))

    def prepare(self, step: int, layer: int) -> None:
        """Draws the (step, layer) index queries and weights (untimed)."""
        self._q, self._w = self.inputs(step, layer)


def positions_of_slots(wl, slots: torch.Tensor) -> torch.Tensor:
    """Inverse of the PAGED transform: global slots int32 [B, K] -> request-local positions."""
    inv = torch.full((wl.num_pages,), -1, dtype=torch.long, device=slots.device)
    bt = wl.block_table.long()
    inv[bt.reshape(-1)] = torch.arange(bt.shape[1], device=slots.device).repeat(bt.shape[0])
    s = slots.long()
    pos = inv[s.clamp_min(0) // wl.page_size] * wl.page_size + s.clamp_min(0) % wl.page_size
    return torch.where(s >= 0, pos, torch.full_like(pos, -1)).to(torch.int32)
