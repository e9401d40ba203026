"""``scenario=capacity``: each design under an HBM budget, at the concurrency it can hold.

The regime offloading exists for. ``capacity.kv_budget_gb`` (default 50 GB: what is left per
H200 for KV when DeepSeek-V3.2's fp8 weights, ~690 GB, are spread over 8 GPUs of 141 GB) holds
the KV-related buffers of *all* ``model.layers`` layers; a run simulates ``num_layers`` of them,
so every design gets ``kv_budget_gb * num_layers / model.layers`` of device memory for its pools,
hot buffers and tables plus the index-key cache and block table every design keeps on the GPU
(HiSparse does not offload the indexer's keys). Host designs are also bounded by
``capacity.host_budget_gb`` (default: ``HOST_FRACTION`` of the host memory available, since
pinned memory cannot be paged out).

Per design the largest batch whose computed footprint (``Backend.capacity_bytes``: the
allocations the design makes, plus the shared index keys and block table) fits is its
``max_batch``; the design runs there, and at each of ``capacity.batch_sizes`` up to it. A
design allocates only what it keeps on the GPU: no device copy of the logical KV for the
offloading designs, whose host pools are filled request by request from the seeded logical KV
(``Workload.request_kv``, the same rows for every design).

Measured per run: the layer step (selection, the design's stages, attention) plus
``rest_of_layer``: the layer's non-attention GEMMs for the batch on this GPU
(``harness.rest_of_layer``; ``capacity.rest_of_layer=measured`` times them in the step,
``roofline`` adds the roofline estimate at the run's measured ceilings instead, labelled as
such in the ``rest_of_layer`` column, ``none`` leaves them out). Stages run in sequence as
measured (no overlap assumed). ``tpot_ms = model.layers * layer step``, ``tokens_per_s =
batch / tpot``. Attention heads per GPU are ``model.num_heads / capacity.tp_size`` (the MLA
latent KV is replicated over the TP group, so the per-GPU budget holds the same requests).

Memory is measured, not assumed: the device bytes the design allocated during set-up and the
peak during the timed steps (``torch.cuda.max_memory_allocated`` after a reset; on the CPU the
live tensor storages, sampled after every layer step) beyond the footprint plus the declared
workspace allowance make the row ``status=incorrect``. The reference check runs after the timed
steps on ``capacity.check_requests`` requests: their outputs are kept during the steps and
compared with the float32 reference over the logical KV regenerated from the seed, in scratch
memory outside the budget that is freed before the next run.
"""
from __future__ import annotations

import dataclasses
import gc
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from backends.base import ConfigError, KVLayout
from backends.kernels import kv_format
from backends.kernels.index_cache import IndexKeyCache, IndexKeyFormat, fp8_bytes_per_token
from harness import ceilings as ceilings_mod
from harness.memory import host_available_bytes
from harness.reference import sparse_mla_decode_on_slots_ref
from harness.rest_of_layer import TP_SIZES, WEIGHT_DTYPES, RestOfLayer, RestOfLayerPlan
from harness.scenarios.base import LayerInputs, LayerResult
from harness.scenarios.decode import DecodeSteps, selection_columns, synthetic_selection
from harness.workload import Workload, lse_error, relative_error, synthetic_seq_lens

#: ``capacity.rest_of_layer``: time the non-attention GEMMs, add their roofline, or leave them out
REST_MODES = ("measured", "roofline", "none")
#: default host budget: this fraction of the host memory available at the start of the point
HOST_FRACTION = 0.5
GB = 1e9


@dataclass
class CapacitySettings:
    """``capacity.*``: the memory budget, the parallel layout and the rest of the layer."""

    kv_budget_gb: float = 50.0            # HBM per GPU for the KV of all model.layers layers
    host_budget_gb: Optional[float] = None  # pinned host memory per GPU; None: HOST_FRACTION of available
    batch_sizes: List[int] = field(default_factory=list)  # also run each design at these batches
    check_requests: int = 4               # requests whose outputs are checked against the reference
    tp_size: int = 1                      # attention heads per GPU = model.num_heads / tp_size
    ep_size: int = 8                      # expert-parallel GPUs of the MoE (rest_of_layer)
    rest_of_layer: str = "measured"       # measured | roofline | none
    weight_dtype: str = "fp8"             # fp8 | bf16 weights of the rest of the layer
    workspace_fraction: float = 0.25      # declared workspace allowance: this fraction of the budget
    workspace_mb: float = 64.0            # ... plus this many MiB (kernel workspaces, selections)
    max_batch: int = 4096                 # largest batch the search considers


def _mb(n: int) -> str:
    return f"{n / 1e6:.4g} MB"


def index_cache_bytes(layout: KVLayout, batch: int, index_dim: int) -> int:
    """Device bytes of the fp8 index-key caches of every simulated layer (paged like the KV)."""
    from backends.base import pool_pages
    return (layout.num_layers * pool_pages(batch, layout.max_positions, layout.page_size)
            * layout.page_size * fp8_bytes_per_token(index_dim))


def shared_bytes(layout: KVLayout, batch: int, index_dim: int) -> int:
    """What every design keeps on the GPU besides its own buffers: the index keys and the int32
    block table ``[batch, pages_per_request]``."""
    return index_cache_bytes(layout, batch, index_dim) + batch * layout.pages_per_request * 4


def device_footprint(cls, settings, layout: KVLayout, batch: int, index_dim: int) -> Tuple[int, int]:
    """``(device, host)`` bytes of a design at ``batch``: its own allocations + the shared ones."""
    dev, host = cls.capacity_bytes(layout, settings, batch)
    return dev + shared_bytes(layout, batch, index_dim), host


def max_batch(footprint, device_budget: int, host_budget: int, cap: int) -> int:
    """Largest batch in ``[0, cap]`` whose ``footprint(batch) -> (device, host)`` bytes fit both
    budgets (footprints grow with the batch, so a bisection finds it)."""
    def fits(b: int) -> bool:
        d, h = footprint(b)
        return d <= device_budget and h <= host_budget
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


class MemoryMeter:
    """Device memory a run allocates: the CUDA allocator's counters on the GPU; on the CPU (where
    device and host memory are one) the bytes of the live unpinned tensor storages, found through
    the garbage collector and sampled, less the design's declared host pools."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def _live_cpu_bytes(self) -> int:
        seen, total = set(), 0
        with warnings.catch_warnings():  # touching every object trips deprecated module attributes
            warnings.simplefilter("ignore")
            for o in gc.get_objects():
                try:
                    if isinstance(o, torch.Tensor) and o.device.type == "cpu" and not o.is_pinned():
                        st = o.untyped_storage()
                        if st.data_ptr() not in seen:
                            seen.add(st.data_ptr())
                            total += st.nbytes()
                except (RuntimeError, ReferenceError):
                    continue
        return total

    def now(self) -> int:
        if self.cuda:
            return int(torch.cuda.memory_allocated(self.device))
        return self._live_cpu_bytes() - self.host_bytes

    def start(self, host_bytes: int = 0) -> int:
        """The baseline before a design is built; ``host_bytes``: its declared host pools (which
        the CPU cannot tell apart from device memory)."""
        self.host_bytes = 0
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        self.baseline = self.now()
        self.host_bytes = 0 if self.cuda else host_bytes
        return self.baseline

    def reset_peak(self) -> None:
        """Starts the peak of the timed steps (after set-up)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._peak = self.now()

    def sample(self) -> None:
        """CPU only: one more sample of the live bytes (the GPU's peak is exact)."""
        if not self.cuda:
            self._peak = max(self._peak, self._live_cpu_bytes())

    def peak(self) -> int:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        return self._peak


class CapacityScenario(DecodeSteps):
    """Every design at the batch its memory footprint allows under the budget."""

    name = "capacity"
    settings = CapacitySettings
    choices = {"rest_of_layer": REST_MODES, "weight_dtype": WEIGHT_DTYPES, "tp_size": TP_SIZES}
    stages = ("rest_of_layer",)
    columns = {
        "capacity_point": "string", "max_batch": "Int64", "kv_budget_gb": "float64",
        "device_budget_bytes": "Int64", "host_budget_bytes": "Int64",
        "footprint_device_bytes": "Int64", "footprint_host_bytes": "Int64",
        "device_bytes_per_request": "float64", "host_bytes_per_request": "float64",
        "setup_device_bytes": "Int64", "peak_device_bytes": "Int64", "workspace_allowance_bytes": "Int64",
        "tp_size": "Int64", "ep_size": "Int64", "attention_heads": "Int64", "attention_heads_computed": "Int64",
        "rest_of_layer": "string", "rest_weight_dtype": "string", "rest_weight_bytes": "Int64",
        "stage_rest_of_layer_roofline_us": "float64", "tpot_ms": "float64", "tokens_per_s": "float64",
    }

    @classmethod
    def check(cls, cfg) -> None:
        c = cfg.capacity
        if cfg.selection.source == "trace":
            raise ConfigError("selection", "trace", "scenario=capacity runs each design at its own batch: "
                              "use synthetic selections or selection=indexer")
        if not c.kv_budget_gb > 0:
            raise ConfigError("capacity.kv_budget_gb", c.kv_budget_gb, "must be > 0 (GB of HBM per GPU for KV)")
        if cfg.model.num_heads % c.tp_size:
            raise ConfigError("capacity.tp_size", c.tp_size,
                              f"must divide model.num_heads ({cfg.model.num_heads}); allowed {TP_SIZES}")
        if c.ep_size < 1 or cfg.model.n_routed_experts % c.ep_size or c.ep_size % c.tp_size:
            raise ConfigError("capacity.ep_size", c.ep_size,
                              f"must divide model.n_routed_experts ({cfg.model.n_routed_experts}) and be a "
                              f"multiple of capacity.tp_size ({c.tp_size})")
        if c.check_requests < 1:
            raise ConfigError("capacity.check_requests", c.check_requests, "must be an integer >= 1")
        if not 0.0 <= c.workspace_fraction <= 1.0:
            raise ConfigError("capacity.workspace_fraction", c.workspace_fraction, "must be a fraction in [0, 1]")
        if c.workspace_mb < 0:
            raise ConfigError("capacity.workspace_mb", c.workspace_mb, "must be >= 0 (MiB)")
        if c.max_batch < 1:
            raise ConfigError("capacity.max_batch", c.max_batch, "must be an integer >= 1")
        for b in c.batch_sizes:
            if not (isinstance(b, int) and b >= 1):
                raise ConfigError("capacity.batch_sizes", list(c.batch_sizes), "must be integers >= 1")
        if c.host_budget_gb is not None:
            avail = host_available_bytes()
            if not 0 < c.host_budget_gb * GB <= avail:
                raise ConfigError("capacity.host_budget_gb", c.host_budget_gb,
                                  f"must be > 0 and at most the host memory available "
                                  f"({avail / GB:.1f} GB): pinned memory cannot be paged out")

    def __init__(self, cfg, model, device: torch.device):
        c = cfg.capacity
        # attention heads per GPU under tensor parallelism (the latent KV is replicated)
        super().__init__(cfg, dataclasses.replace(model, num_heads=model.num_heads // c.tp_size), device)
        self.full_model = model
        self.c = c

    # ---- the point ------------------------------------------------------------------------

    def prepare(self) -> Optional[str]:
        cfg, c = self.cfg, self.c
        self.layout = KVLayout(cfg.num_layers, cfg.context_len + cfg.steps, cfg.page_size,
                               kv_format.row_bytes(cfg.kv_dtype, self.model.d_nope, self.model.d_rope), cfg.top_k)
        self.device_budget = int(c.kv_budget_gb * GB * cfg.num_layers / self.model.layers)
        self.host_budget = int(c.host_budget_gb * GB if c.host_budget_gb is not None
                               else HOST_FRACTION * host_available_bytes())
        self.allowance = int(c.workspace_fraction * self.device_budget + c.workspace_mb * 2**20)
        self.rest = None
        self.plan = RestOfLayerPlan(self.full_model, tp_size=c.tp_size, ep_size=c.ep_size,
                                    weight_dtype=c.weight_dtype)
        if c.rest_of_layer == "measured":  # one layer's weights, outside the KV budget
            try:
                self.rest = RestOfLayer(self.full_model, tp_size=c.tp_size, ep_size=c.ep_size,
                                        weight_dtype=c.weight_dtype, device=self.device, seed=cfg.seed)
            except (torch.OutOfMemoryError, MemoryError) as e:
                return f"the rest of the layer's weights do not fit: {str(e).splitlines()[0]}"
        self.ceilings = ceilings_mod.measure(self.device)
        self.meter = MemoryMeter(self.device)
        return None

    def runs(self, names) -> List[Tuple[str, Dict[str, object]]]:
        from harness.config import backend_settings
        out = []
        for name in names:
            cls, settings = backend_settings(self.cfg, name)
            if self.phase not in cls.phases:
                out.append((name, {}))  # the runner records why
                continue
            b_max = max_batch(lambda b: self.footprint_of(cls, settings, b), self.device_budget,
                              self.host_budget, self.c.max_batch)
            common = {"max_batch": b_max}
            if b_max == 0:
                d1, h1 = self.footprint_of(cls, settings, 1)
                out.append((name, {**common, "batch_size": 1, "capacity_point": "max", "status": "oom",
                                   "error": f"one request needs {_mb(d1)} of device memory and {_mb(h1)} of "
                                            f"host memory; the budget holds {_mb(self.device_budget)} device "
                                            f"(kv_budget_gb={self.c.kv_budget_gb} x {self.cfg.num_layers}/"
                                            f"{self.model.layers} layers), {_mb(self.host_budget)} host"}))
                continue
            out.append((name, {**common, "batch_size": b_max, "capacity_point": "max"}))
            for b in sorted(set(self.c.batch_sizes) - {b_max}):
                run = {**common, "batch_size": b, "capacity_point": "listed"}
                if b > b_max:
                    run.update(status="invalid", error=f"capacity.batch_sizes: batch {b} is above {name}'s "
                                                       f"maximum {b_max} under this budget")
                out.append((name, run))
        return out

    def footprint_of(self, cls, settings, batch: int) -> Tuple[int, int]:
        """``(device, host)`` bytes of design ``cls`` at ``batch`` under this point's budget."""
        return device_footprint(cls, self._fitted(cls, settings, batch), self.layout, batch,
                                self.model.index_dim)

    def _fitted(self, cls, settings, batch: int):
        """Settings adapted to the budget left at ``batch`` (``Backend.fit_to_budget``)."""
        return cls.fit_to_budget(self.layout, settings, batch,
                                 self.device_budget - shared_bytes(self.layout, batch, self.model.index_dim))

    def base_columns(self) -> Dict[str, object]:
        c = self.c
        return {**super().base_columns(), **selection_columns(self.cfg), "kv_budget_gb": c.kv_budget_gb,
                "tp_size": c.tp_size, "ep_size": c.ep_size, "attention_heads": self.model.num_heads,
                "rest_of_layer": c.rest_of_layer, "rest_weight_dtype": c.weight_dtype,
                "rest_weight_bytes": self.plan.weight_bytes(), "context_len": self.cfg.context_len}

    # ---- one run --------------------------------------------------------------------------

    def open_backend(self, cls, settings, run):
        cfg = self.cfg
        self.batch = int(run["batch_size"])
        self.footprint = self.footprint_of(cls, settings, self.batch)
        settings = self._fitted(cls, settings, self.batch)
        # the rest of the layer's step (a CUDA graph on the GPU): its memory is outside the budget
        self.rest_step = self.rest.prepare(self.batch) if self.rest is not None else None
        self.wl = self.topk_dev = self.selector = None  # the previous run's, if any
        self.setup_bytes = self.peak_bytes = None
        self.key_caches = []
        self.meter.start(host_bytes=self.footprint[1])
        seq_lens = synthetic_seq_lens(cfg.context_len, cfg.steps, self.batch)
        topk = (None if cfg.selection.source == "indexer"
                else synthetic_selection(cfg, seq_lens, cfg.num_layers, cfg.seed))
        self.wl = Workload.build(model=self.model, device=self.device, kv_dtype=cfg.kv_dtype,
                                 page_size=cfg.page_size, seq_lens=seq_lens, topk=topk, top_k=cfg.top_k,
                                 num_layers=cfg.num_layers, seed=cfg.seed,
                                 kv_scale_format=cfg.kv_scale_format,
                                 kv="per_request" if cls.device_kv else "none")
        self.topk_dev = torch.from_numpy(topk).to(self.device) if topk is not None else None
        be = super().open_backend(cls, settings, run)
        # the index keys every design keeps on the GPU (the indexer fills its own when it selects)
        self.key_caches = ([] if self.selector is not None else
                           [IndexKeyCache.allocate(self.wl.num_pages, cfg.page_size, self.model.index_dim,
                                                   IndexKeyFormat.FP8, self.device)
                            for _ in range(cfg.num_layers)])
        n = min(self.c.check_requests, self.batch)
        self.checked = np.unique(np.linspace(0, self.batch - 1, n).round().astype(np.int64))
        self.kept: List[Tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        return be

    def begin_step(self, be, step: int) -> None:
        if step == 0:  # set-up (prefill included) is done: what it left, and the steps' peak from here
            self.setup_bytes = self.meter.now() - self.meter.baseline
            self.meter.reset_peak()
        super().begin_step(be, step)

    def run_layer(self, be, x: LayerInputs, timer):
        out = super().run_layer(be, x, timer)
        if self.rest_step is not None:
            timer.run("rest_of_layer", self.rest_step)
        return out

    def check_layer(self, be, x: LayerInputs, out, lse) -> LayerResult:
        """Keeps the checked requests' outputs (the reference runs after the timed steps)."""
        pos = self.served_positions(x)
        idx = torch.from_numpy(self.checked).to(out.device)
        self.kept.append((x.layer, x.tensors["q"][idx].clone(), pos[idx].clone(), out[idx].clone(),
                          lse[idx].clone()))
        self.meter.sample()
        return LayerResult(pos.cpu().numpy(), self.seq_np.astype(np.int64), 0.0, 0.0)

    def final_check(self, be) -> Tuple[float, float]:
        self.peak_bytes = self.meter.peak() - self.meter.baseline
        m, wl = self.model, self.wl
        max_err = max_lse = 0.0
        by_layer: Dict[int, List] = {}
        for item in self.kept:
            by_layer.setdefault(item[0], []).append(item[1:])
        for layer, items in by_layer.items():
            for j, r in enumerate(self.checked.tolist()):
                rows = wl.request_kv(layer, r)  # scratch: the logical KV of one request
                for q, pos, out, lse in items:
                    ref_out, ref_lse = sparse_mla_decode_on_slots_ref(q[j: j + 1], rows, pos[j: j + 1],
                                                                      m.sm_scale, d_v=m.d_v)
                    max_err = max(max_err, relative_error(out[j: j + 1], ref_out))
                    max_lse = max(max_lse, lse_error(lse[j: j + 1], ref_lse))
                del rows
        self.kept = []
        return max_err, max_lse

    def check_error(self) -> Optional[str]:
        bad = [e for e in (super().check_error(),) if e]
        limit = self.footprint[0] + self.allowance
        for what, used in (("set-up", self.setup_bytes), ("the timed steps' peak", self.peak_bytes)):
            if used is not None and used > limit:
                bad.append(f"{what} allocated {used / GB:.3f} GB of device memory: more than the computed "
                           f"footprint {self.footprint[0] / GB:.3f} GB + workspace allowance "
                           f"{self.allowance / GB:.3f} GB")
        return "; ".join(bad) or None

    def backend_columns(self, be) -> Dict[str, object]:
        row = super().backend_columns(be)
        self.key_caches = []
        dev, host = self.footprint
        from backends.attention import heads_computed
        row.update(batch_size=self.batch, device_budget_bytes=self.device_budget, host_budget_bytes=self.host_budget,
                   footprint_device_bytes=dev, footprint_host_bytes=host,
                   device_bytes_per_request=dev / self.batch, host_bytes_per_request=host / self.batch,
                   setup_device_bytes=getattr(self, "setup_bytes", None),
                   peak_device_bytes=getattr(self, "peak_bytes", None),
                   workspace_allowance_bytes=self.allowance,
                   attention_heads_computed=heads_computed(self.cfg.attention_kernel, self.model.num_heads,
                                                                   self.cfg.kv_dtype))
        return row

    def derived_columns(self, row: Dict[str, object]) -> Dict[str, object]:
        """Time per output token over every layer of the model, and tokens/s at the run's batch."""
        step = row.get("latency_us_median")
        if step is None or not np.isfinite(step):
            return {}
        out: Dict[str, object] = {}
        if self.c.rest_of_layer == "roofline":
            ce = self.ceilings
            rest = self.plan.roofline_us(self.batch, ce.hbm_gbps, ce.bf16_tflops)
            out["stage_rest_of_layer_roofline_us"] = rest
            step = step + rest
        tpot_ms = self.model.layers * step / 1e3
        out.update(tpot_ms=tpot_ms, tokens_per_s=self.batch / (tpot_ms / 1e3))
        return out
