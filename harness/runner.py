"""Runs one configuration point through every requested backend and records the results.

For each backend: set-up (untimed), ``prefill``, then ``steps`` decode steps; each step runs
``num_layers`` layer steps, each timed stage by stage (``harness.timing.StageTimer``, L2 flushed
before each layer step by default). Every layer step's output is checked against the torch
reference on the logical KV; a point beyond tolerance is recorded with ``status=incorrect``.
Warm-up steps are run and checked but excluded from the numbers.
"""
from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from omegaconf import OmegaConf

from backends import backend_class
from backends.base import BackendInvalid, BackendUnavailable
from harness import ceilings as ceilings_mod
from harness import env, results
from harness.config import ModelConfig
from harness.clocks import ClockMonitor
from harness.memory import fits, free_bytes
from harness.indexer_select import IndexerSelector, positions_of_slots
from harness.selection import PatternParams, Trace, distinct_counts, synthesize
from harness.timing import StageTimer, TimingStats, UntimedStages
from harness.validate import ConfigError, backends_of, check_trace
from harness.workload import Workload, lse_error, relative_error, synthetic_seq_lens

log = logging.getLogger("harness")

#: stage names; each has a ``stage_<name>_us`` column in both tables (harness.results)
STAGES = STEP_STAGES = tuple(c[len("stage_"):-len("_us")] for c in results.STAGE_TIME_COLUMNS)
COUNT_KEYS = ("hits", "misses", "tokens_loaded", "pages_loaded", "bytes_h2d")
LSE_TOLERANCE = 0.05


@dataclass
class PointInputs:
    seq_lens: np.ndarray  # int32 [steps, batch]
    topk: Optional[np.ndarray]  # int32 [steps, layers, batch, top_k]; None: selection=indexer


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


def make_selection(cfg, trace: Optional[Trace] = None) -> PointInputs:
    """Synthetic selections, or a trace replayed (its sequence lengths replace context_len)."""
    if cfg.selection.source == "trace":
        tr = trace if trace is not None else load_trace(cfg)
        return PointInputs(tr.seq_lens.astype(np.int32), tr.topk.astype(np.int32))
    seq_lens = synthetic_seq_lens(cfg.context_len, cfg.steps, cfg.batch_size)
    if cfg.selection.source == "indexer":  # selected inside the measured step
        return PointInputs(seq_lens, None)
    params = PatternParams(cfg.pattern, cfg.selection.cluster_len, cfg.selection.num_sinks,
                           cfg.selection.window)
    topk = synthesize(params, seq_lens, cfg.num_layers, cfg.top_k, cfg.step_overlap, cfg.seed)
    return PointInputs(seq_lens, topk)


def base_row(cfg, wl: Optional[Workload], device: torch.device, repro: str, cfg_hash: str) -> Dict:
    """The columns every row of this point shares (parameters, ceilings, provenance)."""
    from backends.kernels.kv_format import row_bytes
    row = {
        "schema_version": results.SCHEMA_VERSION,
        "attention_kernel": cfg.attention_kernel,
        "model": cfg.model.name,
        "kv_dtype": cfg.kv_dtype,
        "kv_row_bytes": row_bytes(cfg.kv_dtype, cfg.model.d_nope, cfg.model.d_rope),
        "page_size": cfg.page_size, "top_k": cfg.top_k, "batch_size": cfg.batch_size,
        "context_len": int(wl.seq_lens[0].max() - 1) if wl is not None else cfg.context_len,
        "pattern": cfg.pattern if cfg.selection.source == "synthetic" else cfg.selection.source,
        "step_overlap": cfg.step_overlap, "selection": cfg.selection.source, "phase": "decode",
        "cluster_len": cfg.selection.cluster_len if cfg.pattern in ("clustered", "mixed") else None,
        "steps": cfg.steps, "warmup_steps": cfg.timing.warmup_steps, "num_layers": cfg.num_layers,
        "seed": cfg.seed, "cold_l2": cfg.timing.cold_l2, "cuda_graph": cfg.timing.cuda_graph,
        "device": device.type, "tolerance": cfg.timing.check_tolerance,
        "repro_command": repro, "config_hash": cfg_hash, "timestamp": env.timestamp(),
    }
    if cfg.selection.source == "indexer":
        row["fuse_topk"] = cfg.selection.fuse_topk
        row["query_corr"] = cfg.selection.query_corr
    row.update(ceilings_mod.measure(device).as_columns())
    row.update(env.provenance(str(device)))
    return row


def backend_options(cfg, name: str) -> Dict[str, object]:
    opts: Dict[str, object] = {"attention_kernel": cfg.attention_kernel}
    if name == "hisparse":
        h = cfg.hisparse
        opts.update(device_buffer_size=h.device_buffer_size if h.device_buffer_size is not None else 2 * cfg.top_k,
                    load_granularity=h.load_granularity, copy_engine=h.copy_engine,
                    coordinator=h.coordinator)
    return opts


def _failed(cfg, name: str, status: str, err: str) -> Dict:
    """A row for a backend that did not run; it still records the backend's settings."""
    return {"backend": name, **backend_options(cfg, name), "status": status, "error": err}


class LayerGraphs:
    """``timing.cuda_graph``: one CUDA graph per layer, captured at its first use with static
    input buffers and replayed for every later step (inputs copied in untimed), as serving
    engines replay decode graphs. Stages cannot be timed inside a graph: only the total."""

    def __init__(self, be):
        self.be = be
        self.graphs: Dict[int, tuple] = {}

    def replay(self, step: int, layer: int, q, pos, seq, timer: StageTimer):
        if layer not in self.graphs:
            sq, spos, sseq = q.clone(), pos.clone(), seq.clone()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                outs = self.be.decode_layer(step, layer, sq, spos, sseq, UntimedStages())
            self.graphs[layer] = (g, sq, spos, sseq, outs)
        g, sq, spos, sseq, (out, lse) = self.graphs[layer]
        sq.copy_(q)
        spos.copy_(pos)
        sseq.copy_(seq)
        timer.begin()
        timer.run("graph", g.replay)
        t = timer.end()
        del t["graph"]
        return out, lse, t


def run_backend(name: str, cfg, wl: Workload, topk_dev: torch.Tensor, device: torch.device):
    """Runs every step and layer through one backend. Returns (row, step_rows)."""
    opts = backend_options(cfg, name)
    cls = backend_class(name)
    try:
        be = cls(wl, opts)
    except BackendInvalid as e:
        return _failed(cfg, name, "invalid", str(e)), []
    except BackendUnavailable as e:
        return _failed(cfg, name, "unavailable", str(e)), []
    except (torch.OutOfMemoryError, MemoryError) as e:
        return _failed(cfg, name, "oom", f"set-up does not fit: {str(e).splitlines()[0]}"), []
    row: Dict = {"backend": name, **be.row_extras()}
    if cfg.timing.cuda_graph and be.graph_capturable():
        reason = be.graph_capturable()
        be.close()
        return {**row, "status": "invalid", "error": reason}, []
    graphs = LayerGraphs(be) if cfg.timing.cuda_graph else None
    selector = (IndexerSelector(wl, cfg.selection.fuse_topk, cfg.selection.query_corr)
                if wl.topk is None else None)
    fused_slots = selector is not None and be.accepts_slots and cfg.selection.fuse_topk
    record = np.full((wl.steps, wl.num_layers, wl.batch_size, wl.top_k), -1, dtype=np.int32)
    step_rows: List[Dict] = []
    samples: List[Dict[str, float]] = []
    max_err, max_lse, bad_selections = 0.0, 0.0, 0
    sums = {k: 0 for k in ("tokens_selected", "pages_touched", *COUNT_KEYS)}
    timer = StageTimer(device, cold_l2=cfg.timing.cold_l2, launch_shield_us=cfg.timing.launch_shield_us)
    clocks = ClockMonitor(device)
    try:
        be.prefill()
        for s in range(wl.steps):
            warm = s < cfg.timing.warmup_steps
            be.begin_step(s)
            seq_np = wl.seq_lens[s]
            seq_dev = torch.from_numpy(seq_np).to(device)
            if selector is not None:
                selector.begin_step(s, seq_dev)
            for layer in range(wl.num_layers):
                q = wl.q(s, layer)
                pos, slots = (None, None) if selector is not None else (topk_dev[s, layer], None)
                if graphs is not None and s > 0:  # step 0 runs eagerly: compiles and warms up
                    out, lse, t = graphs.replay(s, layer, q, pos, seq_dev, timer)
                else:
                    if selector is not None:
                        selector.prepare(s, layer)
                    timer.begin()
                    if selector is not None:
                        sel = selector.select(s, layer, seq_dev, timer, want_slots=fused_slots)
                        pos, slots = (None, sel) if fused_slots else (sel, None)
                    out, lse = be.decode_layer(s, layer, q, pos, seq_dev, timer, slots=slots)
                    t = timer.end()
                counts = be.layer_counts(layer)
                if selector is not None:
                    t["select"] = t.get("indexer", 0.0) + t.get("topk", 0.0)
                    if pos is None:
                        pos = positions_of_slots(wl, slots)
                    bad_selections += selector.check(layer, pos, seq_np)
                ref_out, ref_lse = wl.reference(layer, q, pos)
                max_err = max(max_err, relative_error(out, ref_out))
                max_lse = max(max_lse, lse_error(lse, ref_lse))
                record[s, layer] = pos.cpu().numpy()
                tok, pages = distinct_counts(record[s, layer], wl.page_size)
                for b in range(wl.batch_size):
                    r = {"backend": name, "step": s, "layer": layer, "request": b, "warmup": warm,
                         "seq_len": int(seq_np[b]), "tokens_selected": int(tok[b]),
                         "pages_touched": int(pages[b]), "latency_us": t["total"]}
                    r.update({f"stage_{k}_us": v for k, v in t.items() if k in STEP_STAGES})
                    r.update({k: int(v[b]) for k, v in counts.items()})
                    step_rows.append(r)
                if not warm:
                    clocks.sample()
                    samples.append(t)
                    sums["tokens_selected"] += int(tok.sum())
                    sums["pages_touched"] += int(pages.sum())
                    for k in COUNT_KEYS:
                        sums[k] = sums[k] + int(counts[k].sum()) if (k in counts and sums[k] is not None) else None
    except BackendInvalid as e:
        return {**row, "status": "invalid", "error": str(e)}, step_rows
    except (torch.OutOfMemoryError, MemoryError) as e:
        return {**row, "status": "oom", "error": f"out of memory while running: {str(e).splitlines()[0]}"}, step_rows
    finally:
        row["working_set_bytes"] = be.working_set_bytes() + index_key_bytes(wl)
        row["host_bytes"] = be.host_bytes()
        be.close()
    row["_record"] = record
    row.update(clocks.columns())
    if row["throttled"]:
        log.warning("%s: SM clock fell to %.0f MHz during the measured steps (max %.0f): throttled",
                    name, row["sm_clock_mhz_min"], clocks.max_mhz)
    if selector is not None:
        row["stage_plan_us"] = TimingStats.of(selector.plan_us).median_us
        row["plan_builds_per_step"] = float(np.mean(selector.plan_builds))
    row.update(summarize(samples, sums, model=wl.model, rows=wl.batch_size, top_k=wl.top_k,
                         row_bytes=wl.row_bytes, record=record, warmup_steps=cfg.timing.warmup_steps))
    row.update(correctness(max_err, max_lse, cfg.timing.check_tolerance,
                           f"indexer top-k differs from the reference scores in {bad_selections} row(s)"
                           if bad_selections else None))
    return row, step_rows


def correctness(max_err: float, max_lse: float, tolerance: float, selection_error: Optional[str]) -> Dict:
    """``max_rel_err``, ``max_lse_err``, and ``status`` ok / incorrect with the reasons in ``error``."""
    bad = [selection_error] if selection_error else []
    if not max_err <= tolerance:
        bad.append(f"max_rel_err={max_err:.3g} > tolerance {tolerance}")
    if not max_lse <= LSE_TOLERANCE:
        bad.append(f"max_lse_err={max_lse:.3g} > {LSE_TOLERANCE}")
    return {"max_rel_err": max_err, "max_lse_err": max_lse,
            "status": "incorrect" if bad else "ok", "error": "; ".join(bad) if bad else None}


def index_key_bytes(wl: Workload) -> int:
    """Bytes of the lightning indexer's fp8 keys (index_dim + 4 B per token and layer): they stay
    on the GPU in both designs."""
    return wl.num_layers * wl.batch_size * wl.max_positions * (wl.model.index_dim + 4)


def summarize(samples: List[Dict[str, float]], sums: Dict, *, model: ModelConfig, rows: int,
              top_k: int, row_bytes: int, record: np.ndarray, warmup_steps: int) -> Dict:
    """Latency statistics, per-stage medians, counts and derived rates of the measured steps.

    ``rows``: query rows per sample (decode: the batch; extend: the query tokens); ``row_bytes``:
    bytes attention reads per selected KV row; ``record`` int32 ``[steps, layers, rows, top_k]``
    the positions served (-1 = none)."""
    lat = TimingStats.of([t["total"] for t in samples])
    row = {"latency_us_median": lat.median_us, "latency_us_p10": lat.p10_us,
           "latency_us_p90": lat.p90_us, "n_samples": lat.n,
           "launch_gap_us": TimingStats.of([t.get("launch_gap", float("nan")) for t in samples]).median_us}
    for st in STAGES:
        vals = [t[st] for t in samples if st in t]
        row[f"stage_{st}_us"] = TimingStats.of(vals).median_us if vals else float("nan")
    row.update(sums)
    m, rb = model, row_bytes
    n = max(lat.n, 1)
    row["bytes_selected"] = sums["tokens_selected"] * rb
    # attention's minimum HBM reads: the queries, the index table and each selected row once
    q_bytes = rows * m.num_heads * m.d_qk * 2
    idx_bytes = rows * top_k * 4
    row["bytes_hbm_read"] = lat.n * (q_bytes + idx_bytes) + sums["tokens_selected"] * rb
    valid_entries = int((record[warmup_steps:] >= 0).sum())
    row["flops"] = 2.0 * m.num_heads * valid_entries * (m.d_qk + m.d_v)
    sec = lat.median_us * 1e-6
    row["hbm_gbps"] = row["bytes_hbm_read"] / n / sec / 1e9 if sec > 0 else float("nan")
    row["tflops"] = row["flops"] / n / sec / 1e12 if sec > 0 else float("nan")
    if sums.get("bytes_h2d") is not None:
        row["h2d_gbps"] = sums["bytes_h2d"] / n / sec / 1e9 if sec > 0 else float("nan")
    if sums.get("hits") is not None and sums.get("misses") is not None:
        tot = sums["hits"] + sums["misses"]
        row["hit_rate"] = sums["hits"] / tot if tot else float("nan")
    return row


def _all_oom(cfg, names, device, repro, cfg_hash, job_dir, reason: str) -> List[Dict]:
    base = base_row(cfg, None, device, repro, cfg_hash)
    rows = [{**base, **_failed(cfg, n, "oom", reason)} for n in names]
    results.write_results(job_dir, rows)
    log.info("oom: %s", reason)
    return rows


def run_point(cfg, device: torch.device, job_dir: Path, repro: str, cfg_hash: str) -> List[Dict]:
    """Runs all backends of one point; writes result.parquet and steps.parquet atomically."""
    if cfg.phase == "extend":  # its own workload (ragged prefill); imported after the device choice
        from harness.extend import run_extend_point
        return run_extend_point(cfg, device, job_dir, repro, cfg_hash)
    model = ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True))
    names = backends_of(cfg)
    trace = load_trace(cfg) if cfg.selection.source == "trace" else None
    seq_lens = (trace.seq_lens if trace is not None
                else synthetic_seq_lens(cfg.context_len, cfg.steps, cfg.batch_size))
    wl = Workload(model=model, device=device, kv_dtype=cfg.kv_dtype, page_size=cfg.page_size,
                  seq_lens=seq_lens.astype(np.int32), topk=None, top_k=cfg.top_k,
                  num_layers=cfg.num_layers, seed=cfg.seed)
    if not fits(wl.kv_pool_bytes, device):  # checked before any selection or allocation
        return _all_oom(cfg, names, device, repro, cfg_hash, job_dir,
                        f"the KV pool of the simulated layers needs {wl.kv_pool_bytes / 2**30:.1f} GiB; "
                        f"{free_bytes(device) / 2**30:.1f} GiB are free on {device.type}")
    inputs = make_selection(cfg, trace)
    wl.topk = inputs.topk
    try:
        wl.build()
    except (torch.OutOfMemoryError, MemoryError) as e:
        return _all_oom(cfg, names, device, repro, cfg_hash, job_dir,
                        f"KV pool ({wl.kv_pool_bytes / 2**30:.1f} GiB) does not fit: {str(e).splitlines()[0]}")
    base = base_row(cfg, wl, device, repro, cfg_hash)
    topk_dev = torch.from_numpy(inputs.topk).to(device) if inputs.topk is not None else None
    rows, step_rows = [], []
    recorded = False
    for name in names:
        try:
            row, srows = run_backend(name, cfg, wl, topk_dev, device)
        except Exception as e:  # recorded, and the sweep goes on
            log.error("backend %s failed:\n%s", name, traceback.format_exc())
            row, srows = _failed(cfg, name, "error", f"{type(e).__name__}: {e}"), []
        record = row.pop("_record", None)
        if cfg.selection.record and record is not None and not recorded:
            # the selections actually served (for selection=indexer: what the indexer chose)
            Trace(record, inputs.seq_lens).save(cfg.selection.record)
            log.info("recorded selections to %s", cfg.selection.record)
            recorded = True
        rows.append({**base, **row})
        step_rows += srows
        log.info("%-16s %-9s median %9.1f us  err %.2e  %s", name, rows[-1]["status"],
                 rows[-1].get("latency_us_median", float("nan")), rows[-1].get("max_rel_err") or float("nan"),
                 rows[-1].get("error") or "")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    results.write_steps(job_dir, step_rows)
    results.write_results(job_dir, rows)
    return rows
