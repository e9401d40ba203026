"""The workload of one configuration point: sequence lengths, paged KV pools, block tables,
queries, selections, and the reference every run is checked against.

The KV cache is a paged pool per simulated layer, ``[num_pages, page_size, row]`` (bf16 rows
``[.., d_qk]`` or fp8_ds_mla byte rows ``[.., row_bytes]`` uint8), shared by all requests through
a block table ``[batch, pages_per_request]`` whose pages are a random permutation (not
contiguous, as in a long-running server). Request b's token at position p lives in global slot
``block_table[b, p // page_size] * page_size + p % page_size``. The same logical KV (same seed)
feeds every backend, so outputs are comparable.

Decode step s (0-based) has ``seq_len = context_len + s + 1`` tokens per request (the current
token included), so the prompt at the first step is ``context_len`` tokens.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from backends.base import KVLayout, pool_pages
from backends.kernels import kv_format
from harness.config import ModelConfig
from harness.reference import convert_req_index_to_global_index_ref, sparse_mla_decode_on_slots_ref




def synthetic_seq_lens(context_len: int, steps: int, batch_size: int) -> np.ndarray:
    """int32 [steps, batch]: context_len + s + 1 at decode step s."""
    return (context_len + 1 + np.arange(steps, dtype=np.int64)[:, None]
            + np.zeros((1, batch_size), dtype=np.int64)).astype(np.int32)


def seeded_generator(device: torch.device, *seed: int) -> torch.Generator:
    """A torch generator on ``device`` seeded from the tuple ``seed`` (one stream per purpose)."""
    g = torch.Generator(device=device)
    g.manual_seed(int(np.random.SeedSequence(list(seed)).generate_state(1)[0]))
    return g


#: where a workload's KV comes from (``Workload.build``'s ``kv``)
KV_SOURCES = ("pool", "per_request", "none")


def _kv_rows(model: ModelConfig, kv_dtype: str, gen: torch.Generator, n: int,
             device: torch.device, scale_format: str = "raw") -> torch.Tensor:
    """``n`` seeded random KV rows in the pool format: bf16 ``[n, d_qk]`` or fp8_ds_mla bytes
    (tile scales in ``scale_format``, ``kv_format.KV_SCALE_FORMATS``)."""
    kv = torch.randn(n, model.d_qk, generator=gen, device=device).to(torch.bfloat16)
    if kv_dtype != "fp8_ds_mla":
        return kv
    return kv_format.quantize_fp8_ds_mla(kv, d_nope=model.d_nope, scale_format=scale_format)


def kv_pool_bytes(num_layers: int, batch_size: int, max_positions: int, page_size: int,
                  row_bytes: int) -> int:
    """Bytes of the paged KV pools of ``num_layers`` layers (``pool_pages`` pages each)."""
    return num_layers * pool_pages(batch_size, max_positions, page_size) * page_size * row_bytes


@dataclass(frozen=True)
class Workload:
    """Everything a decode backend needs for one point; built in one call (``Workload.build``),
    outside any timed region."""

    model: ModelConfig
    device: torch.device
    kv_dtype: str
    page_size: int
    seq_lens: np.ndarray          # int32 [steps, batch]
    topk: Optional[np.ndarray]    # int32 [steps, layers, batch, top_k] (None: indexer selects)
    top_k: int
    num_layers: int
    seed: int
    block_table: torch.Tensor     # int32 [batch, pages_per_request] (device)
    kv_pools: Tuple[torch.Tensor, ...]  # per layer [num_pages, page_size, row]
    phase: str = "decode"
    kv_scale_format: str = "raw"  # fp8_ds_mla tile scales: pow2 | raw (kv_format.KV_SCALE_FORMATS)

    @classmethod
    def build(cls, *, model: ModelConfig, device: torch.device, kv_dtype: str, page_size: int,
              seq_lens: np.ndarray, topk: Optional[np.ndarray], top_k: int, num_layers: int,
              seed: int, kv: str = "pool", kv_scale_format: str = "raw") -> "Workload":
        """Allocates the block table (a seeded permutation of the pool's pages) and the KV.

        ``kv``: ``"pool"`` fills each layer's device pool with seeded random KV in one draw;
        ``"per_request"`` fills it request by request from ``request_kv`` (every request's KV
        independent of the batch it runs in); ``"none"`` allocates no device KV at all (a design
        that keeps the KV elsewhere reads ``request_kv`` at set-up)."""
        if kv not in KV_SOURCES:
            raise ValueError(f"kv must be one of {KV_SOURCES}, got {kv!r}")
        batch, max_pos = int(seq_lens.shape[1]), int(seq_lens.max())
        n_pages = pool_pages(batch, max_pos, page_size)
        per_req = -(-max_pos // page_size)
        perm = torch.randperm(n_pages, generator=seeded_generator(device, seed, 1),
                              device=device).to(torch.int32)
        block_table = perm[: batch * per_req].view(batch, per_req).contiguous()
        wl = cls(model=model, device=device, kv_dtype=kv_dtype, page_size=page_size,
                 seq_lens=seq_lens, topk=topk, top_k=top_k, num_layers=num_layers, seed=seed,
                 block_table=block_table, kv_pools=(), kv_scale_format=kv_scale_format)
        if kv == "none":
            return wl
        pools = []
        for layer in range(num_layers):
            if kv == "pool":
                rows = _kv_rows(model, kv_dtype, seeded_generator(device, seed, 2, layer),
                                n_pages * page_size, device, kv_scale_format)
            else:
                rows = torch.empty(n_pages * page_size, wl.row_width, dtype=wl.row_dtype, device=device)
                for r in range(batch):
                    rows[wl.slots_of(r, max_pos)] = wl.request_kv(layer, r)
            pools.append(rows.view(n_pages, page_size, -1))
        return dataclasses.replace(wl, kv_pools=tuple(pools))

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[1])

    @property
    def num_rows(self) -> int:
        """Query rows of one layer step (one per request in decode)."""
        return self.batch_size

    @property
    def steps(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def max_positions(self) -> int:
        return int(self.seq_lens.max())

    @property
    def pages_per_request(self) -> int:
        return -(-self.max_positions // self.page_size)

    @property
    def num_pages(self) -> int:
        """Pages in the pool (``pool_pages``)."""
        return pool_pages(self.batch_size, self.max_positions, self.page_size)

    @property
    def row_bytes(self) -> int:
        return kv_format.row_bytes(self.kv_dtype, self.model.d_nope, self.model.d_rope)

    @property
    def layout(self) -> KVLayout:
        """The sizes the designs' footprints depend on."""
        return KVLayout(self.num_layers, self.max_positions, self.page_size, self.row_bytes, self.top_k)

    @property
    def kv_pool_bytes(self) -> int:
        """Bytes of the paged KV pools of all simulated layers."""
        return kv_pool_bytes(self.num_layers, self.batch_size, self.max_positions, self.page_size,
                             self.row_bytes)

    @property
    def row_dtype(self) -> torch.dtype:
        """dtype of a pool row: bfloat16 elements, or the bytes of an fp8_ds_mla row."""
        return torch.bfloat16 if self.kv_dtype == "bf16" else torch.uint8

    @property
    def row_width(self) -> int:
        """Elements of one pool row (``d_qk`` bf16 values or ``row_bytes`` bytes)."""
        return self.model.d_qk if self.kv_dtype == "bf16" else self.row_bytes

    def request_kv(self, layer: int, request: int) -> torch.Tensor:
        """The seeded KV rows of ``request`` at every position ``[max_positions, row]`` (pool
        dtype), one stream per (layer, request): what ``kv="per_request"`` / ``"none"`` serve."""
        return _kv_rows(self.model, self.kv_dtype, self.generator(7, layer, request),
                        self.max_positions, self.device, self.kv_scale_format)

    def slots_of(self, request: int, n: int) -> torch.Tensor:
        """Global slots int64 ``[n]`` of positions ``0 .. n-1`` of ``request``."""
        pos = torch.arange(n, device=self.device, dtype=torch.int64)
        return self.block_table[request].long()[pos // self.page_size] * self.page_size + pos % self.page_size

    def generator(self, *purpose: int) -> torch.Generator:
        """A seeded torch generator on the workload's device, one stream per ``purpose``."""
        return seeded_generator(self.device, self.seed, *purpose)

    def kv_flat(self, layer: int) -> torch.Tensor:
        """Layer's pool as flat rows [num_slots, row] (what the attention kernel takes)."""
        pool = self.kv_pools[layer]
        return pool.view(-1, pool.shape[-1])

    def q(self, step: int, layer: int) -> torch.Tensor:
        """Seeded random query bf16 [batch, num_heads, d_qk] of (step, layer)."""
        g = seeded_generator(self.device, self.seed, 3, step, layer)
        return torch.randn(self.batch_size, self.model.num_heads, self.model.d_qk, generator=g,
                           device=self.device).to(torch.bfloat16)

    def request_ids(self) -> torch.Tensor:
        return torch.arange(self.batch_size, dtype=torch.int32, device=self.device)

    def global_slots_ref(self, positions: torch.Tensor) -> torch.Tensor:
        """Request-local positions int32 [batch, K] -> global slots (torch reference)."""
        return convert_req_index_to_global_index_ref(self.request_ids(), self.block_table,
                                                      positions, self.page_size)

    def rows_by_position(self, layer: int, request: int, n: int) -> torch.Tensor:
        """The first ``n`` KV rows of ``request`` in position order, as bytes uint8 [n, row_bytes]
        (from the device pool, or ``request_kv`` when the workload has none)."""
        rows = (self.kv_flat(layer)[self.slots_of(request, n)] if self.kv_pools
                else self.request_kv(layer, request)[:n])
        return rows.contiguous().view(torch.uint8).view(n, self.row_bytes)

    def reference(self, layer: int, q: torch.Tensor, positions: torch.Tensor):
        """Reference (out float32 [B, H, d_v], lse float32 [B, H]) over the selected positions
        of the logical KV (positions -> slots through the block table, torch reference)."""
        return sparse_mla_decode_on_slots_ref(q, self.kv_flat(layer), self.global_slots_ref(positions),
                                              self.model.sm_scale, d_v=self.model.d_v)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (0 when both are 0)."""
    o, r = out.double(), ref.double()
    den = r.norm().item()
    num = (o - r).norm().item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def lse_error(lse: torch.Tensor, ref: torch.Tensor) -> float:
    """Max |lse - ref| over rows with a finite reference; inf if the +inf rows disagree."""
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(lse), finite) and not torch.equal(lse[~finite], ref[~finite]):
        return float("inf")
    if finite.any():
        return (lse[finite].double() - ref[finite].double()).abs().max().item()
    return 0.0
