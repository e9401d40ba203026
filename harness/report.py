"""Report over a run or sweep: ``python -m harness.report RUN_DIR [--project conf/hardware/X.yaml]``.

Writes under ``RUN_DIR/report/`` (or ``--out``): ``report.md``; CSV tables ``tradeoff.csv``,
``per_backend.csv``, ``claims.csv``, ``model.csv``, ``capacity.csv`` (the analytic projection),
``failures.csv`` and ``projected_<hardware>.csv`` per ``--project`` from the decode and extend
rows; ``capacity_measured.csv``, ``capacity_ratios.csv``, ``capacity_max_batch.csv``,
``capacity_crossover.csv``, ``capacity_claims.csv`` and ``capacity_projection.csv`` from the
``scenario=capacity`` rows (``harness.analysis.capacity_measured``); figures as PNG and SVG under
``figures/``. Latencies are µs per decode layer step of the whole batch; bytes per tier MB per
layer step; throughput decode tokens/s of one GPU. Exit status 2, with a one-line message, when
there is nothing to report.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pandas as pd

from harness import results
from harness.analysis import capacity as cap
from harness.analysis import capacity_figures as cfigs
from harness.analysis import capacity_measured as cmz
from harness.analysis import claims as cl
from harness.analysis import figures as figs
from harness.analysis import model as mdl
from harness.analysis import tables as tb
from harness.analysis.rows import family, is_capacity

REPORT_DIR = "report"
CPU_WARNING = ("**Some rows ran on the CPU** (device = cpu). CPU timings are not performance "
               "figures: they check the pipeline, not the trade-off.")
NO_DECODE = ("No decode or extend rows in this run (only `scenario=capacity` rows): nothing to show "
             "here; see the capacity section.")


@dataclass
class Analysis:
    """Everything the report shows, computed once (``analyse``)."""

    run_dir: Path
    df: pd.DataFrame                      #: decode/extend rows + model/projection columns
    roles: tb.AxisRoles
    pb: pd.DataFrame                      #: per_backend_table
    trade: Optional[pd.DataFrame]         #: tradeoff_tables' table (None without a pair)
    claims: List[cl.Claim]
    capacity: pd.DataFrame                #: the analytic capacity view (from decode rows)
    hardware: List[mdl.Ceilings] = field(default_factory=list)
    projected: Dict[str, pd.DataFrame] = field(default_factory=dict)
    projected_capacity: Dict[str, pd.DataFrame] = field(default_factory=dict)
    steps: Optional[pd.DataFrame] = None
    notes: List[str] = field(default_factory=list)
    rows: Optional[pd.DataFrame] = None   #: every row after the filter (both scenarios)
    pairs: Dict[str, pd.DataFrame] = field(default_factory=dict)   #: tradeoff_tables' pairs
    capacity_view: Optional[cmz.CapacityView] = None              #: scenario=capacity rows


def _proj_col(name: str) -> str:
    return f"proj_{name}_latency_us"


def analyse(run_dir: str | Path, project: Sequence[str | Path] = (), hbm_gb: float = cap.DEFAULT_HBM_GB,
            reserve_gb: float = cap.DEFAULT_RESERVE_GB, filt: Optional[dict] = None,
            df: Optional[pd.DataFrame] = None,
            capacity_claim: cmz.DirectionClaim = cmz.DirectionClaim()) -> Analysis:
    """Loads ``run_dir`` (or takes ``df``), applies ``filt`` (column -> value or list), and
    computes tables, claims, model, projections and the analytic capacity view over the decode
    and extend rows, and the measured capacity section over the ``scenario=capacity`` rows
    (``capacity_claim``: the published direction it is checked against). Raises
    FileNotFoundError (nothing to load) or harness.results.SchemaError (a newer schema)."""
    run_dir = Path(run_dir)
    if df is None:
        df = results.load(run_dir)
    if "bench" in df:                 # micro-benchmark rows (harness.bench) are no sweep points
        df = df[df["bench"].isna()]
    rows = tb.apply_filter(df, filt).reset_index(drop=True)
    if rows.empty:
        raise FileNotFoundError(f"no result rows under {run_dir}" + (f" matching {filt}" if filt else ""))
    capacity_mask = is_capacity(rows)
    df = rows[~capacity_mask].reset_index(drop=True)
    capacity_view = cmz.analyse_capacity(rows[capacity_mask].reset_index(drop=True), df, capacity_claim)
    notes: List[str] = []
    hardware = [mdl.load_hardware(p) for p in project]
    steps = None
    if run_dir.exists() and any((f.parent / results.STEPS_FILE).exists() for f in results.result_files(run_dir)):
        steps = results.load(run_dir, steps=True)
    if df.empty:
        notes.append(NO_DECODE)
        roles = tb.AxisRoles(cell=[])
        return Analysis(run_dir, df, roles, pd.DataFrame(), None, cl.check_claims(None, df, roles, steps),
                        pd.DataFrame(), hardware, steps=steps, notes=notes, rows=rows,
                        capacity_view=capacity_view)
    df = pd.concat([df, mdl.predict(df)], axis=1)
    for hw in hardware:
        pj = mdl.project(df, hw)
        df[_proj_col(hw.name)] = pj["proj_latency_us"]
        df[f"proj_{hw.name}_basis"] = pj["projection_basis"]
    roles = tb.axis_roles(df)
    pb = tb.per_backend_table(df, roles)
    trade, pairs = tb.tradeoff_tables(pb, roles)
    if trade is None:
        present = ", ".join(roles.families)
        notes.append(f"Only {present} in this run: no side-by-side ratios or winners; "
                     "the per-backend table and figures are shown.")
    claims = cl.check_claims(pairs.get(tb.COORD), df, roles, steps)
    capacity = cap.capacity_table(pb, roles, hbm_gb, reserve_gb)
    projected, projected_cap = {}, {}
    for hw in hardware:
        col = _proj_col(hw.name)
        t, _ = tb.tradeoff_tables(pb, roles, latency_col=col)
        projected[hw.name] = t if t is not None else pb[list(roles.cell) + ["family"] + roles.variant_columns() + [col]]
        projected_cap[hw.name] = cap.capacity_table(pb, roles, hw.hbm_capacity_gb or hbm_gb, reserve_gb,
                                                    latency_col=col)
    return Analysis(run_dir, df, roles, pb, trade, claims, capacity, hardware, projected,
                    projected_cap, steps, notes, rows=rows, pairs=pairs, capacity_view=capacity_view)


# --------------------------------------------------------------------------- markdown sections

def _families(rows: pd.DataFrame) -> List[str]:
    present = set(rows["backend"].dropna().map(family)) if "backend" in rows else set()
    return [f for f in tb.FAMILIES if f in present] + sorted(present - set(tb.FAMILIES))


def _on_cpu(rows: Optional[pd.DataFrame]) -> bool:
    return rows is not None and "device" in rows and bool((rows["device"] == "cpu").any())


def _cpu_caveat(rows: Optional[pd.DataFrame], what: str, extra: str = "") -> List[str]:
    """The caveat for verdicts computed from CPU rows (none when no row ran on the CPU)."""
    if not _on_cpu(rows):
        return []
    return [f"> The {what} below come from CPU (Triton interpreter) rows: they exercise the check, "
            f"they are not evidence about GPU performance.{(' ' + extra) if extra else ''}", ""]


def _md_header(a: Analysis) -> List[str]:
    df = a.rows if a.rows is not None else a.df
    lines = ["# DSA serving trade-off: " + " vs ".join(_families(df)), "",
             f"- run: `{a.run_dir}`",
             f"- rows: {len(df)} from {df['job_dir'].nunique() if 'job_dir' in df else 1} job(s); "
             f"backends: {', '.join(sorted(df['backend'].dropna().unique()))}",
             "- status: " + ", ".join(f"{k} {v}" for k, v in df["status"].value_counts().items())]
    if "scenario" in df and df["scenario"].notna().any():
        lines.append("- scenarios: " + ", ".join(f"{k} {v}" for k, v in df["scenario"].value_counts().items()))
    for col, what in (("device", "device"), ("gpu_name", "GPU"), ("git_sha", "git sha"),
                      ("torch_version", "torch")):
        vals = sorted({str(v) for v in df[col].dropna()}) if col in df else []
        if vals:
            lines.append(f"- {what}: {', '.join(vals)}")
    if "timestamp" in df and df["timestamp"].notna().any():
        lines.append(f"- timestamps: {df['timestamp'].dropna().min()} .. {df['timestamp'].dropna().max()}")
    if "repro_command" in df and df["repro_command"].notna().any():
        lines.append(f"- repro (first row): `{df['repro_command'].dropna().iloc[0]}`")
    lines.append("")
    if _on_cpu(df):
        lines += [f"> {CPU_WARNING}", ""]
    for n in a.notes:
        lines += [f"> **Note.** {n}", ""]
    lines += ["Units: latency = µs for one decode layer step of the whole batch (all stages); "
              "bytes per tier = MB (1e6 B) per layer step; pages/tokens per request per layer step; "
              "amplification = bytes moved / bytes of the selected tokens; throughput = decode "
              "tokens/s of one GPU.", ""]
    return lines


def _md_ceilings(a: Analysis) -> List[str]:
    rows = a.rows if a.rows is not None else a.df
    cols = ["ceiling_hbm_gbps", "ceiling_h2d_gbps", "ceiling_bf16_tflops"]
    keys = [c for c in ("device", "gpu_name") if c in rows]
    c = rows[keys + cols].copy()
    for k in keys:
        c[k] = c[k].astype("object").where(c[k].notna(), "")
    c = c.groupby(keys, dropna=False)[cols].median().reset_index()
    out = ["## Ceilings measured in the run", ""]
    if not c[cols].notna().any().any():
        return out + ["None measured (CPU rows or failed rows): the roofline model has no ceilings.", ""]
    return out + ["Medians over rows: HBM in GB/s (device copy, read + write counted), host-to-device "
                  "in GB/s, bf16 dense matmul in TFLOP/s. Empty on the CPU.", "", tb.to_markdown(c)]


#: short names of the families in table headers
ABBREV = {tb.BASE: "fm", tb.COORD: "hs", tb.CONNECTOR: "hc"}


def _md_tradeoff(a: Analysis) -> List[str]:
    out = ["## Trade-off table", ""]
    if a.df.empty:
        return out + [NO_DECODE, ""]
    cell = list(a.roles.cell)
    if a.trade is None:
        out += ["Single backend: see the per-backend table below (no ratios).", ""]
        return out
    t = a.trade
    variants = [c for c in t.columns if c in a.roles.variant_columns() or "." in c]
    B, C, X = tb.BASE, tb.COORD, tb.CONNECTOR
    cols = cell + variants + [f"{B}_status", f"{C}_status", f"{X}_status", f"{B}_us", f"{C}_us", f"{X}_us",
                              "ratio", "winner", "separated", "connector_ratio", "connector_winner",
                              f"{B}_hbm_MB", f"{C}_hbm_MB", f"{C}_h2d_MB", f"{X}_h2d_MB",
                              "pages_touched_per_req", f"{C}_pages_loaded_per_req", "amp_pages",
                              f"{B}_amp_hbm", f"{C}_amp_h2d", f"{C}_hit_rate", f"{X}_hit_rate",
                              f"{X}_resident_page_share"]
    headers = {"ratio": "hs/fm", "separated": "bands apart", "connector_ratio": "hc/fm",
               "connector_winner": "hc vs fm winner", "pages_touched_per_req": "pages touched",
               "amp_pages": "page amp", f"{C}_pages_loaded_per_req": "hs pages loaded",
               f"{B}_amp_hbm": "fm amp (HBM)", f"{C}_amp_h2d": "hs amp (H2D)",
               f"{X}_resident_page_share": "hc resident pages"}
    for fam, ab in ABBREV.items():
        headers.update({f"{fam}_status": f"{ab} status", f"{fam}_us": f"{ab} µs", f"{fam}_hbm_MB": f"{ab} HBM MB",
                        f"{fam}_h2d_MB": f"{ab} H2D MB", f"{fam}_hit_rate": f"{ab} hit rate"})
    out += ["fm = flashmla_sparse (vLLM-style, full KV in HBM), hs = hisparse (KV in host memory, "
            "GPU hot buffer), hc = hisparse_connector (vLLM's connector: resident pages while the "
            "pool has room, the rest in host memory behind a hot buffer). hs/fm and hc/fm < 1: "
            "the offloading design is faster; 'winner' compares hs with fm, 'hc vs fm winner' hc "
            "with fm. 'bands apart': the p10-p90 intervals of hs and fm do not overlap. Missing "
            "cells (not in the results) and failed cells show their status. Full columns: "
            "[tradeoff.csv](tradeoff.csv).", "", tb.to_markdown(t, cols, headers)]
    for fam, ab in ((C, "hs"), (X, "hc")):      # over the pair's own table: one row per cell and variant
        if fam in a.pairs:
            wins = a.pairs[fam]["winner"].value_counts()
            out += ["", f"Winners ({ab} vs fm): " + ", ".join(f"{k} {v}" for k, v in wins.items())]
    return out + [""]


def _md_per_backend(a: Analysis) -> List[str]:
    out = ["## Per-backend table", ""]
    if a.df.empty:
        return out + [NO_DECODE, ""]
    cols = list(a.roles.cell) + ["family"] + a.roles.variant_columns() + [
        "status", "latency_us_median", "latency_us_p10", "latency_us_p90", "hbm_MB", "h2d_MB",
        "pages_touched_per_req", "pages_loaded_per_req", "amp_hbm", "amp_h2d", "hit_rate", "n_rows"]
    return out + ["One row per backend per cell (repeats collapsed to the median of ok rows). "
                  "[per_backend.csv](per_backend.csv).", "", tb.to_markdown(a.pb, cols)]


def _md_failures(a: Analysis) -> List[str]:
    f = tb.failures(a.rows if a.rows is not None else a.df)
    if f.empty:
        return ["## Failed rows", "", "None.", ""]
    return ["## Failed rows", "", "Every scenario's rows; [failures.csv](failures.csv).", "", tb.to_markdown(f), ""]


def _md_claims(a: Analysis) -> List[str]:
    out = ["## The seed article's claims", ""]
    if a.df.empty:
        return out + [NO_DECODE, ""]
    c = cl.claims_frame(a.claims)
    caveat = _cpu_caveat(a.df, "timing verdicts", "Page counts (claim c) do not depend on the device.")
    return out + [*caveat,
                  f"A cell favours a backend when the latency ratio is beyond 1 +- {cl.DEFAULT_TOL:.0%}; "
                  "only cells with both backends ok count.", "",
                  tb.to_markdown(c, ["key", "claim", "verdict", "detail", "evidence"]), ""]


def _figure_lines(sets: Sequence[figs.FigureSet], out: Path, level: str = "###") -> List[str]:
    lines: List[str] = []
    for fs in sets:
        lines += [f"{level} {fs.title}", ""]
        paths = figs.save(fs, out / "figures")
        for p in paths:
            lines += [f"![{p.stem}](figures/{p.name}) ([svg](figures/{p.stem}.svg))", ""]
        if fs.note:
            lines += [("Skipped: " if not paths else "Note: ") + fs.note, ""]
        for _, fig in fs.figures:
            fig.clear()
    return lines


def _md_figures(a: Analysis, out: Path) -> List[str]:
    lines = ["## Figures", ""]
    if a.df.empty:
        return lines + [NO_DECODE, ""]
    return lines + _figure_lines(figs.all_figures(a.pb, a.pairs, a.roles), out)


def _md_model(a: Analysis) -> List[str]:
    lines = ["## Analytic model (roofline)", ""]
    if a.df.empty:
        return lines + [NO_DECODE, ""]
    pb = a.pb[a.pb["status"] == "ok"]
    cols = list(a.roles.cell) + ["family"] + a.roles.variant_columns()
    for s in mdl.STAGES:
        cols += [f"pred_{s}_us", f"ratio_{s}"]
    cols += ["pred_total_us", "latency_us_median", "ratio_total"]
    hdr = {f"pred_{s}_us": f"{s} pred µs" for s in mdl.STAGES}
    hdr.update({f"ratio_{s}": f"{s} meas/pred" for s in mdl.STAGES})
    hdr.update(pred_total_us="total pred µs", latency_us_median="total meas µs", ratio_total="total meas/pred")
    lines += ["Per stage: kernels x launch cost + max(HBM bytes / HBM ceiling, H2D bytes / H2D ceiling, "
              f"FLOPs / bf16 ceiling), with the ceilings measured in the same run and "
              f"{mdl.DEFAULT_LAUNCH_US:g} µs per kernel launch (select = 2 kernels, the others 1). "
              "Bytes and FLOPs come from the counted tokens/bytes per layer step (see "
              "`harness/analysis/model.py`). meas/pred > 1: slower than the roofline. Every row: "
              "[model.csv](model.csv).", ""]
    has_pred = "pred_total_us" in pb and pb["pred_total_us"].notna().any()
    if not has_pred:
        lines += ["No prediction: the run has no measured ceilings (CPU run?). "
                  "Use `--project conf/hardware/<gpu>.yaml` for a roofline on given ceilings.", ""]
        return lines
    lines += [tb.to_markdown(pb, cols, hdr), ""]
    return lines


def _md_projections(a: Analysis) -> List[str]:
    lines: List[str] = []
    for hw in a.hardware:
        lines += [f"## PROJECTION (not measured): {hw.label}", ""]
        if a.df.empty:
            lines += [NO_DECODE, ""]
            continue
        t = a.projected[hw.name]
        col = _proj_col(hw.name)
        lines += [f"Ceilings from `{hw.name}`: HBM {hw.hbm_gbps or 'measured'} GB/s, H2D "
                  f"{hw.h2d_gbps or 'measured'} GB/s, bf16 {hw.bf16_tflops or 'measured'} TFLOP/s, "
                  f"launch {hw.launch_us:g} µs. Each measured stage is scaled by the roofline ratio "
                  "target / this run's hardware (the unmodelled remainder is carried over); rows "
                  "without measured ceilings use the target roofline alone. These are projections. "
                  f"[projected_{hw.name}.csv](projected_{hw.name}.csv)", ""]
        if "ratio" in t or "connector_ratio" in t:
            B, C, X = tb.BASE, tb.COORD, tb.CONNECTOR
            cols = list(a.roles.cell) + [c for c in t.columns if c in a.roles.variant_columns() or "." in c]
            cols += [f"{B}_status", f"{C}_status", f"{X}_status", f"{B}_us", f"{C}_us", f"{X}_us", "ratio",
                     "winner", "connector_ratio", "connector_winner"]
            hdr = {f"{B}_us": "fm projected µs", f"{C}_us": "hs projected µs", f"{X}_us": "hc projected µs",
                   "ratio": "hs/fm projected", "winner": "projected winner (hs vs fm)",
                   "connector_ratio": "hc/fm projected", "connector_winner": "projected winner (hc vs fm)",
                   f"{B}_status": "fm status", f"{C}_status": "hs status", f"{X}_status": "hc status"}
            lines += [tb.to_markdown(t, cols, hdr), ""]
        else:
            lines += [tb.to_markdown(t, list(t.columns), {col: "projected µs"}), ""]
        pc = a.projected_capacity[hw.name]
        if not pc.empty:
            lines += [f"Projected capacity with {hw.hbm_capacity_gb or cap.DEFAULT_HBM_GB:g} GB HBM:", "",
                      tb.to_markdown(pc, _capacity_cols(a, pc)), ""]
    return lines


def _capacity_cols(a: Analysis, c: pd.DataFrame) -> List[str]:
    keys = [k for k in a.roles.cell if k != "batch_size"] + ["family"] + a.roles.variant_columns()
    return list(dict.fromkeys(keys + ["context_len", "gpu_GB_per_request", "host_GB_per_request", "max_batch",
                                      "measured_batch", "measured_tokens_per_s", "step_us_at_max_batch",
                                      "tokens_per_s_at_max_batch", "scaling"]))


def _md_capacity(a: Analysis, hbm_gb: float, reserve_gb: float) -> List[str]:
    lines = ["## Capacity projection (analytic, from decode rows)", ""]
    if a.df.empty:
        return lines + [NO_DECODE, ""]
    lines += [f"KV budget = {hbm_gb:g} GB HBM - {reserve_gb:g} GB reserved for weights and activations "
              f"= {hbm_gb - reserve_gb:g} GB, over the model's {mdl.model_preset('dsv32').layers} layers. flashmla_sparse "
              "keeps the whole KV (context x 61 x (row bytes + index key bytes; 132 B at dsv32)); hisparse "
              "keeps (min(device_buffer_size, context) + page) x 61 x row bytes plus the index keys "
              "(context x 61 x 132 B) on the GPU and the full KV in host memory (hisparse_connector is "
              "not modelled here). tokens/s = batch / (61 x per-layer step time); the step time at the "
              "batch that fits is **extrapolated** from the measured batch sizes as the `scaling` "
              "column says (proportional scaling keeps tokens/s at its measured value): a projection, "
              "not a measurement (the measured capacity section runs each design at that batch). "
              "[capacity.csv](capacity.csv)", ""]
    if a.capacity.empty:
        return lines + ["No ok rows with context_len and kv_row_bytes.", ""]
    return lines + [tb.to_markdown(a.capacity, _capacity_cols(a, a.capacity)), ""]


#: CSV files of the measured capacity section -> the CapacityView table they hold
CAPACITY_CSVS = {"capacity_measured.csv": "measured", "capacity_ratios.csv": "ratios",
                 "capacity_max_batch.csv": "max_batch", "capacity_crossover.csv": "crossover",
                 "capacity_claims.csv": "verdicts", "capacity_projection.csv": "projection"}


def _md_capacity_measured(a: Analysis, out: Path) -> List[str]:
    lines = ["## Capacity under an HBM budget (measured)", ""]
    v = a.capacity_view
    if v is None:
        return lines + ["No `scenario=capacity` rows in this run (`python -m harness +sweep=capacity` "
                        "measures them).", ""]
    m = v.measured
    vals = lambda c: ", ".join(tb.fmt(x) for x in sorted({tb._py(x) for x in m[c] if not tb.is_missing(x)},
                                                           key=lambda x: tb._sort_key([x])))
    lines += _cpu_caveat(v.rows, "tokens/s, crossovers and verdicts",
                         "Max batches are footprint arithmetic and do not depend on the device.")
    lines += [f"Each design runs at the largest batch its device footprint allows under "
              f"`capacity.kv_budget_gb` = {vals('kv_budget_gb')} GB for the KV of all the model's layers "
              f"(scaled to the simulated layers; host designs also bounded by the host budget), and at "
              f"any listed `capacity.batch_sizes`. tokens/s = batch / TPOT, TPOT = model layers x (layer "
              f"step + rest of the layer: `rest_of_layer` = {vals('rest_of_layer')}), stages in sequence "
              f"(no overlap assumed). A ratio is the offloading design's tokens/s over flashmla_sparse's "
              f"(resident KV) at the same context and tp_size, each at its own max batch; a design that "
              f"failed (oom: not one request fits; invalid) loses the comparison (ratio inf or 0), other "
              f"failures are not compared. Failed rows are listed below, never drawn as numbers. Files: "
              + ", ".join(f"[{f}]({f})" for f in CAPACITY_CSVS) + ".", ""]
    for n in v.notes:
        lines += [f"> **Note.** {n}", ""]
    lines += ["### Decode tokens/s vs context", "",
              "At each design's max batch (`capacity_point=max`); a failed record shows its status.", "",
              tb.to_markdown(cmz.throughput_wide(v)), ""]
    lines += ["### Max batch per design", "",
              "Requests that fit the budget (0: not one; the connector's resident fraction is the share "
              "of its KV pages kept on the GPU at that batch).", "", tb.to_markdown(cmz.max_batch_wide(v)), ""]
    lines += ["### Where an offloading design starts to beat the resident one", "",
              f"The smallest context whose tokens/s ratio to flashmla_sparse exceeds 1 + {cl.DEFAULT_TOL:.0%}, "
              "at the same tp_size.", "",
              tb.to_markdown(v.crossover, v.setting + ["tp_size", "design", "crossover", "ratios", "not_compared"]), ""]
    lines += ["### The published direction", "",
              f"Claim: {v.claim.text()}. {cmz.PUBLISHED_NOTE}.", "",
              *_cpu_caveat(v.rows, "verdicts"),
              tb.to_markdown(v.verdicts, v.setting + ["tp_size", "design", "verdict", "detail"]), ""]
    lines += ["### Failed capacity rows", ""]
    lines += ([tb.to_markdown(v.failures), ""] if not v.failures.empty else ["None.", ""])
    if not v.projection.empty:
        lines += ["### Measured vs the analytic projection", "",
                  "The analytic view (the section 'Capacity projection (analytic, from decode rows)': the "
                  "decode rows' step at their own batch, attention only, every head, scaled to the batch its "
                  "footprint model fits) at the same contexts and budget; measured/projected < 1: the "
                  "projection was optimistic. tp_size=1 only (the decode rows run every head).", "",
                  tb.to_markdown(v.projection, v.setting + ["tp_size", "design", "context_len", "projected_max_batch",
                                                             "measured_max_batch", "projected_tokens_per_s",
                                                             "measured_tokens_per_s", "measured_over_projected",
                                                             "decode_pattern"]), ""]
    return lines + _figure_lines(cfigs.capacity_figures(v), out)


def write_report(run_dir: str | Path, project: Sequence[str | Path] = (), out_dir: Optional[str | Path] = None,
                 hbm_gb: float = cap.DEFAULT_HBM_GB, reserve_gb: float = cap.DEFAULT_RESERVE_GB,
                 capacity_claim: cmz.DirectionClaim = cmz.DirectionClaim()) -> Path:
    """Writes the report for ``run_dir`` and returns the path of ``report.md``."""
    a = analyse(run_dir, project, hbm_gb, reserve_gb, capacity_claim=capacity_claim)
    out = Path(out_dir) if out_dir else Path(run_dir) / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    fig_dir = out / "figures"
    for stale in list(fig_dir.glob("*.png")) + list(fig_dir.glob("*.svg")) if fig_dir.is_dir() else []:
        stale.unlink()   # figures of an earlier report over a different slice of the run
    if a.trade is not None:
        a.trade.to_csv(out / "tradeoff.csv", index=False)
    if not a.df.empty:
        a.pb.to_csv(out / "per_backend.csv", index=False)
        cl.claims_frame(a.claims).to_csv(out / "claims.csv", index=False)
        keep = [c for c in list(tb.CELL_AXES) + list(tb.VARIANT_AXES) + ["status", "job_dir"] if c in a.df]
        mcols = [c for c in a.df.columns if c.startswith(("pred_", "meas_", "ratio_"))] + ["ceiling_set"]
        a.df[keep + mcols].to_csv(out / "model.csv", index=False)
        a.capacity.to_csv(out / "capacity.csv", index=False)
        for name, t in a.projected.items():
            t.to_csv(out / f"projected_{name}.csv", index=False)
    tb.failures(a.rows).to_csv(out / "failures.csv", index=False)
    if a.capacity_view is not None:
        for name, attr in CAPACITY_CSVS.items():
            getattr(a.capacity_view, attr).to_csv(out / name, index=False)
    lines = (_md_header(a) + _md_ceilings(a) + _md_tradeoff(a) + _md_claims(a) + _md_figures(a, out)
             + _md_capacity_measured(a, out) + _md_per_backend(a) + _md_failures(a) + _md_model(a)
             + _md_projections(a) + _md_capacity(a, hbm_gb, reserve_gb))
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", help="a run or sweep directory holding result.parquet files")
    p.add_argument("--project", action="append", default=[], metavar="YAML",
                   help="hardware ceilings (conf/hardware/*.yaml) to project the table onto; repeatable")
    p.add_argument("--out", default=None, help="output directory (default RUN_DIR/report)")
    p.add_argument("--hbm-gb", type=float, default=cap.DEFAULT_HBM_GB, help="HBM per GPU in GB (1e9 B)")
    p.add_argument("--reserve-gb", type=float, default=cap.DEFAULT_RESERVE_GB,
                   help="HBM reserved for weights and activations in GB")
    args = p.parse_args(argv)
    run = Path(args.run_dir)
    try:
        for y in args.project:
            if not Path(y).is_file():
                print(f"harness.report: no hardware file {y}", file=sys.stderr)
                return 2
        if not run.exists():
            raise FileNotFoundError(f"{run} does not exist")
        path = write_report(run, args.project, args.out, args.hbm_gb, args.reserve_gb)
    except results.SchemaError as e:
        print(f"harness.report: schema error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"harness.report: nothing to report: {e} (expected a run or sweep directory "
              f"with {results.RESULT_FILE} files)", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
