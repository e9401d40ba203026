"""SGLang-HiSparse style: the KV lives in pinned host memory; each (layer, request) keeps a hot
buffer of ``device_buffer_size`` slots on the GPU; the coordinator turns each layer's top-k
positions into loads of the missing KV (swap-in, per token as upstream or per page) and hands
attention a table of device slots. Attention is the same kernel as the vLLM-style backend.

Stages: ``swap_in`` (hit/miss resolution + host -> device copy), ``attention``.
``coordinator=sglang`` runs the swap-in stage through SGLang's own kernel
(``backends/kernels/sglang_peer.py``) on the same pools instead of ours: token mode, and the
kernel's own zero-copy loads (our ``uva_kernel`` mechanism) only. The selection goes to the kernel
as it is, as SGLang passes it the indexer's top-k; it is checked against the kernel's contract
(``selection_contract_error``) before any kernel runs when known up front (synthetic, trace), else
after each timed layer (indexer), and a violation makes the row ``invalid``.
Set-up (outside timing): the host pool is filled with the workload's logical KV, the hot
buffers are initialised as after prefill, and each step's newest token is written to the
reserved slot (the KV write both designs do).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from backends.attention import resolve_attention
from backends.base import COUNT_KEYS, Backend, BackendInvalid, BackendUnavailable, ConfigError, KVLayout
from backends.copy_engines import COPY_ENGINES
from backends.host_memory import HOST_ALLOCS
from backends.hisparse_coordinator import (DEFAULT_HOST_ALLOC, HOST_PAGE_ORDERS,
                                           LOAD_GRANULARITIES, LRU_ORDERS, HiSparseCoordinator,
                                           checked_selections)
from backends.kernels.swap_in import RESOLVE_KERNELS, ResolveLaunch
from backends.kernels.swap_in_cuda import cuda_resolve_shape, cuda_resolve_unavailable

#: swap-in implementations: ours, or SGLang's own kernel
COORDINATORS = ("triton", "sglang")
#: our coordinator's resolve: ``auto`` (CUDA where it can run, else Triton), or either one
RESOLVE_KERNEL_CHOICES = ("auto",) + RESOLVE_KERNELS
#: the reason an extend point has no HiSparse row
EXTEND_UNSUPPORTED = ("phase=extend: HiSparse is decode-only upstream (SGLang prefills with the KV "
                      "on the GPU and stages it to host afterwards; the swap-in coordinator serves "
                      "decode steps), so there is no HiSparse extend path to measure")


@dataclass
class HiSparseSettings:
    """``hisparse.*``: the hot buffer and how misses are loaded."""

    device_buffer_size: Optional[int] = None  # hot-buffer slots per (layer, request); None -> 2 * top_k
    load_granularity: str = "token"            # token (upstream) | page (the seed article's design)
    copy_engine: str = "uva_kernel"            # uva_kernel | memcpy | staged
    coordinator: str = "triton"                # triton (ours) | sglang (upstream swap-in kernel)
    lru_order: str = "upstream"                # upstream (SGLang's order) | position (ascending)
    host_alloc: str = DEFAULT_HOST_ALLOC       # registered (SGLang's) | pinned | thp (huge pages) | hugetlb_2m | hugetlb_1g (reserved huge pages)
    host_page_order: str = "shuffled"          # shuffled (long-running) | sequential (fresh pool)
    resolve_kernel: str = "auto"               # auto | triton | cuda: our coordinator's resolve

    def resolved(self, top_k: int) -> "HiSparseSettings":
        d = self.device_buffer_size if self.device_buffer_size is not None else 2 * top_k
        return dataclasses.replace(self, device_buffer_size=int(d))


def hot_units(settings: HiSparseSettings, page_size: int) -> int:
    """Units the LRU manages per hot buffer: slots (token mode) or pages (page mode)."""
    unit = page_size if settings.load_granularity == "page" else 1
    return settings.device_buffer_size // unit


def make_sglang_peer(coord: HiSparseCoordinator):
    """SGLang's swap-in kernel over ``coord``'s pools (built from the staged sglang sources
    when needed). Raises BackendUnavailable (no GPU, not built and no nvcc) or BackendInvalid
    (a configuration upstream's kernel does not support)."""
    from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported
    from backends.kernels.sglang_peer import SGLangHiSparsePeer
    try:
        return SGLangHiSparsePeer(coord)
    except PeerUnsupported as e:
        raise BackendInvalid(f"coordinator=sglang: {e}") from e
    except PeerUnavailable as e:
        raise BackendUnavailable(f"coordinator=sglang: {e}") from e


class HiSparseBackend(Backend):
    name = "hisparse"
    settings = HiSparseSettings
    choices = {"load_granularity": LOAD_GRANULARITIES, "copy_engine": COPY_ENGINES,
               "coordinator": COORDINATORS, "lru_order": LRU_ORDERS, "host_alloc": HOST_ALLOCS,
               "host_page_order": HOST_PAGE_ORDERS, "resolve_kernel": RESOLVE_KERNEL_CHOICES}
    stages = ("swap_in", "attention")
    columns = {"device_buffer_size": "Int64", "load_granularity": "string", "copy_engine": "string",
               "coordinator": "string", "lru_order": "string", "host_alloc": "string",
               "host_page_order": "string", "resolve_kernel": "string"}
    variant_axes = ("device_buffer_size", "load_granularity", "copy_engine", "coordinator",
                    "lru_order", "host_alloc", "host_page_order", "resolve_kernel")

    @classmethod
    def check(cls, settings: HiSparseSettings, *, top_k: int, page_size: int, phase: str) -> None:
        if phase != "decode":
            return
        d = settings.device_buffer_size
        if d < top_k:
            raise ConfigError("hisparse.device_buffer_size", d, f"must be >= top_k ({top_k})")
        if settings.load_granularity == "page" and d % page_size:
            raise ConfigError("hisparse.device_buffer_size", d,
                              f"must be a multiple of page_size ({page_size}) when load_granularity=page")
        if settings.resolve_kernel == "cuda":
            if settings.lru_order != "upstream":
                raise ConfigError("hisparse.resolve_kernel", "cuda",
                                  "needs hisparse.lru_order=upstream (the CUDA resolve keeps "
                                  "SGLang's order only)")
            if settings.coordinator != "triton":
                raise ConfigError("hisparse.resolve_kernel", "cuda",
                                  "is our coordinator's resolve: needs hisparse.coordinator=triton")
            try:
                cuda_resolve_shape(top_k, hot_units(settings, page_size))
            except ValueError as e:
                raise ConfigError("hisparse.resolve_kernel", "cuda", str(e)) from e

    @classmethod
    def unsupported(cls, phase: str) -> str:
        return EXTEND_UNSUPPORTED if phase == "extend" else super().unsupported(phase)

    device_kv = False

    @classmethod
    def capacity_bytes(cls, layout: KVLayout, settings: HiSparseSettings, batch_size: int) -> Tuple[int, int]:
        """The coordinator's allocations: hot buffers + reserved pages and bookkeeping on the
        device, the KV pool of every simulated layer pinned on the host."""
        return HiSparseCoordinator.footprint_of(
            num_layers=layout.num_layers, max_requests=batch_size, max_seq_len=layout.max_positions,
            row_bytes=layout.row_bytes, top_k=layout.top_k, device_buffer_size=settings.device_buffer_size,
            page_size=layout.page_size, load_granularity=settings.load_granularity,
            copy_engine=settings.copy_engine, lru_order=settings.lru_order,
            host_alloc=settings.host_alloc)

    def __init__(self, workload, settings: HiSparseSettings, *, attention_kernel: str = "triton"):
        super().__init__(workload, settings, attention_kernel=attention_kernel)
        wl = workload
        self.buffer_size = settings.device_buffer_size
        self.granularity = settings.load_granularity
        self.engine = settings.copy_engine
        self.coordinator = settings.coordinator
        if self.coordinator == "sglang" and (self.granularity != "token" or self.engine != "uva_kernel"):
            raise BackendInvalid(
                "coordinator=sglang runs SGLang's swap-in kernel, which loads tokens (not pages) with "
                "its own zero-copy reads: it needs hisparse.load_granularity=token and "
                f"hisparse.copy_engine=uva_kernel (got {self.granularity}, {self.engine})")
        self.resolve_kernel = self._resolve_kernel(settings)
        launch = ResolveLaunch(kernel=self.resolve_kernel if self.resolve_kernel != "none"
                               else "triton")
        try:
            self.coord = HiSparseCoordinator(
                num_layers=wl.num_layers, max_requests=wl.batch_size, max_seq_len=wl.max_positions,
                row_bytes=wl.row_bytes, top_k=wl.top_k, device_buffer_size=self.buffer_size,
                page_size=wl.page_size, load_granularity=self.granularity, copy_engine=self.engine,
                lru_order=settings.lru_order, resolve_launch=launch,
                host_alloc=settings.host_alloc, host_page_order=settings.host_page_order,
                device=wl.device, seed=wl.seed)
        except ValueError as e:
            raise BackendInvalid(str(e)) from e
        if wl.topk is not None:
            self._check_selections()
        for layer in range(wl.num_layers):
            for req in range(wl.batch_size):
                self.coord.load_host_kv(layer, req, wl.rows_by_position(layer, req, wl.max_positions))
        self.req_idx = wl.request_ids()
        self.peer = make_sglang_peer(self.coord) if self.coordinator == "sglang" else None
        self._peer_counts: Dict[int, Dict[str, torch.Tensor]] = {}
        m = wl.model
        self.attention = resolve_attention(attention_kernel, wl.device, m.num_heads, m.d_qk, m.d_v,
                                           self._kv(0))

    def _resolve_kernel(self, settings: HiSparseSettings) -> str:
        """The resolve our coordinator runs: ``settings.resolve_kernel``, ``auto`` resolved
        (the CUDA one where it can run: a CUDA device, the upstream order, a shape that fits,
        the library built or buildable; else Triton); ``none`` when SGLang's kernel serves the
        swap-in. BackendUnavailable when ``cuda`` was asked for and cannot run here."""
        if self.coordinator == "sglang":
            return "none"
        want = settings.resolve_kernel
        if want == "triton" or (want == "auto" and settings.lru_order != "upstream"):
            return "triton"
        why = cuda_resolve_unavailable(self.wl.device, self.wl.top_k,
                                       hot_units(settings, self.wl.page_size))
        if not why:
            return "cuda"
        if want == "cuda":
            raise BackendUnavailable(f"hisparse.resolve_kernel=cuda: {why}")
        return "triton"

    def row_extras(self) -> Dict[str, object]:
        """The settings' columns, ``resolve_kernel`` as it ran (``auto`` resolved)."""
        return dict(super().row_extras(), resolve_kernel=self.resolve_kernel)

    def _check_selections(self) -> None:
        """Positions < seq_len, and (page mode) no step selecting more pages than the buffer
        holds: both known before any kernel runs for synthetic and traced selections."""
        for where, positions, seq_lens in checked_selections(self.wl):
            err = self.coord.overflow_error(positions, seq_lens)
            if err is not None:
                raise BackendInvalid(f"{where}: {err}")
            if self.coordinator == "sglang":
                self._check_contract(where, positions, seq_lens)

    def _check_contract(self, where: str, positions: np.ndarray, seq_lens: np.ndarray) -> None:
        from backends.kernels.sglang_peer import selection_contract_error
        err = selection_contract_error(positions, seq_lens, self.buffer_size)
        if err is not None:
            raise BackendInvalid(f"{where}: coordinator=sglang: the selection breaks the upstream "
                                 f"kernel's contract: {err}")

    def _kv(self, layer: int) -> torch.Tensor:
        """The layer's device pool in the attention kernel's row format."""
        rows = self.coord.device_pool(layer)
        return rows.view(torch.bfloat16) if self.wl.kv_dtype == "bf16" else rows

    def prefill(self) -> None:
        prompt = (self.wl.seq_lens[0] - 1).astype(np.int64)
        reqs = np.arange(self.wl.batch_size)
        self.coord.prefill(reqs, prompt)
        if self.peer is not None:
            self.peer.prefill(reqs)

    def begin_step(self, step: int) -> None:
        reqs, seq = np.arange(self.wl.batch_size), self.wl.seq_lens[step].astype(np.int64)
        self.coord.begin_step(reqs, seq)
        if self.peer is not None:
            self.peer.begin_step(reqs, seq)

    def _swap_in(self, seq_lens: torch.Tensor, positions: torch.Tensor, layer: int) -> torch.Tensor:
        if self.peer is None:
            return self.coord.swap_in_selected_pages(self.req_idx, seq_lens, positions, layer)
        slots = self.peer.swap_in_direct(self.req_idx, seq_lens, positions, layer)
        # per layer (graphs replay them): counts, and what was selected (contract check)
        self._peer_counts[layer] = dict(self.peer.last_counts(), positions=positions, seq_lens=seq_lens)
        return slots

    def decode_layer(self, step: int, layer: int, q: torch.Tensor, positions: Optional[torch.Tensor],
                     seq_lens: torch.Tensor, timer,
                     slots: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Takes logical positions (HiSparse always runs the unfused top-k, as upstream)."""
        slots = timer.run("swap_in", lambda: self._swap_in(seq_lens, positions, layer))
        kv = self._kv(layer)
        return timer.run("attention", lambda: self.attention(q, kv, slots, self.wl.model.sm_scale,
                                                             d_v=self.wl.model.d_v))

    def layer_counts(self, layer: int) -> Dict[str, np.ndarray]:
        if self.peer is not None:
            c = {k: v.cpu().numpy().astype(np.int64) for k, v in self._peer_counts[layer].items()}
            positions, seq_lens = c.pop("positions"), c.pop("seq_lens")
            if self.wl.topk is None:  # selected inside the step (indexer): not checked up front
                self._check_contract(f"layer {layer}", positions, seq_lens)
            return {"pages_loaded": np.zeros_like(c["misses"]), **c}
        c = {k: v.cpu().numpy().astype(np.int64) for k, v in self.coord.layer_counts(layer).items()}
        if c["overflow"].any():  # selections not known up front (indexer) can still overflow
            b = int(np.argmax(c["pages_needed"]))
            raise BackendInvalid(f"layer {layer}: page-mode overflow: batch row {b} needs "
                                 f"{int(c['pages_needed'][b])} pages, capacity {self.coord.page_capacity}")
        return {k: c[k] for k in COUNT_KEYS if k in c}

    def graph_capture_blocker(self) -> str:
        if self.engine != "uva_kernel":
            return (f"copy_engine={self.engine} reads the miss list on the host (a sync), so it cannot "
                    "be captured in a CUDA graph; use copy_engine=uva_kernel or timing.cuda_graph=false")
        return ""

    def working_set_bytes(self) -> int:
        return self.coord.device_working_set_bytes() + self.coord.device_metadata_bytes()

    def host_bytes(self) -> int:
        return self.coord.host_bytes()

    def close(self) -> None:
        self.peer = None
        del self.coord
