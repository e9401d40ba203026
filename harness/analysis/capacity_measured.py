"""Capacity under an HBM budget, measured: the ``scenario=capacity`` rows
(``harness/scenarios/capacity.py``), where every design runs at the largest batch its device
footprint allows under ``capacity.kv_budget_gb`` (``capacity_point='max'``) and, with
``capacity.batch_sizes``, at listed smaller batches (``'listed'``).

Units: context in tokens; ``tokens_per_s`` decode tokens per second of one GPU (batch / TPOT);
``tpot_ms`` ms per output token (``model.layers`` x (layer step + rest of layer), stages in
sequence); ``step_us`` and ``rest_of_layer_us`` µs per layer step of the whole batch; memory
in GB (1e9 B); ``h2d_MB`` MB (1e6 B) copied from host per layer step.

Everything here is computed from the rows:

* ``measured_table``: one record per (setting, design, tp_size, context, capacity point,
  batch); repeats collapsed to the median of their ok rows. A *setting* is a combination of
  the ``SETTING_AXES`` that vary in the rows (budget, top-k, pattern, ...); a *design* is a
  backend family, plus the ``DESIGN_AXES`` that vary within it at one setting.
* ``ratio_table``: per (setting, tp_size, context) each offloading design's tokens/s over the
  resident design's (``flashmla_sparse``), both at ``capacity_point='max'``. ``basis``: both
  ok -> the ratio of the measured numbers; the resident design failed for a design reason
  (``DESIGN_FAILURES``: oom = not one request fits, invalid) while the other ran -> inf; the
  reverse -> 0; any other failure (error, incorrect, unavailable, no row, an ok row without
  tokens/s) -> not compared (NaN), with the reason.
* ``crossover_table``: per (setting, tp_size, design) the smallest context whose ratio exceeds
  1 + ``tol`` (the claims' tolerance, 5 %), or "none in range".
* ``direction_verdicts``: the published direction (``DirectionClaim``) checked per
  (setting, tp_size, design): supported / partly / not supported / not enough data.
* ``projection_table``: the analytic capacity view (``capacity.capacity_table``) computed from
  the decode rows of the same tree at the same contexts and budget, beside the measured
  numbers (``measured_over_projected``), so a reader sees how far the projection was off. It
  models an attention-only step with every head of the model (no rest of the layer), so it is
  drawn only for tp_size=1 rows (``attention_heads`` = the model's heads).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from .capacity import capacity_table
from .claims import DEFAULT_TOL, NO_DATA
from .model import model_preset
from .rows import family, measured_layer_steps, num, number
from .tables import (BASE, DESIGN_FAILURES, FAMILIES, MISSING, _Collapser, _py, _sort_key,
                     axis_roles, per_backend_table)

#: the resident design every offloading design is compared with
RESIDENT = BASE
#: shared settings: a combination of those that vary is one *setting* (compared within only)
SETTING_AXES = ("model", "kv_budget_gb", "kv_dtype", "page_size", "top_k", "pattern", "selection",
                "attention_kernel", "rest_of_layer", "rest_weight_dtype", "ep_size", "num_layers",
                "cuda_graph", "device")
#: settings of one design: those that vary within a family at one setting name the design
DESIGN_AXES = ("device_buffer_size", "load_granularity", "copy_engine", "coordinator")
#: axes the projection must share with the decode rows it is computed from (the footprint)
PROJECTION_STRICT = ("model", "kv_dtype", "page_size", "top_k")
#: axes it prefers to share (the decode rows that match are used when there are any)
PROJECTION_SOFT = ("pattern", "selection", "attention_kernel", "device_buffer_size")

SUPPORTED, PARTLY, NOT_SUPPORTED = "supported", "partly", "not supported"
HOLDS, FAILS = "holds", "fails"

#: published decode throughput of HiSparse over the resident baseline (context -> ratio):
#: the HiSparse paper, GLM-5.1 with DSA on 8 x H200 (secondary write-up; see
#: /work/shared/research/update-2026-12.md)
PUBLISHED_RATIOS = {4096: 1.0, 32768: 3.1, 163840: 2.9}
PUBLISHED_NOTE = ("published: HiSparse paper (GLM-5.1 DSA, 8xH200) 1.0x at 4K, 3.1x at 32K, 2.9x at "
                  "160K; SGLang issues: lower throughput where the device pool shrinks (#26849), "
                  "0.92x at batch 1-4 but 3.0x at batch 54 (#33075)")


@dataclass(frozen=True)
class DirectionClaim:
    """The published direction: an offloading design's decode tokens/s over the resident
    design's is about 1x at short context and about 3x from 32K.

    ``short``: every compared context <= ``short_context`` has a ratio within ``short_band``;
    ``long``: every compared context >= ``long_context`` has a ratio >= ``long_min`` (holds), none
    beyond 1 + tol (fails), or some in between (partly)."""

    short_context: int = 4096
    long_context: int = 32768
    short_band: Tuple[float, float] = (0.8, 1.25)
    long_min: float = 2.0

    def text(self) -> str:
        lo, hi = self.short_band
        return (f"Offloading gives about 1x the resident design's decode tokens/s at short context "
                f"(<= {self.short_context} tokens: ratio {lo:g}-{hi:g}) and about 3x from "
                f"{self.long_context} tokens (ratio >= {self.long_min:g})")


@dataclass
class CapacityView:
    """Everything the capacity section shows (``analyse_capacity``)."""

    rows: pd.DataFrame            #: the scenario=capacity rows
    setting: List[str]            #: SETTING_AXES that vary in the rows
    measured: pd.DataFrame        #: measured_table
    ratios: pd.DataFrame          #: ratio_table
    crossover: pd.DataFrame       #: crossover_table
    verdicts: pd.DataFrame        #: direction_verdicts
    max_batch: pd.DataFrame       #: max_batch_table
    projection: pd.DataFrame      #: projection_table (empty without matching decode rows)
    failures: pd.DataFrame        #: rows whose status is not ok
    claim: DirectionClaim = field(default_factory=DirectionClaim)
    notes: List[str] = field(default_factory=list)


# --------------------------------------------------------------------------- helpers

def _values(s: pd.Series) -> set:
    return {_py(v) for v in s}


def _varying(df: pd.DataFrame, cols: Sequence[str]) -> List[str]:
    return [c for c in cols if c in df.columns and len(_values(df[c])) > 1]


def _groups(df: pd.DataFrame, keys: Sequence[str]) -> List[Tuple[tuple, pd.DataFrame]]:
    """(key values, rows) for each observed combination of ``keys``, sorted (None last)."""
    if df.empty:
        return []
    if not keys:
        return [((), df)]
    k = [tuple(_py(v) for v in t) for t in df[list(keys)].itertuples(index=False)]
    idx = pd.Series(k, index=df.index)
    return [(key, df[idx.map(lambda x, key=key: x == key)]) for key in sorted(set(k), key=_sort_key)]


def _family_order(f: str) -> tuple:
    return (FAMILIES.index(f), f) if f in FAMILIES else (len(FAMILIES), f)


def _finite_pos(v: object) -> bool:
    v = _py(v)
    return isinstance(v, (int, float)) and np.isfinite(v) and v > 0


def design_labels(rows: pd.DataFrame, setting: Sequence[str]) -> pd.Series:
    """The design of each row: its backend family, plus ``axis=value`` for every
    ``DESIGN_AXES`` axis that varies within that family at one setting."""
    fam = rows["backend"].map(family)
    out = fam.astype(object).copy()
    for f in fam.unique():
        sub = rows[fam == f]
        vary = [a for a in DESIGN_AXES if a in sub
                and any(len(_values(g[a])) > 1 for _, g in _groups(sub, setting))]
        if vary:
            out[fam == f] = [f"{f} (" + ", ".join(f"{a}={_py(r[a])}" for a in vary) + ")"
                             for _, r in sub.iterrows()]
    return out


def _throughput_note(row: Mapping) -> str:
    """Why an ok row has no tokens/s."""
    if _py(row.get("rest_of_layer")) == "roofline" and not np.isfinite(number(row, "ceiling_hbm_gbps")):
        return ("no tokens/s: rest_of_layer=roofline needs the run's measured ceilings, and this "
                "row has none (CPU)")
    return "no tokens/s in the row"


# --------------------------------------------------------------------------- tables

#: columns of ``measured_table`` after the setting axes
MEASURED_COLUMNS = ("design", "family", "tp_size", "context_len", "capacity_point", "batch_size",
                    "max_batch", "status", "step_us", "rest_of_layer", "rest_of_layer_us", "tpot_ms",
                    "tokens_per_s", "kv_budget_gb", "device_GB_per_request", "host_GB_per_request",
                    "footprint_device_GB", "peak_device_GB", "attention_heads", "resident_fraction",
                    "hit_rate", "h2d_MB", "n_rows", "error", "note")


def measured_table(rows: pd.DataFrame, setting: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """One record per (setting, design, tp_size, context_len, capacity_point, batch_size) of
    the capacity rows, repeats collapsed (numbers: median of the ok rows; status ok when any
    repeat is ok). Columns: the varying setting axes, ``MEASURED_COLUMNS``, then the other
    ``SETTING_AXES`` and the ``DESIGN_AXES`` the rows hold."""
    setting = list(_varying(rows, SETTING_AXES) if setting is None else setting)
    d = rows.reset_index(drop=True).copy()
    d["design"] = design_labels(d, setting)
    d["family"] = d["backend"].map(family)
    d["step_us"] = num(d["latency_us_median"])
    rest = num(d["stage_rest_of_layer_us"]) if "stage_rest_of_layer_us" in d else pd.Series(np.nan, index=d.index)
    if "stage_rest_of_layer_roofline_us" in d:
        rest = rest.fillna(num(d["stage_rest_of_layer_roofline_us"]))
    d["rest_of_layer_us"] = rest
    for src, dst in (("device_bytes_per_request", "device_GB_per_request"),
                     ("host_bytes_per_request", "host_GB_per_request"),
                     ("footprint_device_bytes", "footprint_device_GB"), ("peak_device_bytes", "peak_device_GB")):
        d[dst] = num(d[src]) / 1e9 if src in d else np.nan
    d["h2d_MB"] = num(d["bytes_h2d"]) / measured_layer_steps(d) / 1e6 if "bytes_h2d" in d else np.nan
    for c in MEASURED_COLUMNS:
        if c not in d and c != "n_rows":   # n_rows: the collapser's count
            d[c] = None
    keys = setting + ["design", "tp_size", "context_len", "capacity_point", "batch_size"]
    collapse = _Collapser(d)
    recs = []
    for _, g in _groups(d, keys):
        rec = collapse(list(g.index))
        rec["note"] = _throughput_note(rec) if rec["status"] == "ok" and not _finite_pos(rec["tokens_per_s"]) else ""
        recs.append(rec)
    cols = setting + [c for c in MEASURED_COLUMNS if c not in setting]
    cols += [c for c in SETTING_AXES + DESIGN_AXES if c in rows.columns and c not in cols]
    out = pd.DataFrame(recs, columns=list(d.columns) + ["n_rows"])[cols] if recs else pd.DataFrame(columns=cols)

    def order(rec: Mapping) -> tuple:
        return (_sort_key(tuple(_py(rec[c]) for c in setting + ["tp_size", "context_len"])),
                _family_order(rec["family"]), str(rec["design"]),
                0 if rec["capacity_point"] == "max" else 1, _sort_key((_py(rec["batch_size"]),)))
    return pd.DataFrame(sorted(out.to_dict("records"), key=order), columns=cols)


def _at_max(measured: pd.DataFrame) -> pd.DataFrame:
    return measured[measured["capacity_point"] == "max"]


def ratio_table(measured: pd.DataFrame, setting: Sequence[str]) -> pd.DataFrame:
    """Per (setting, tp_size, context_len, offloading design): its tokens/s, the resident
    design's, ``ratio`` = the two's quotient (inf / 0 / NaN by ``basis``, module docstring)."""
    setting = list(setting)
    out = []
    for key, g in _groups(_at_max(measured), setting + ["tp_size", "context_len"]):
        res = g[g["family"] == RESIDENT]
        r = res.iloc[0].to_dict() if not res.empty else {"status": MISSING, "tokens_per_s": None, "batch_size": None}
        r_ok = r["status"] == "ok" and _finite_pos(r["tokens_per_s"])
        for _, o in g[g["family"] != RESIDENT].iterrows():
            o_ok = o["status"] == "ok" and _finite_pos(o["tokens_per_s"])
            if r_ok and o_ok:
                ratio, basis = float(o["tokens_per_s"]) / float(r["tokens_per_s"]), "both ok"
            elif o_ok and r["status"] in DESIGN_FAILURES:
                ratio, basis = float("inf"), f"{RESIDENT} {r['status']}"
            elif r_ok and o["status"] in DESIGN_FAILURES:
                ratio, basis = 0.0, f"{o['design']} {o['status']}"
            else:
                why = [f"{name} {st}" + (" (no tokens/s)" if st == "ok" else "")
                       for name, st, good in ((RESIDENT, r["status"], r_ok), (o["design"], o["status"], o_ok))
                       if not good]
                ratio, basis = float("nan"), "not compared: " + ", ".join(why)
            rec = dict(zip(setting + ["tp_size", "context_len"], key))
            rec.update(design=o["design"], family=o["family"], resident_batch=_py(r["batch_size"]),
                       batch_size=_py(o["batch_size"]), resident_tokens_per_s=_py(r["tokens_per_s"]),
                       tokens_per_s=_py(o["tokens_per_s"]), ratio=ratio, basis=basis)
            out.append(rec)
    cols = setting + ["tp_size", "context_len", "design", "family", "resident_batch", "batch_size",
                      "resident_tokens_per_s", "tokens_per_s", "ratio", "basis"]
    return pd.DataFrame(out, columns=cols)


def _compared(g: pd.DataFrame) -> Dict[int, float]:
    """context -> ratio over the compared contexts of one (setting, tp_size, design) group."""
    r = g[~num(g["ratio"]).isna()]
    return {int(c): float(v) for c, v in zip(r["context_len"], num(r["ratio"]))}


def _ratios_text(d: Mapping[int, float]) -> str:
    return ", ".join(f"{c}: {v:.3g}x" for c, v in sorted(d.items())) or "none"


def crossover_table(ratios: pd.DataFrame, setting: Sequence[str], tol: float = DEFAULT_TOL) -> pd.DataFrame:
    """Per (setting, tp_size, offloading design): ``crossover_context``, the smallest compared
    context whose tokens/s ratio to the resident design exceeds 1 + ``tol`` (None when none
    does), ``crossover`` (that context, or 'none in range (a-b)'), ``ahead_at`` (every context
    where it exceeds), ``ratios`` per context and the contexts ``not_compared``."""
    setting = list(setting)
    out = []
    for key, g in _groups(ratios, setting + ["tp_size", "design"]):
        comp = _compared(g)
        ahead = sorted(c for c, v in comp.items() if v > 1 + tol)
        first = ahead[0] if ahead else None
        if first is not None:
            text = str(first)
        elif comp:
            text = f"none in range ({min(comp)}-{max(comp)})"
        else:
            text = "no context compared"
        nc = g[num(g["ratio"]).isna()]
        rec = dict(zip(setting + ["tp_size", "design"], key))
        rec.update(crossover_context=first, crossover=text, ahead_at=", ".join(map(str, ahead)),
                   ratios=_ratios_text(comp),
                   not_compared="; ".join(f"{int(c)} ({b})" for c, b in zip(nc["context_len"], nc["basis"])))
        out.append(rec)
    cols = setting + ["tp_size", "design", "crossover_context", "crossover", "ahead_at", "ratios", "not_compared"]
    return pd.DataFrame(out, columns=cols)


def _short_part(comp: Mapping[int, float], claim: DirectionClaim) -> Tuple[Optional[str], str]:
    vals = {c: v for c, v in comp.items() if c <= claim.short_context}
    lo, hi = claim.short_band
    if not vals:
        return None, f"short (<= {claim.short_context}): no context compared"
    ok = all(lo <= v <= hi for v in vals.values())
    return (HOLDS if ok else FAILS,
            f"short (<= {claim.short_context}): {_ratios_text(vals)} "
            f"({'all' if ok else 'not all'} within {lo:g}-{hi:g})")


def _long_part(comp: Mapping[int, float], claim: DirectionClaim, tol: float) -> Tuple[Optional[str], str]:
    vals = {c: v for c, v in comp.items() if c >= claim.long_context}
    if not vals:
        return None, f"long (>= {claim.long_context}): no context compared"
    if all(v >= claim.long_min for v in vals.values()):
        out, why = HOLDS, f"all >= {claim.long_min:g}"
    elif all(v <= 1 + tol for v in vals.values()):
        out, why = FAILS, f"none beyond {1 + tol:g}: no gain"
    else:
        out, why = PARTLY, f"a gain, but not all >= {claim.long_min:g}"
    return out, f"long (>= {claim.long_context}): {_ratios_text(vals)} ({why})"


def combine_parts(short: Optional[str], long: Optional[str]) -> str:
    """The verdict from the two parts' outcomes (None: the part had no compared context):
    supported when both were checked and hold, not supported when every checked part fails,
    not enough data when neither was checked, partly otherwise."""
    checked = [p for p in (short, long) if p is not None]
    if not checked:
        return NO_DATA
    if len(checked) == 2 and all(p == HOLDS for p in checked):
        return SUPPORTED
    if all(p == FAILS for p in checked):
        return NOT_SUPPORTED
    return PARTLY


def direction_verdicts(ratios: pd.DataFrame, setting: Sequence[str], claim: DirectionClaim = DirectionClaim(),
                       tol: float = DEFAULT_TOL, devices: Sequence[str] = ()) -> pd.DataFrame:
    """Per (setting, tp_size, offloading design): ``verdict`` on ``claim`` (``combine_parts``),
    the outcome of each part, ``detail`` with the measured ratios per part, ``published``.
    ``devices``: the rows' devices (a ``caveat`` names CPU rows)."""
    setting = list(setting)
    caveat = ("CPU (Triton interpreter) rows: the verdict exercises the check, it is not evidence "
              "about GPU performance" if "cpu" in devices else "")
    out = []
    for key, g in _groups(ratios, setting + ["tp_size", "design"]):
        comp = _compared(g)
        s, s_txt = _short_part(comp, claim)
        lg, l_txt = _long_part(comp, claim, tol)
        rec = dict(zip(setting + ["tp_size", "design"], key))
        rec.update(claim=claim.text(), verdict=combine_parts(s, lg), short=s or NO_DATA, long=lg or NO_DATA,
                   detail=f"{s_txt}; {l_txt}", published=PUBLISHED_NOTE, caveat=caveat)
        out.append(rec)
    cols = setting + ["tp_size", "design", "claim", "verdict", "short", "long", "detail", "published", "caveat"]
    return pd.DataFrame(out, columns=cols)


def max_batch_table(measured: pd.DataFrame, setting: Sequence[str]) -> pd.DataFrame:
    """Per (setting, tp_size, context_len, design) at ``capacity_point='max'``: ``max_batch``
    (0: not one request fits), the status, GB per request on the device and host, the budget
    and the connector's resident fraction at that batch."""
    cols = list(setting) + ["tp_size", "context_len", "design", "max_batch", "status", "device_GB_per_request",
                            "host_GB_per_request", "resident_fraction"]
    cols += [] if "kv_budget_gb" in cols else ["kv_budget_gb"]
    return _at_max(measured)[cols].reset_index(drop=True)


def failures_table(measured: pd.DataFrame, setting: Sequence[str]) -> pd.DataFrame:
    """The records whose status is not ok, with their error (never drawn as numbers)."""
    cols = list(setting) + ["tp_size", "context_len", "design", "capacity_point", "batch_size", "max_batch",
                            "status", "error"]
    return measured[measured["status"] != "ok"][cols].reset_index(drop=True)


# --------------------------------------------------------------------------- projection

def _prefer(frame: pd.DataFrame, col: str, value: object) -> pd.DataFrame:
    """The rows of ``frame`` whose ``col`` equals ``value`` when there are any, else all."""
    if col not in frame or value is None:
        return frame
    m = frame[col].map(_py) == value
    return frame[m] if m.any() else frame


def projection_table(measured: pd.DataFrame, decode_rows: Optional[pd.DataFrame],
                     setting: Sequence[str]) -> pd.DataFrame:
    """The analytic capacity view beside the measured one, per (setting, tp_size, design,
    context_len) where it can be computed: decode rows (ok, flashmla_sparse or hisparse) of the
    same ``PROJECTION_STRICT`` axes at the same context, preferring those that share the
    ``PROJECTION_SOFT`` axes, through ``capacity.capacity_table`` with the capacity rows' budget
    (``kv_budget_gb`` for ``model.layers`` layers). Only where the capacity rows compute every
    head of the model (tp_size=1: the decode rows run all heads). Several matching decode rows
    (e.g. repeats or patterns) give the median projection; ``decode_rows`` counts them and
    ``decode_pattern`` names their patterns."""
    setting = list(setting)
    cols = setting + ["tp_size", "design", "context_len", "kv_budget_gb", "projected_max_batch",
                      "projected_tokens_per_s", "measured_max_batch", "measured_tokens_per_s",
                      "measured_over_projected", "decode_rows", "decode_pattern", "scaling"]
    if decode_rows is None or decode_rows.empty or measured.empty:
        return pd.DataFrame(columns=cols)
    dec = decode_rows[(decode_rows["status"] == "ok") & decode_rows["backend"].map(family).isin(
        [RESIDENT, "hisparse"])]
    out = []
    for _, m in _at_max(measured).iterrows():
        if m["family"] not in (RESIDENT, "hisparse") or dec.empty:
            continue
        model = _py(m["model"])
        try:
            heads = model_preset(model).num_heads
        except ValueError:
            continue
        if _py(m["attention_heads"]) != heads:
            continue
        cand = dec[(dec["backend"].map(family) == m["family"]) & (dec["context_len"].map(_py) == _py(m["context_len"]))]
        for a in PROJECTION_STRICT:
            want = _py(m.get(a))
            if a in cand and want is not None:
                cand = cand[cand[a].map(_py) == want]
        for a in PROJECTION_SOFT:
            cand = _prefer(cand, a, _py(m.get(a)))
        if cand.empty:
            continue
        budget = _py(m["kv_budget_gb"])
        if not _finite_pos(budget):
            continue
        capt = capacity_table(per_backend_table(cand, complete=False), axis_roles(cand), hbm_gb=budget, reserve_gb=0.0)
        if capt.empty:
            continue
        proj_tps = float(num(capt["tokens_per_s_at_max_batch"]).median())
        proj_b = float(num(capt["max_batch"]).median())
        meas = _py(m["tokens_per_s"]) if m["status"] == "ok" and _finite_pos(m["tokens_per_s"]) else None
        rec = {a: _py(m[a]) for a in setting}
        rec.update(tp_size=_py(m["tp_size"]), design=m["design"], context_len=_py(m["context_len"]),
                   kv_budget_gb=budget, projected_max_batch=proj_b, projected_tokens_per_s=proj_tps,
                   measured_max_batch=_py(m["max_batch"]), measured_tokens_per_s=meas,
                   measured_over_projected=(meas / proj_tps if meas is not None and proj_tps > 0 else None),
                   decode_rows=len(cand),
                   decode_pattern=", ".join(sorted({str(p) for p in cand.get("pattern", pd.Series(dtype=object)).dropna()})),
                   scaling="; ".join(sorted(set(capt["scaling"].astype(str)))))
        out.append(rec)
    return pd.DataFrame(out, columns=cols)


# --------------------------------------------------------------------------- all of it

def analyse_capacity(rows: pd.DataFrame, decode_rows: Optional[pd.DataFrame] = None,
                     claim: DirectionClaim = DirectionClaim(), tol: float = DEFAULT_TOL) -> Optional[CapacityView]:
    """The capacity section's tables over the ``scenario=capacity`` ``rows`` (None when there
    are none); ``decode_rows``: the same tree's decode rows, for the projection."""
    if rows is None or rows.empty:
        return None
    setting = _varying(rows, SETTING_AXES)
    measured = measured_table(rows, setting)
    ratios = ratio_table(measured, setting)
    devices = sorted({str(v) for v in rows["device"].dropna()}) if "device" in rows else []
    notes = []
    silent = measured[(measured["status"] == "ok") & (measured["note"] != "")]
    for note, g in silent.groupby("note"):
        notes.append(f"{len(g)} ok record(s) without tokens/s, not drawn: {note}")
    return CapacityView(rows, setting, measured, ratios, crossover_table(ratios, setting, tol),
                        direction_verdicts(ratios, setting, claim, tol, devices),
                        max_batch_table(measured, setting), projection_table(measured, decode_rows, setting),
                        failures_table(measured, setting), claim, notes)


# --------------------------------------------------------------------------- wide views

def _designs(measured: pd.DataFrame) -> List[str]:
    pairs = set(zip(measured["design"], measured["family"]))
    return [d for d, _ in sorted(pairs, key=lambda t: (_family_order(t[1]), t[0]))]


def _cell(rec: Mapping, value: str) -> object:
    """``rec[value]`` when the record is ok and the value finite, else its status in words."""
    if rec["status"] != "ok":
        return str(rec["status"])
    return _py(rec[value]) if _finite_pos(rec[value]) else f"no {value}"


def throughput_wide(view: CapacityView) -> pd.DataFrame:
    """One row per (setting, tp_size, context_len) at each design's max batch: ``<design>
    batch``, ``<design> tok/s`` (the status instead of a number for a failed record) and, per
    offloading design, ``<design> / flashmla_sparse`` (the ratio; its basis when not both ok)."""
    keys = view.setting + ["tp_size", "context_len"]
    designs = _designs(view.measured)
    out = []
    for key, g in _groups(_at_max(view.measured), keys):
        rec: Dict[str, object] = dict(zip(keys, key))
        rat = view.ratios
        for k, v in zip(keys, key):
            rat = rat[rat[k].map(_py) == v]
        for d in designs:
            r = g[g["design"] == d]
            if r.empty:
                rec[f"{d} batch"], rec[f"{d} tok/s"] = None, MISSING
                continue
            r0 = r.iloc[0]
            rec[f"{d} batch"] = _py(r0["batch_size"]) if r0["status"] == "ok" else None
            rec[f"{d} tok/s"] = _cell(r0, "tokens_per_s")
        for d in designs:
            x = rat[rat["design"] == d]
            if x.empty:
                continue
            x0 = x.iloc[0]
            rec[f"{d} / {RESIDENT}"] = (_py(x0["ratio"]) if x0["basis"] == "both ok"
                                        else f"{'-' if np.isnan(x0['ratio']) else _py(x0['ratio'])} ({x0['basis']})")
        out.append(rec)
    return pd.DataFrame(out)


def max_batch_wide(view: CapacityView) -> pd.DataFrame:
    """One row per (setting, tp_size, context_len): each design's max batch (0 when not one
    request fits) and, for the connector, its resident fraction at that batch."""
    keys = view.setting + ["tp_size", "context_len"]
    designs = _designs(view.measured)
    out = []
    for key, g in _groups(view.max_batch, keys):
        rec: Dict[str, object] = dict(zip(keys, key))
        for d in designs:
            r = g[g["design"] == d]
            rec[d] = _py(r.iloc[0]["max_batch"]) if not r.empty else MISSING
            rf = r["resident_fraction"].map(_py).dropna() if not r.empty else pd.Series(dtype=float)
            if len(rf):
                rec[f"{d} resident fraction"] = rf.iloc[0]
        out.append(rec)
    return pd.DataFrame(out)
