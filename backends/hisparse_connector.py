"""vLLM's HiSparse local KV offload connector (``docs/design/hisparse.md`` in vllm-project/vllm)
as a serving design: KV stays resident on the GPU while the pool has room and spills to pinned
host memory page by page when it is short; a request is fully, partly or not resident; one fused
resolver per layer step looks each selected token up in a resident page, then in a hot row (GPU
LRU), and only then copies the row from host into a victim hot row; then the same sparse
attention kernel as the other designs runs on the physical rows.

Stages: ``resolve`` (``backends/kernels/connector_resolve.py``: resident -> hot -> host copy in
one kernel, no host sync, CUDA-graph capturable), ``attention`` (``backends.attention``).

Which pages are resident: ``backends/connector_residency.py`` (vLLM's residency order, the
facts followed and what is not modelled). Hot regions follow ``backends/hisparse_coordinator.py``
in token mode, exactly (the SGLang-style design's LRU in its default ``upstream`` order, newest
token in a reserved row, hot rows
after prefill = positions ``0 .. min(prompt, D) - 1``), with resident positions taking no part;
so ``resident_fraction=0`` gives that design's hits, misses and copied rows, and
``resident_fraction=1`` moves nothing and runs ``flashmla_sparse``'s attention on the same bytes.
The LRU order is vLLM's (and SGLang's, our coordinator's default ``lru_order=upstream``): misses
take victims in selection order, hits keep their previous LRU order. Known differences from
vLLM's kernel (``csrc/libtorch_stable/hisparse_kernels.cu``): vLLM's hot region starts empty
(ours as after SGLang's prefill), and it copies the misses in a second kernel on a copy stream.

Set-up (untimed): resident pages are copied from the workload's logical KV into the device
pool, spilled pages into the pinned host pool; the hot regions are initialised as after
prefill; ``begin_step`` writes the newest token where the design keeps it (its resident page,
already there, or the hot region's reserved row, from the host pool).
"""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from backends.attention import resolve_attention
from backends.base import Backend, BackendInvalid, ConfigError, KVLayout
from backends.connector_residency import (ConnectorLayout, connector_layout, k_pad,
                                         max_resident_pages, pages_of)
from backends.copy_engines import row_tile, word_view
from backends.host_memory import HOST_ALLOCS, HostRows, copy_pool_rows
from backends.hisparse_coordinator import checked_selections
from backends.kernels.connector_resolve import (CONNECTOR_COUNT_FIELDS, NUM_CONNECTOR_COUNTS,
                                                connector_resolve_kernel)
from backends.kernels.swap_in import MAX_TOP_K, ResolveLaunch, resolve_scratch_width

#: rows each resolver program copies per iteration (GPU; the interpreter pays per operation)
COPY_ROWS_GPU, COPY_ROWS_INTERPRETER = 32, 256


@dataclass
class HiSparseConnectorSettings:
    """``hisparse_connector.*``: the device page budget and the hot regions."""

    #: hot rows per (layer, request with a spilled page); None -> 2 * top_k (vLLM's default too)
    device_buffer_size: Optional[int] = None
    #: fraction of the point's KV pages the device pool holds (which ones: connector_residency)
    resident_fraction: float = 1.0
    #: the host pool's memory (backends/host_memory.py): pinned (cudaHostAlloc, torch's
    #: pin_memory) | registered (pageable + cudaHostRegister) | thp (2 MiB huge pages, registered)
    host_alloc: str = "pinned"

    def resolved(self, top_k: int) -> "HiSparseConnectorSettings":
        d = self.device_buffer_size if self.device_buffer_size is not None else 2 * top_k
        return dataclasses.replace(self, device_buffer_size=d)


def check_unique_selection(positions: np.ndarray, where: str) -> None:
    """The resolver's contract (vLLM's too): a row's valid positions are distinct. Raises
    BackendInvalid naming the first offending row. ``positions`` int ``[batch, top_k]``."""
    for b, row in enumerate(np.asarray(positions)):
        v = row[row >= 0]
        if np.unique(v).size != v.size:
            raise BackendInvalid(f"{where}: batch row {b} selects a position twice; the connector's "
                                 "resolver needs distinct positions per row (as vLLM's does)")


class HiSparseConnectorBackend(Backend):
    name = "hisparse_connector"
    settings = HiSparseConnectorSettings
    choices = {"host_alloc": HOST_ALLOCS}
    stages = ("resolve", "attention")
    columns = {"device_buffer_size": "Int64", "resident_fraction": "float64",
               "resident_page_share": "float64", "hot_requests": "Int64", "host_alloc": "string"}
    variant_axes = ("resident_fraction", "device_buffer_size", "host_alloc")

    device_kv = False

    # ---- declarations ---------------------------------------------------------------------
    @classmethod
    def capacity_bytes(cls, layout: KVLayout, settings: HiSparseConnectorSettings,
                       batch_size: int) -> Tuple[int, int]:
        return cls.footprint(batch_size, layout.max_positions, top_k=layout.top_k,
                             page_size=layout.page_size, row_bytes=layout.row_bytes,
                             num_layers=layout.num_layers, settings=settings)

    @classmethod
    def fit_to_budget(cls, layout: KVLayout, settings: HiSparseConnectorSettings, batch_size: int,
                      device_budget: int) -> HiSparseConnectorSettings:
        """The budget decides residency, as vLLM's pool does: the resident fraction that keeps
        the most pages on the GPU within ``device_budget`` (0 when not even that fits)."""
        f = cls.resident_fraction_within(device_budget, batch_size, layout.max_positions,
                                         top_k=layout.top_k, page_size=layout.page_size,
                                         row_bytes=layout.row_bytes, num_layers=layout.num_layers,
                                         settings=settings)
        return dataclasses.replace(settings, resident_fraction=0.0 if f is None else f)

    @classmethod
    def check(cls, settings: HiSparseConnectorSettings, *, top_k: int, page_size: int,
              phase: str = "decode") -> None:
        if phase != "decode":    # decode-only: other phases get the base class's invalid row
            return
        d, f = settings.device_buffer_size, settings.resident_fraction
        if top_k > MAX_TOP_K:
            raise ConfigError("top_k", top_k, f"must be <= {MAX_TOP_K} for hisparse_connector "
                              f"(its resolve's counters)")
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < top_k:
            raise ConfigError("hisparse_connector.device_buffer_size", d,
                              f"must be an integer >= top_k ({top_k}) (None: 2 * top_k)")
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
            raise ConfigError("hisparse_connector.resident_fraction", f,
                              "must be a number in [0, 1] (the fraction of the point's KV pages "
                              "the device pool holds)")

    @classmethod
    def layout(cls, max_positions: Sequence[int], *, top_k: int, page_size: int, row_bytes: int,
               num_layers: int, settings: HiSparseConnectorSettings) -> ConnectorLayout:
        """What the design allocates for requests reaching ``max_positions`` tokens: device and
        host bytes over ``num_layers`` layers (the constructor allocates exactly this)."""
        s = settings.resolved(top_k)
        cls.check(s, top_k=top_k, page_size=page_size)
        return connector_layout(max_positions, top_k=top_k, page_size=page_size,
                                row_bytes=row_bytes, num_layers=num_layers,
                                device_buffer_size=int(s.device_buffer_size),
                                resident_fraction=float(s.resident_fraction),
                                num_counts=NUM_CONNECTOR_COUNTS)

    @classmethod
    def footprint(cls, batch_size: int, max_positions: int, *, top_k: int, page_size: int,
                  row_bytes: int, num_layers: int,
                  settings: HiSparseConnectorSettings) -> Tuple[int, int]:
        """``(device_bytes, host_bytes)`` of ``batch_size`` requests of ``max_positions`` tokens
        (``batch_size=1``: what one request needs). Not linear in the batch: the residency plan
        spills whole requests first and pools are rounded to 64 rows."""
        lay = cls.layout([max_positions] * batch_size, top_k=top_k, page_size=page_size,
                         row_bytes=row_bytes, num_layers=num_layers, settings=settings)
        return lay.device_bytes, lay.host_bytes

    @classmethod
    def resident_fraction_within(cls, budget_bytes: int, batch_size: int, max_positions: int, *,
                                 top_k: int, page_size: int, row_bytes: int, num_layers: int,
                                 settings: HiSparseConnectorSettings) -> Optional[float]:
        """The ``resident_fraction`` at which ``batch_size`` requests of ``max_positions`` tokens
        keep the most pages resident with ``device_bytes`` within ``budget_bytes`` (the device
        budget decides residency, as vLLM's pool does); None when not even zero residency fits.
        ``settings.resident_fraction`` is ignored."""
        s = settings.resolved(top_k)
        cls.check(s, top_k=top_k, page_size=page_size)
        pos = [max_positions] * batch_size
        r = max_resident_pages(budget_bytes, pos, top_k=top_k, page_size=page_size,
                               row_bytes=row_bytes, num_layers=num_layers,
                               device_buffer_size=int(s.device_buffer_size),
                               num_counts=NUM_CONNECTOR_COUNTS)
        return None if r < 0 else r / int(pages_of(pos, page_size).sum())

    @classmethod
    def host_bytes_needed(cls, workload, settings) -> int:
        wl = workload
        return cls.layout(wl.seq_lens.max(axis=0), top_k=wl.top_k, page_size=wl.page_size,
                          row_bytes=wl.row_bytes, num_layers=wl.num_layers,
                          settings=settings).host_bytes

    # ---- set-up ---------------------------------------------------------------------------
    def __init__(self, workload, settings: HiSparseConnectorSettings, *,
                 attention_kernel: str = "triton"):
        wl = workload
        try:
            settings = settings.resolved(wl.top_k)
            self.check(settings, top_k=wl.top_k, page_size=wl.page_size)
        except ConfigError as e:
            raise BackendInvalid(str(e)) from e
        super().__init__(workload, settings, attention_kernel=attention_kernel)
        for where, positions, _ in checked_selections(wl):
            check_unique_selection(positions, where)
        self.D, self.P, self.K = int(settings.device_buffer_size), wl.page_size, wl.top_k
        self.lay = lay = self.layout(wl.seq_lens.max(axis=0), top_k=wl.top_k, page_size=wl.page_size,
                                     row_bytes=wl.row_bytes, num_layers=wl.num_layers,
                                     settings=settings)
        if lay.pool_rows >= 2 ** 31 or lay.host_rows >= 2 ** 31:
            raise BackendInvalid(f"the device pool ({lay.pool_rows} rows) or host pool "
                                 f"({lay.host_rows} rows) exceeds int32 row ids")
        self._allocate()
        self._fill_pools()
        m = wl.model
        self.attention = resolve_attention(attention_kernel, wl.device, m.num_heads, m.d_qk, m.d_v,
                                           self._kv(0))

    def _allocate(self) -> None:
        """Pools, tables (device page / host page / hot-state row per request) and hot state."""
        wl, lay, dev = self.wl, self.lay, self.wl.device
        B, L, D, K, rb = wl.batch_size, wl.num_layers, self.D, self.K, wl.row_bytes
        resident = lay.resident
        rng = np.random.default_rng([wl.seed, 7])
        self.residency_np = np.full(resident.shape, -1, dtype=np.int64)
        self.residency_np[resident] = rng.permutation(lay.resident_pages)
        spilled = (np.arange(resident.shape[1])[None, :] < lay.pages[:, None]) & ~resident
        self.host_np = np.full(resident.shape, -1, dtype=np.int64)
        self.host_np[spilled] = rng.permutation(int(spilled.sum()))
        hot = spilled.any(axis=1)
        self.hot_np = np.where(hot, np.cumsum(hot) - 1, -1)
        H = max(lay.hot_requests, 1)
        i32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(dev)  # noqa: E731
        self.residency = i32(self.residency_np)
        self.host_table = i32(self.host_np)
        self.hot_state = i32(self.hot_np)
        self.device_kv = torch.zeros((L, lay.pool_rows, rb), dtype=torch.uint8, device=dev)
        self._host_memory = HostRows((L, lay.host_rows, rb), self.cfg.host_alloc,
                                     dev.type == "cuda")
        self.host_kv = self._host_memory.tensor
        self.slot_pos = torch.full((L, H, D), -1, dtype=torch.int32, device=dev)
        self.lru = torch.arange(D, dtype=torch.int32, device=dev).repeat(L, H, 1)
        self.out = torch.full((L, B, K), -1, dtype=torch.int32, device=dev)
        self.counts = torch.zeros((L, B, NUM_CONNECTOR_COUNTS), dtype=torch.int64, device=dev)
        self.kpad = k_pad(K)
        self.plan = torch.zeros((H, 1 + 2 * K), dtype=torch.int32, device=dev)
        self.max_positions = int(lay.pages.max(initial=0)) * self.P   # the stamp table's size
        self.scratch = torch.zeros((H, resolve_scratch_width(self.kpad, D, self.max_positions, True)),
                                   dtype=torch.int32, device=dev)
        self.block_c, self.resolve_warps = ResolveLaunch().resolved(self.kpad, D, True)
        self._filled = np.zeros(B, dtype=np.int64)     # hot slots 0.. holding positions 0..
        self._layer_batch: Dict[int, int] = {}

    def _rows_of(self, b: int, positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(device rows, host rows) of request ``b``'s positions: -1 where the other tier holds
        the position."""
        P = self.P
        page, off = positions // P, positions % P
        dev = np.where(self.residency_np[b, page] >= 0, self.residency_np[b, page] * P + off, -1)
        host = np.where(self.host_np[b, page] >= 0, self.host_np[b, page] * P + off, -1)
        return dev, host

    def _fill_pools(self) -> None:
        """Copies every position of the batch from the workload's logical KV (``rows_by_position``:
        its device pool, or the seeded rows of a workload that keeps none) into its tier."""
        wl = self.wl
        to = lambda a: torch.from_numpy(a).to(wl.device)  # noqa: E731
        for b in range(wl.batch_size):
            n = min(int(self.lay.pages[b]) * self.P, wl.max_positions)
            d, h = self._rows_of(b, np.arange(n, dtype=np.int64))
            on_dev, on_host = np.flatnonzero(d >= 0), np.flatnonzero(h >= 0)
            for layer in range(wl.num_layers):
                rows = wl.rows_by_position(layer, b, n)
                if on_dev.size:
                    self.device_kv[layer].index_copy_(0, to(d[on_dev]), rows[to(on_dev)])
                if on_host.size:
                    copy_pool_rows(self.host_kv[layer], h[on_host], rows, on_host)

    def _load_rows(self, b: int, positions: np.ndarray, dst_rows: np.ndarray) -> None:
        """Every layer: device pool rows ``dst_rows`` <- the KV of request ``b``'s positions, read
        from the tier that holds each (set-up)."""
        d, h = self._rows_of(b, positions)
        to = lambda a: torch.from_numpy(a).to(self.wl.device)  # noqa: E731
        on_dev, on_host = d >= 0, h >= 0
        for layer in range(self.wl.num_layers):
            pool = self.device_kv[layer]
            if on_dev.any():
                pool[to(dst_rows[on_dev])] = pool[to(d[on_dev])]
            if on_host.any():
                copy_pool_rows(pool, dst_rows[on_host], self.host_kv[layer], h[on_host])

    def _hot_base(self, b: int) -> int:
        return self.lay.hot_base + int(self.hot_np[b]) * self.lay.hot_stride

    def _grow(self, b: int, upto: int) -> None:
        """Hot slots ``filled .. upto-1`` take positions ``filled .. upto-1`` (all layers)."""
        start = int(self._filled[b])
        if upto <= start:
            return
        p = np.arange(start, upto, dtype=np.int64)
        self._load_rows(b, p, self._hot_base(b) + p)
        h = int(self.hot_np[b])
        self.slot_pos[:, h, start:upto] = torch.arange(start, upto, dtype=torch.int32,
                                                       device=self.wl.device)
        self._filled[b] = upto

    def prefill(self) -> None:
        """Hot regions as after prefill: slots ``0 .. min(prompt, D) - 1`` hold those positions,
        LRU order = slot order (resident pages are in place since set-up)."""
        prompt = self.wl.seq_lens[0].astype(np.int64) - 1
        for b in np.nonzero(self.hot_np >= 0)[0]:
            h = int(self.hot_np[b])
            self.slot_pos[:, h].fill_(-1)
            self.lru[:, h].copy_(torch.arange(self.D, dtype=torch.int32, device=self.wl.device))
            self._filled[b] = 0
            self._grow(int(b), int(min(prompt[b], self.D)))

    def begin_step(self, step: int) -> None:
        """The newest token's KV write: a short request's hot region grows in position order; a
        long request's newest token goes to its resident page (there since set-up) or, when that
        page is spilled, to the hot region's reserved row (overwriting the previous newest)."""
        seq = self.wl.seq_lens[step].astype(np.int64)
        for b in np.nonzero(self.hot_np >= 0)[0]:
            b = int(b)
            self._grow(b, int(min(seq[b], self.D)))
            newest = seq[b] - 1
            if seq[b] > self.D and self.residency_np[b, newest // self.P] < 0:
                self._load_rows(b, np.array([newest]), np.array([self._hot_base(b) + self.D]))

    # ---- the timed call -------------------------------------------------------------------
    def _kv(self, layer: int) -> torch.Tensor:
        """The layer's device pool in the attention kernel's row format."""
        rows = self.device_kv[layer]
        return rows.view(torch.bfloat16) if self.wl.kv_dtype == "bf16" else rows

    def resolve(self, layer: int, seq_lens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One layer's fused resolver: int32 ``[B, top_k]`` rows of ``device_kv[layer]`` (-1
        stays -1), misses copied in. ``seq_lens`` int32/int64 ``[B]``, ``positions`` int32
        ``[B, top_k]`` (unit column stride). A view of a per-layer buffer; counts go to
        ``layer_counts(layer)``."""
        B = positions.shape[0]
        if positions.dtype != torch.int32 or positions.dim() != 2 or positions.shape[1] != self.K \
                or positions.stride(1) != 1 or B > self.wl.batch_size or seq_lens.shape != (B,):
            raise ValueError(f"positions must be int32 [batch <= {self.wl.batch_size}, "
                             f"top_k={self.K}] with unit column stride and seq_lens [batch], got "
                             f"{positions.dtype} {tuple(positions.shape)}, {tuple(seq_lens.shape)}")
        out, counts = self.out[layer, :B], self.counts[layer, :B]
        self._layer_batch[layer] = B
        dev_pool = word_view(self.device_kv[layer])
        host_pool = word_view(self.host_kv[layer]) if self.lay.host_rows else dev_pool
        cuda = self.wl.device.type == "cuda"
        connector_resolve_kernel[(B,)](
            seq_lens, positions, positions.stride(0),
            self.residency, self.residency.stride(0), self.host_table, self.host_table.stride(0),
            self.hot_state, self.slot_pos[layer], self.lru[layer],
            host_pool, dev_pool,
            out, out.stride(0), self.plan, self.plan.stride(0), counts, counts.stride(0),
            self.scratch, self.scratch.stride(0),
            self.K, self.D, self.lay.hot_base, self.lay.hot_stride, self.wl.row_bytes,
            self.max_positions, PAGE=self.P, K_PAD=self.kpad, BLOCK_C=self.block_c,
            **row_tile(dev_pool),
            COPY_ROWS=COPY_ROWS_GPU if cuda else COPY_ROWS_INTERPRETER,
            num_warps=self.resolve_warps)
        return out

    def decode_layer(self, step: int, layer: int, q: torch.Tensor, positions: Optional[torch.Tensor],
                     seq_lens: torch.Tensor, timer, slots: Optional[torch.Tensor] = None
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Takes logical positions (the resolver does the page translation itself)."""
        rows = timer.run("resolve", lambda: self.resolve(layer, seq_lens, positions))
        kv = self._kv(layer)
        return timer.run("attention", lambda: self.attention(q, kv, rows, self.wl.model.sm_scale,
                                                             d_v=self.wl.model.d_v))

    # ---- after the timed region -----------------------------------------------------------
    def layer_counts(self, layer: int) -> Dict[str, np.ndarray]:
        """Per request int64 ``[B]``: ``hits`` (resident + hot), ``resident_hits``, ``misses``,
        ``tokens_loaded`` (rows copied from host), ``pages_loaded`` (0: rows are copied one by
        one), ``bytes_h2d``."""
        B = self._layer_batch[layer]
        c = dict(zip(CONNECTOR_COUNT_FIELDS, self.counts[layer, :B].cpu().numpy().T.astype(np.int64)))
        return {"hits": c["resident_hits"] + c["hot_hits"], "resident_hits": c["resident_hits"],
                "misses": c["misses"], "tokens_loaded": c["tokens_loaded"],
                "pages_loaded": np.zeros(B, dtype=np.int64), "bytes_h2d": c["bytes_h2d"]}

    def working_set_bytes(self) -> int:
        """Device bytes this design holds: the pool (resident pages + hot regions) and its
        bookkeeping (no copy of the logical KV)."""
        return sum(t.numel() * t.element_size() for t in (
            self.device_kv, self.residency, self.host_table, self.hot_state, self.slot_pos,
            self.lru, self.out, self.counts, self.plan, self.scratch))

    def host_bytes(self) -> int:
        return self.host_kv.numel()

    def graph_capture_blocker(self) -> str:
        return ""

    def row_extras(self) -> Dict[str, object]:
        return {**self.settings_columns(self.cfg), "resident_page_share": self.lay.resident_page_share,
                "hot_requests": self.lay.hot_requests}

    def close(self) -> None:
        del self.device_kv, self.host_kv, self.slot_pos, self.lru
