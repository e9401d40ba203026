"""The one point loop: runs one configuration point through every requested backend.

The point's scenario (``harness.scenarios``) builds the workload (untimed); then, per backend:
set-up (untimed), ``prefill``, and the scenario's steps, each running ``num_layers`` layer steps.
Every layer step is timed stage by stage (``harness.timing.StageTimer``, L2 flushed before each
layer step by default, or replayed from a CUDA graph with ``timing.cuda_graph``), checked against
the scenario's reference (untimed; beyond tolerance -> ``status=incorrect``) and counted. Warm-up
steps are run and checked but excluded from the numbers. Rows: ``harness.results``.
"""
from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from omegaconf import OmegaConf

from backends.base import BackendInvalid, BackendUnavailable
from harness import ceilings as ceilings_mod
from harness import env, progress, results
from harness.clocks import ClockMonitor
from harness.config import ModelConfig, backend_settings
from harness.memory import fits, host_available_bytes
from harness.scenarios import scenario_class
from harness.scenarios.base import LayerInputs, Scenario
from harness.selection import Trace, distinct_counts
from backends.base import COUNT_KEYS
from harness.summary import add_counts, correctness, empty_sums, summarize
from harness.timing import HostTranslationFlusher, StageTimer, UntimedStages, WallClock, is_cuda
from harness.validate import backends_of

log = logging.getLogger("harness")

#: stage names; each has a ``stage_<name>_us`` column in both tables (harness.results)
STAGES = results.STAGES


def point_columns(cfg, device: torch.device, repro: str, cfg_hash: str) -> Dict:
    """The columns every row of this point shares (parameters, ceilings, provenance)."""
    from backends.kernels.kv_format import row_bytes
    row = {
        "schema_version": results.SCHEMA_VERSION,
        "attention_kernel": cfg.attention_kernel,
        "model": cfg.model.name,
        "kv_dtype": cfg.kv_dtype,
        "kv_scale_format": cfg.kv_scale_format,
        "kv_row_bytes": row_bytes(cfg.kv_dtype, cfg.model.d_nope, cfg.model.d_rope),
        "page_size": cfg.page_size, "top_k": cfg.top_k, "batch_size": cfg.batch_size,
        "context_len": cfg.context_len,
        "steps": cfg.steps, "warmup_steps": cfg.timing.warmup_steps, "num_layers": cfg.num_layers,
        "seed": cfg.seed, "cold_l2": cfg.timing.cold_l2,
        "cold_host_translations": cfg.timing.cold_host_translations,
        "cuda_graph": cfg.timing.cuda_graph,
        "device": device.type, "tolerance": cfg.timing.check_tolerance,
        "repro_command": repro, "config_hash": cfg_hash, "timestamp": env.timestamp(),
    }
    row.update(ceilings_mod.measure(device).as_columns())
    row.update(env.provenance(str(device)))
    return row


def _failed(cfg, name: str, status: str, err: str) -> Dict:
    """A row for a backend that did not run; it still records the backend's settings."""
    cls, settings = backend_settings(cfg, name)
    return {"backend": name, **cls.settings_columns(settings), "status": status, "error": err}


class LayerGraphs:
    """``timing.cuda_graph``: one CUDA graph per layer, captured at its first use with static
    input buffers and replayed for every later step (inputs copied in untimed), as serving
    engines replay decode graphs. Stages cannot be timed inside a graph: only the total."""

    def __init__(self, scenario: Scenario, be):
        self.scenario, self.be = scenario, be
        self.graphs: Dict[int, tuple] = {}

    def replay(self, x: LayerInputs, timer: StageTimer):
        if x.layer not in self.graphs:
            static = LayerInputs(x.step, x.layer, {k: (v.clone() if v is not None else None)
                                                   for k, v in x.tensors.items()}, dict(x.extra))
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                outs = self.scenario.run_layer(self.be, static, UntimedStages())
            self.graphs[x.layer] = (g, static, outs)
        g, static, (out, lse) = self.graphs[x.layer]
        for k, v in x.tensors.items():
            if v is not None:
                static.tensors[k].copy_(v)
        timer.begin()
        timer.run("graph", g.replay)
        t = timer.end()
        del t["graph"]
        return out, lse, t


def run_backend(scn: Scenario, cfg, name: str, run: Dict) -> Tuple[Dict, List[Dict], Optional[np.ndarray]]:
    """Runs every step and layer of one run of the point (``Scenario.runs``) through a backend.

    Returns ``(row, step_rows, record)``: the backend's row (without the point's columns), one
    row per (step, layer, request), and the positions served int32 ``[steps, layers, rows,
    top_k]`` (None when the backend did not run)."""
    cls, settings = backend_settings(cfg, name)
    cols = {k: v for k, v in run.items() if k not in ("status", "error")}
    failed = lambda status, err: ({"backend": name, **cls.settings_columns(settings), **cols,  # noqa: E731
                                   "status": status, "error": err}, [], None)
    if "status" in run:
        return failed(run["status"], run["error"])
    if scn.phase not in cls.phases:
        return failed("invalid", cls.unsupported(scn.phase))
    if cfg.timing.cuda_graph and scn.graphs_supported():
        return failed("invalid", scn.graphs_supported())
    host_flush = None
    if cfg.timing.cold_host_translations and is_cuda(scn.device):
        try:
            host_flush = HostTranslationFlusher.shared(str(scn.device))
        except (RuntimeError, MemoryError, OSError) as e:
            return failed("oom", "timing.cold_host_translations: the flush's 4 GiB page-locked "
                          f"host buffer could not be allocated: {str(e).splitlines()[0]}")
    timer = StageTimer(scn.device, cold_l2=cfg.timing.cold_l2,
                       launch_shield_us=cfg.timing.launch_shield_us, host_flush=host_flush)
    wall = WallClock(scn.device)
    try:
        be = scn.open_backend(cls, settings, run)
    except BackendInvalid as e:
        return failed("invalid", str(e))
    except BackendUnavailable as e:
        return failed("unavailable", str(e))
    except (torch.OutOfMemoryError, MemoryError) as e:
        return failed("oom", f"set-up does not fit: {str(e).splitlines()[0]}")
    row: Dict = {"backend": name, **be.row_extras(), **cols}
    if cfg.timing.cuda_graph and be.graph_capture_blocker():
        reason = be.graph_capture_blocker()
        scn.close_backend(be)
        return {**row, "status": "invalid", "error": reason}, [], None
    graphs = LayerGraphs(scn, be) if cfg.timing.cuda_graph else None
    rows, top_k = scn.record_shape()
    record = np.full((scn.steps, scn.num_layers, rows, top_k), -1, dtype=np.int32)
    step_rows: List[Dict] = []
    samples: List[Dict[str, float]] = []
    max_err, max_lse = 0.0, 0.0
    sums = empty_sums()
    clocks = ClockMonitor(scn.device)
    try:
        be.prefill()
        wall.lap("setup_s")
        for s in progress.steps(scn.steps, name, cols):
            warm = s < cfg.timing.warmup_steps
            scn.begin_step(be, s)
            for layer in range(scn.num_layers):
                x = scn.layer_inputs(be, s, layer)
                if graphs is not None and s > 0:  # step 0 runs eagerly: compiles and warms up
                    out, lse, t = graphs.replay(x, timer)
                else:
                    timer.begin()
                    out, lse = scn.run_layer(be, x, timer)
                    t = scn.stage_times(timer.end())
                counts = be.layer_counts(layer)
                res = scn.check_layer(be, x, out, lse)
                max_err, max_lse = max(max_err, res.max_rel_err), max(max_lse, res.max_lse_err)
                record[s, layer] = res.positions
                tok, pages = distinct_counts(res.positions, cfg.page_size)
                stage_cols = {f"stage_{k}_us": v for k, v in t.items() if k in STAGES}
                for b in range(rows):
                    r = {"backend": name, "step": s, "layer": layer, "request": b, "warmup": warm,
                         "seq_len": int(res.seq_lens[b]), "tokens_selected": int(tok[b]),
                         "pages_touched": int(pages[b]), "latency_us": t["total"], **stage_cols}
                    r.update({k: int(v[b]) for k, v in counts.items() if k in COUNT_KEYS})
                    step_rows.append(r)
                if not warm:
                    clocks.sample()
                    samples.append(t)
                    sums["tokens_selected"] += int(tok.sum())
                    sums["pages_touched"] += int(pages.sum())
                    add_counts(sums, counts)
            wall.lap("first_step_s" if s == 0 else "later_steps_s")
        deferred = scn.final_check(be)
        wall.lap("final_check_s")
        if deferred is not None:
            max_err, max_lse = deferred
    except BackendInvalid as e:
        return {**row, "status": "invalid", "error": str(e)}, step_rows, None
    except (torch.OutOfMemoryError, MemoryError) as e:
        return ({**row, "status": "oom", "error": f"out of memory while running: {str(e).splitlines()[0]}"},
                step_rows, None)
    finally:
        row.update(scn.backend_columns(be))
        scn.close_backend(be)
        wall.lap("teardown_s")
        row.update(wall.laps)
    row.update(clocks.columns())
    if row["throttled"]:
        log.warning("%s: SM clock fell to %.0f MHz during the measured steps (max %.0f): throttled",
                    name, row["sm_clock_mhz_min"], clocks.max_mhz)
    row.update(summarize(samples, sums, model=scn.model, rows=rows, top_k=top_k,
                         row_bytes=scn.attention_row_bytes, record=record,
                         warmup_steps=cfg.timing.warmup_steps, stages=STAGES))
    row.update(correctness(max_err, max_lse, cfg.timing.check_tolerance, scn.check_error()))
    row.update(scn.derived_columns(row))
    return row, step_rows, record


def host_oom(cfg, scn: Scenario, name: str) -> Optional[str]:
    """Why backend ``name``'s pinned host pools do not fit (checked before it is built), or None."""
    wl = getattr(scn, "wl", None)
    if wl is None:
        return None
    cls, settings = backend_settings(cfg, name)
    need = cls.host_bytes_needed(wl, settings)
    if need and not fits(need, torch.device("cpu")):
        return (f"set-up does not fit: the host KV pool needs {need / 2**30:.1f} GiB; "
                f"{host_available_bytes() / 2**30:.1f} GiB of host memory are available")
    return None


def run_point(cfg, device: torch.device, job_dir: Path, repro: str, cfg_hash: str,
              invalid: Optional[Dict[str, str]] = None) -> List[Dict]:
    """Runs all backends of one point; writes result.parquet and steps.parquet atomically.
    ``invalid`` (backend -> reason): backends recorded as ``status=invalid`` without running (a
    sweep's point that is invalid for some of its backends only)."""
    invalid = invalid or {}
    model = ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True))
    scn: Scenario = scenario_class(cfg.scenario)(cfg, model, device)
    names = backends_of(cfg)
    oom = scn.prepare()
    base = {**point_columns(cfg, device, repro, cfg_hash), **scn.base_columns()}
    if oom is not None:
        rows = [{**base, **_failed(cfg, n, "oom", oom)} for n in names]
        results.write_results(job_dir, rows)
        log.info("oom: %s", oom)
        return rows
    rows, step_rows = [], []
    recorded = False
    for name, run in scn.runs(names):
        try:
            if name in invalid:
                row, srows, record = _failed(cfg, name, "invalid", invalid[name]), [], None
            elif reason := host_oom(cfg, scn, name):
                row, srows, record = _failed(cfg, name, "oom", reason), [], None
            else:
                row, srows, record = run_backend(scn, cfg, name, run)
        except Exception as e:  # recorded, and the sweep goes on
            log.error("backend %s failed:\n%s", name, traceback.format_exc())
            cols = {k: v for k, v in run.items() if k not in ("status", "error")}
            row, srows, record = {**_failed(cfg, name, "error", f"{type(e).__name__}: {e}"), **cols}, [], None
        if cfg.selection.record and record is not None and not recorded:
            # the selections actually served (for selection=indexer: what the indexer chose)
            Trace(record, scn.selections()).save(cfg.selection.record)
            log.info("recorded selections to %s", cfg.selection.record)
            recorded = True
        rows.append({**base, **row})
        step_rows += srows
        r = rows[-1]
        log.info("%-16s %-9s %s median %9.1f us  err %.2e  (set-up %.1f s, first step %.1f s, "
                 "other steps %.1f s)  %s", name, r["status"], scn.name,
                 r.get("latency_us_median", float("nan")), r.get("max_rel_err") or float("nan"),
                 r.get("setup_s", float("nan")), r.get("first_step_s", float("nan")),
                 r.get("later_steps_s", float("nan")), r.get("error") or "")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    results.write_steps(job_dir, step_rows)
    results.write_results(job_dir, rows)
    return rows
