"""``scenario=decode``: ``steps`` decode steps of ``batch_size`` requests, ``num_layers`` layers
each, on a workload that fits in device memory (the harness keeps the logical KV in a device pool,
which the vLLM-style path serves from and HiSparse copies to its pinned host pool at set-up).

Selections: synthetic patterns (``harness.selection``), a replayed trace, or the lightning indexer
inside the measured step (``selection=indexer``: stages ``indexer`` + ``topk`` = ``select``, the
top-k plan built once per step and reused by every layer). Every layer step's output is checked
against the float32 torch reference on the logical KV; indexer selections are checked by scores
against the reference logits (tie-robust).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch

from backends.base import ConfigError
from backends.indexer_select import IndexerSelector, positions_of_slots
from backends.indexer_select import STAGES as SELECT_STAGES
from harness.indexer_ref import FP8_QUERY_TOL, indexer_logits_paged_ref
from harness.memory import fits, free_bytes
from harness.scenarios.base import LayerInputs, LayerResult, Scenario
from harness.selection import PatternParams, Trace, synthesize
from harness.timing import StageTimer, TimingStats
from harness.workload import Workload, kv_pool_bytes, lse_error, relative_error, synthetic_seq_lens
from backends.kernels import kv_format


def load_trace(cfg) -> Trace:
    """The trace of ``selection.path``, checked against the config (ConfigError otherwise)."""
    path = cfg.selection.path
    try:
        tr = Trace.load(path)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError("selection.path", path, f"cannot read a trace there ({type(e).__name__}: {e}); "
                          "expected an .npz with topk [steps, layers, batch, top_k] and seq_lens [steps, batch]")
    check_trace(tr.topk, tr.seq_lens, cfg, path)
    return tr


def check_trace(topk: np.ndarray, seq_lens: np.ndarray, cfg, path: Optional[str] = None) -> None:
    """The trace must match the config's steps, num_layers, batch_size and top_k and hold
    valid positions."""
    where = f"selection.path={path!r}" if path else "selection"
    want = (cfg.steps, cfg.num_layers, cfg.batch_size, cfg.top_k)
    if topk.ndim != 4 or tuple(topk.shape) != want:
        raise ConfigError(where, tuple(topk.shape),
                          f"trace topk shape must be [steps, num_layers, batch_size, top_k] = {list(want)}; "
                          "set those keys to match the trace")
    if tuple(seq_lens.shape) != (cfg.steps, cfg.batch_size):
        raise ConfigError(where, tuple(seq_lens.shape),
                          f"trace seq_lens shape must be [steps, batch_size] = {[cfg.steps, cfg.batch_size]}")
    if (seq_lens < 1).any():
        raise ConfigError(where, int(seq_lens.min()), "trace seq_lens must be >= 1")
    over = topk >= seq_lens[:, None, :, None]
    if over.any() or (topk < -1).any():
        s, l, b, k = np.argwhere(over | (topk < -1))[0]
        raise ConfigError(where, int(topk[s, l, b, k]),
                          f"trace position at [step {s}, layer {l}, request {b}, {k}] must be -1 or "
                          f"< seq_len ({int(seq_lens[s, b])})")


def synthetic_selection(cfg, seq_lens: np.ndarray, num_layers: int, seed: int) -> np.ndarray:
    """int32 ``[steps, num_layers, batch, top_k]`` positions of the configured pattern."""
    sel = cfg.selection
    params = PatternParams(cfg.pattern, sel.cluster_len, sel.num_sinks, sel.window, sel.reuse_overlap,
                           sel.reuse_alpha, sel.layer_share)
    return synthesize(params, seq_lens, num_layers, cfg.top_k, cfg.step_overlap, seed)


def index_key_bytes(num_layers: int, batch_size: int, max_positions: int, index_dim: int) -> int:
    """Bytes of the lightning indexer's fp8 keys (index_dim + 4 B per token and layer): they stay
    on the GPU in every design."""
    return num_layers * batch_size * max_positions * (index_dim + 4)


def selection_columns(cfg) -> Dict[str, object]:
    """The selection's columns of a decode row."""
    src, sel = cfg.selection.source, cfg.selection
    calibrated = src == "synthetic" and cfg.pattern == "calibrated"
    row = {"pattern": cfg.pattern if src == "synthetic" else src, "selection": src,
           "step_overlap": None if calibrated else cfg.step_overlap,
           "cluster_len": sel.cluster_len if cfg.pattern in ("clustered", "mixed") else None}
    if calibrated:
        row.update(reuse_overlap=sel.reuse_overlap, reuse_alpha=sel.reuse_alpha, layer_share=sel.layer_share)
    if src == "indexer":
        row["fuse_topk"] = cfg.selection.fuse_topk
        row["query_corr"] = cfg.selection.query_corr
        row["query_dtype"] = cfg.selection.query_dtype
    return row


class DecodeSteps(Scenario):
    """The decode layer step of a built ``Workload`` (shared by ``decode`` and ``capacity``):
    inputs, the indexer inside the step, and the reference check. Subclasses build workloads."""

    phase = "decode"
    stages = SELECT_STAGES

    wl: Workload
    topk_dev: Optional[torch.Tensor]

    @classmethod
    def graphs_supported(cls) -> str:
        return ""

    @property
    def steps(self) -> int:
        return self.wl.steps

    @property
    def num_layers(self) -> int:
        return self.wl.num_layers

    @property
    def rows(self) -> int:
        return self.wl.batch_size

    @property
    def attention_row_bytes(self) -> int:
        return self.wl.row_bytes

    def selections(self) -> np.ndarray:
        return self.wl.seq_lens

    def open_backend(self, cls, settings, run):
        be = cls(self.wl, settings, attention_kernel=self.cfg.attention_kernel)
        sel = self.cfg.selection
        self.selector = (IndexerSelector(self.wl, sel.fuse_topk, sel.query_corr,
                                         query_dtype=sel.query_dtype)
                         if self.wl.topk is None else None)
        self.fused_slots = self.selector is not None and be.accepts_slots and self.cfg.selection.fuse_topk
        self.bad_selections = 0
        return be

    def begin_step(self, be, step: int) -> None:
        be.begin_step(step)
        self.seq_np = self.wl.seq_lens[step]
        self.seq_dev = torch.from_numpy(self.seq_np).to(self.device)
        if self.selector is not None:
            plan_timer = StageTimer(self.device, cold_l2=False, launch_shield_us=0)
            self.selector.begin_step(step, self.seq_dev, plan_timer)

    def layer_inputs(self, be, step: int, layer: int) -> LayerInputs:
        pos = None
        if self.selector is not None:
            self.selector.prepare(step, layer)
        else:
            pos = self.topk_dev[step, layer]
        return LayerInputs(step, layer, {"q": self.wl.q(step, layer), "positions": pos,
                                         "seq_lens": self.seq_dev})

    def run_layer(self, be, x: LayerInputs, timer) -> Tuple[torch.Tensor, torch.Tensor]:
        pos, slots = x.tensors["positions"], None
        if self.selector is not None:
            sel = self.selector.select(x.step, x.layer, x.tensors["seq_lens"], timer,
                                       want_slots=self.fused_slots)
            pos, slots = (None, sel) if self.fused_slots else (sel, None)
            x.extra["positions"], x.extra["slots"] = pos, slots
        return be.decode_layer(x.step, x.layer, x.tensors["q"], pos, x.tensors["seq_lens"], timer, slots=slots)

    def stage_times(self, t: Dict[str, float]) -> Dict[str, float]:
        if self.selector is not None:
            t["select"] = t.get("indexer", 0.0) + t.get("topk", 0.0)
        return t

    def served_positions(self, x: LayerInputs) -> torch.Tensor:
        """int32 ``[B, top_k]`` the positions the layer step served; an indexer selection is
        checked against the reference scores on the way (``check_error``)."""
        pos = x.tensors["positions"]
        if self.selector is not None:
            pos = x.extra["positions"]
            if pos is None:
                pos = positions_of_slots(self.wl, x.extra["slots"])
            self.bad_selections += self.check_indexer(x.layer, pos, self.seq_np)
        return pos

    def check_layer(self, be, x: LayerInputs, out, lse) -> LayerResult:
        pos = self.served_positions(x)
        ref_out, ref_lse = self.wl.reference(x.layer, x.tensors["q"], pos)
        return LayerResult(pos.cpu().numpy(), self.seq_np.astype(np.int64), relative_error(out, ref_out),
                           lse_error(lse, ref_lse))

    def check_error(self) -> Optional[str]:
        n = self.bad_selections
        return f"indexer top-k differs from the reference scores in {n} row(s)" if n else None

    def check_indexer(self, layer: int, positions: torch.Tensor, seq_lens: np.ndarray) -> int:
        """Rows whose selected scores differ from the reference top-k scores (0 when right):
        the reference logits at the selected positions, sorted, must equal the reference top-k."""
        sel = self.selector
        ref = indexer_logits_paged_ref(sel._q, sel._w, sel.caches[layer].data, self.wl.block_table,
                                       seq_lens, max_len=sel.max_len,
                                       query_dtype=sel.query_dtype).double()
        # fp8 queries: the kernel's logits carry the fp8 MMA's accumulation error, so two scores
        # closer than it may trade places at the k-th rank; bf16: exact to ~1e-7
        tol = FP8_QUERY_TOL if sel.query_dtype == "fp8" else 0.0
        k = self.wl.top_k
        bad = 0
        for b in range(positions.shape[0]):
            n = min(k, int(seq_lens[b]))
            p = positions[b]
            p = p[p >= 0].long()
            if p.numel() != n or p.unique().numel() != n:
                bad += 1
                continue
            got = ref[b, p].sort(descending=True).values
            want = ref[b, : int(seq_lens[b])].topk(n).values
            atol = max(1e-6, 2 * tol * float(ref[b, : int(seq_lens[b])].abs().max()))
            if not torch.allclose(got, want, rtol=1e-5, atol=atol):
                bad += 1
        return bad

    def backend_columns(self, be) -> Dict[str, object]:
        wl = self.wl
        row = {"working_set_bytes": be.working_set_bytes()
               + index_key_bytes(wl.num_layers, wl.batch_size, wl.max_positions, wl.model.index_dim),
               "host_bytes": be.host_bytes()}
        if self.selector is not None:
            row["stage_plan_us"] = TimingStats.of(self.selector.plan_us).median_us
            row["plan_builds_per_step"] = float(np.mean(self.selector.plan_builds))
        return row


class DecodeScenario(DecodeSteps):
    """Every backend at the configured batch on one shared workload."""

    name = "decode"

    def prepare(self) -> Optional[str]:
        cfg, dev = self.cfg, self.device
        trace = load_trace(cfg) if cfg.selection.source == "trace" else None
        seq_lens = (trace.seq_lens if trace is not None
                    else synthetic_seq_lens(cfg.context_len, cfg.steps, cfg.batch_size)).astype(np.int32)
        need = kv_pool_bytes(cfg.num_layers, seq_lens.shape[1], int(seq_lens.max()), cfg.page_size,
                             kv_format.row_bytes(cfg.kv_dtype, self.model.d_nope, self.model.d_rope))
        if not fits(need, dev):  # checked before any selection or allocation
            return (f"the KV pool of the simulated layers needs {need / 2**30:.1f} GiB; "
                    f"{free_bytes(dev) / 2**30:.1f} GiB are free on {dev.type}")
        if trace is not None:
            topk = trace.topk.astype(np.int32)
        elif cfg.selection.source == "indexer":  # selected inside the measured step
            topk = None
        else:
            topk = synthetic_selection(cfg, seq_lens, cfg.num_layers, cfg.seed)
        try:
            self.wl = Workload.build(model=self.model, device=dev, kv_dtype=cfg.kv_dtype,
                                     page_size=cfg.page_size, seq_lens=seq_lens, topk=topk,
                                     top_k=cfg.top_k, num_layers=cfg.num_layers, seed=cfg.seed,
                                     kv_scale_format=cfg.kv_scale_format)
        except (torch.OutOfMemoryError, MemoryError) as e:
            return f"KV pool ({need / 2**30:.1f} GiB) does not fit: {str(e).splitlines()[0]}"
        self.topk_dev = torch.from_numpy(topk).to(dev) if topk is not None else None
        return None

    def base_columns(self) -> Dict[str, object]:
        wl = getattr(self, "wl", None)  # None when the point did not fit
        ctx = int(wl.seq_lens[0].max() - 1) if wl is not None else self.cfg.context_len
        return {**super().base_columns(), **selection_columns(self.cfg), "context_len": ctx}

