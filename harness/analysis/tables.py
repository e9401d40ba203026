"""Trade-off tables: per-backend rows (every family: flashmla_sparse, hisparse,
hisparse_connector) and the side-by-side tables with ratio and winner of each offloading design
against flashmla_sparse.

Units: latencies in µs for one decode layer step of the whole batch; bytes per tier in MB
(1e6 B) per decode layer step of the whole batch; pages and tokens per request per layer step;
amplification and hit rate dimensionless.

A *cell* is one point of the sweep that both backends run: its key is ``page_size``, ``top_k``
and every other shared axis (``CELL_AXES``) that varies in the run. Backend-specific settings
(``VARIANT_AXES``, e.g. hisparse's ``device_buffer_size``) that vary make *variants* of a backend
inside a cell. Repeats (rows with the same cell and variant, e.g. different seeds) are collapsed
to the median of the rows that are ``ok``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from backends import backend_classes
from backends.indexer_select import VARIANT_AXES as SELECT_VARIANT_AXES

from .model import expected_amplification_uniform, page_amplification_bound
from .rows import decode_seq_lens, family, is_missing, measured_layer_steps, num, number

BASE = "flashmla_sparse"   #: the vLLM-style path (full KV resident in HBM)
COORD = "hisparse"         #: the coordinator path (KV in host memory, hot buffer on the GPU)
CONNECTOR = "hisparse_connector"  #: vLLM's connector (resident while the pool has room, spills to host)
FAMILIES = (BASE, COORD, CONNECTOR)
#: the designs compared side by side with flashmla_sparse
OFFLOADING = (COORD, CONNECTOR)

#: shared axes, in display order; page_size and top_k are always part of the cell key
CELL_AXES = ("page_size", "top_k", "pattern", "context_len", "batch_size", "step_overlap",
             "attention_kernel", "kv_dtype", "model", "phase", "selection", "cold_l2", "cuda_graph",
             "device")
#: shared axes that not every backend varies (step_overlap changes hisparse's hit rate, not
#: flashmla_sparse's work; attention_kernel may be swept for one backend only): a cell axis only
#: when it varies within every family, otherwise a variant of the families where it varies
SOFT_AXES = ("step_overlap", "attention_kernel")
#: backend-specific settings (declared on the backend classes) and the indexer's fuse_topk and
#: query_dtype
VARIANT_AXES = ("backend", *dict.fromkeys(a for c in backend_classes() for a in c.variant_axes),
                *SELECT_VARIANT_AXES)
#: variant axes whose default follows top_k (hisparse's buffer defaults to 2 x top_k)
TIED_TO_TOP_K = ("device_buffer_size",)
STAGE_COLS = ("stage_select_us", "stage_transform_us", "stage_swap_in_us", "stage_resolve_us",
              "stage_attention_us")
MISSING = "missing"
#: failures that are properties of a design at that point (it does not fit, or cannot serve the
#: selection), so the other backend wins the cell; 'error', 'unavailable' and 'incorrect' are not
DESIGN_FAILURES = ("oom", "invalid")


def _py(v: object) -> object:
    """A plain Python value (None for any NA) usable as a dict key."""
    if is_missing(v):
        return None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        f = float(v)
        return int(f) if f.is_integer() and abs(f) < 2**53 else f
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _sort_key(t: Sequence) -> tuple:
    return tuple((1, "") if v is None else (0, v) if isinstance(v, (int, float)) else (0.5, str(v))
                 for v in t)


def apply_filter(df: pd.DataFrame, filt: Optional[Mapping[str, object]]) -> pd.DataFrame:
    """Rows where every ``column -> value`` (or list of accepted values) of ``filt`` matches."""
    if not filt:
        return df
    mask = pd.Series(True, index=df.index)
    for col, want in filt.items():
        if col not in df.columns:
            raise KeyError(f"filter column {col!r} not in results (have {sorted(df.columns)})")
        vals = list(want) if isinstance(want, (list, tuple, set)) else [want]
        mask &= df[col].isin(vals).fillna(False).astype(bool)
    return df[mask]


def derive(df: pd.DataFrame) -> pd.DataFrame:
    """Adds per-step quantities to raw result rows.

    ``per_step`` = (steps - warmup_steps) * num_layers, the measured layer steps the counts are
    summed over (the latency is per layer step of the whole batch), and ``per_req`` = per_step *
    batch_size. Added columns: ``family``; ``tokens_selected_per_req``,
    ``pages_touched_per_req``, ``pages_loaded_per_req``, ``tokens_loaded_per_req`` (per request
    per layer step); ``hbm_MB``, ``h2d_MB``, ``selected_MB`` (MB per layer step);
    ``amp_hbm`` = bytes_hbm_read / bytes_selected, ``amp_h2d`` = bytes_h2d / bytes_selected,
    ``amp_pages`` = pages_touched * page_size / tokens_selected (a page-granular loader without
    cache), ``amp_loaded`` = tokens_loaded / tokens_selected; ``context_pages`` = the pages of the
    requests' contexts summed like ``pages_touched`` (ceil(n / page_size) per measured layer step
    and request, n = the prompt plus the decode tokens added after it, ``rows.decode_seq_lens``);
    ``page_coverage`` = pages_touched / context_pages (<= 1); ``amp_pages_bound`` = the largest
    amp_pages any selection can have, ``amp_pages_uniform`` = a uniform-random selection's
    expectation at the same lengths (``model.page_amplification_bound``,
    ``model.expected_amplification_uniform``). Rows whose lengths the row does not fix (extend,
    replayed traces) have no context_pages, coverage or expectation, and the bound page_size.
    """
    d = df.copy()
    d["family"] = d["backend"].map(family) if "backend" in d else None
    per_step = measured_layer_steps(d)
    per_req = per_step * num(d["batch_size"])

    def div(a: pd.Series, b: pd.Series) -> pd.Series:
        a, b = num(a), num(b)
        return a / b.where(b > 0)

    for c in ("tokens_selected", "pages_touched", "pages_loaded", "tokens_loaded"):
        d[f"{c}_per_req"] = div(d[c], per_req)
    d["hbm_MB"] = div(d["bytes_hbm_read"], per_step) / 1e6
    d["h2d_MB"] = div(d["bytes_h2d"], per_step) / 1e6
    d["selected_MB"] = div(d["bytes_selected"], per_step) / 1e6
    d["amp_hbm"] = div(d["bytes_hbm_read"], d["bytes_selected"])
    d["amp_h2d"] = div(d["bytes_h2d"], d["bytes_selected"])
    d["amp_pages"] = div(num(d["pages_touched"]) * num(d["page_size"]), d["tokens_selected"])
    d["amp_loaded"] = div(d["tokens_loaded"], d["tokens_selected"])
    recs = d.to_dict("records")
    lens = [decode_seq_lens(r) for r in recs]
    pages, layers, batch = num(d["page_size"]), num(d["num_layers"]), num(d["batch_size"])
    per_step_pages = pd.Series([float(np.ceil(n / p).sum()) if n is not None and p > 0 else np.nan
                                for n, p in zip(lens, pages)], index=d.index)
    d["context_pages"] = per_step_pages * layers * batch
    d["page_coverage"] = div(d["pages_touched"], d["context_pages"])
    d["amp_pages_bound"] = [page_amplification_bound(c, t, p) for c, t, p in
                            zip(d["context_pages"], num(d["tokens_selected"]), pages)]
    d["amp_pages_uniform"] = [expected_amplification_uniform(n, int(k), int(p))
                              if n is not None and k > 0 and p > 0 else np.nan
                              for n, k, p in zip(lens, num(d["top_k"]), pages)]
    return d


@dataclass
class AxisRoles:
    """Which columns key a cell and which make backend variants (per family)."""

    cell: List[str]
    variants: Dict[str, List[str]] = field(default_factory=dict)
    families: List[str] = field(default_factory=list)

    def variant_columns(self) -> List[str]:
        out: List[str] = []
        for fam in self.families:
            out += [a for a in self.variants.get(fam, []) if a not in out]
        return out


def _nunique(s: pd.Series) -> int:
    return len({_py(v) for v in s})


def axis_roles(df: pd.DataFrame) -> AxisRoles:
    """Splits the axes that vary in ``df`` into cell axes (shared by every family present) and
    per-family variant axes. page_size and top_k are always cell axes; a ``CELL_AXES`` axis that a
    family never sets, and a ``SOFT_AXES`` axis that varies in only some families, are variants
    of the families where it varies."""
    fams = [f for f in FAMILIES if (df["backend"].map(family) == f).any()]
    fams += sorted(set(df["backend"].map(family)) - set(fams))
    fam_of = df["backend"].map(family)
    cell: List[str] = []
    variants: Dict[str, List[str]] = {f: [] for f in fams}
    for a in CELL_AXES:
        if a not in df.columns:
            continue
        if a in ("page_size", "top_k"):
            cell.append(a)
            continue
        if _nunique(df[a]) <= 1:
            continue
        if a in SOFT_AXES:
            shared = all(_nunique(df.loc[fam_of == f, a]) > 1 for f in fams)
        else:
            shared = all(df.loc[fam_of == f, a].notna().any() for f in fams)
        if shared:
            cell.append(a)
        else:
            for f in fams:
                if _nunique(df.loc[fam_of == f, a]) > 1:
                    variants[f].append(a)
    for a in VARIANT_AXES:
        if a not in df.columns:
            continue
        for f in fams:
            sub = df.loc[fam_of == f]
            if a in TIED_TO_TOP_K and "top_k" in sub:
                # e.g. the default device_buffer_size = 2 x top_k: a function of the cell's top_k,
                # not a variant, unless it also varies at a fixed top_k
                varies = any(_nunique(g[a]) > 1 for _, g in sub.groupby("top_k"))
            else:
                varies = _nunique(sub[a]) > 1
            if varies:
                variants[f].append(a)
    return AxisRoles(cell=cell, variants=variants, families=fams)


def _nanmedian(a: np.ndarray) -> Optional[float]:
    a = a[np.isfinite(a)]
    return float(np.median(a)) if a.size else None


class _Collapser:
    """Collapses repeats: numeric columns -> median over the ok rows (all rows when none is
    ok); other columns -> the value when unique, else None. ``n_rows`` counts the repeats."""

    def __init__(self, d: pd.DataFrame):
        self.cols = list(d.columns)
        self.numeric = {c for c in self.cols if pd.api.types.is_numeric_dtype(d[c])
                        and not pd.api.types.is_bool_dtype(d[c])}
        self.arrays = {c: num(d[c]).to_numpy() for c in self.numeric}
        self.records = d.to_dict("records")

    def __call__(self, pos: List[int]) -> Dict[str, object]:
        ok = [p for p in pos if self.records[p].get("status") == "ok"]
        use = ok or pos
        rec: Dict[str, object] = {}
        for c in self.cols:
            if c in self.numeric:
                rec[c] = _nanmedian(self.arrays[c][use]) if len(use) > 1 else _py(self.arrays[c][use[0]])
            else:
                vals = {_py(self.records[p][c]) for p in use}
                rec[c] = vals.pop() if len(vals) == 1 else None
        rec["status"] = "ok" if ok else _py(self.records[pos[0]].get("status"))
        errs = [self.records[p].get("error") for p in pos if not is_missing(self.records[p].get("error"))]
        rec["error"] = errs[0] if errs and not ok else None
        rec["n_rows"] = len(pos)
        return rec


def per_backend_table(df: pd.DataFrame, roles: Optional[AxisRoles] = None,
                      complete: bool = True) -> pd.DataFrame:
    """One record per (cell, family, variant) with every metric collapsed over repeats.

    With ``complete``, the grid (observed combinations of the other cell axes x every page_size
    x every top_k) is filled with ``status='missing'`` records for each family that has no row
    there. Columns: the cell axes, ``family``, the variant axes, then every result and
    ``derive`` column.
    """
    d = derive(df).reset_index(drop=True)
    roles = roles or axis_roles(d)
    keys_v = roles.variant_columns()
    collapse = _Collapser(d)
    groups: Dict[tuple, List[int]] = {}
    for i, rd in enumerate(collapse.records):
        fam = rd["family"]
        ck = tuple(_py(rd.get(a)) for a in roles.cell)
        vk = tuple(_py(rd.get(a)) if a in roles.variants.get(fam, []) else None for a in keys_v)
        groups.setdefault((ck, fam, vk), []).append(i)
    recs = []
    for (ck, fam, vk), idx in groups.items():
        rec = collapse(idx)
        rec.update(dict(zip(roles.cell, ck)))
        rec.update(dict(zip(keys_v, vk)))
        rec["family"] = fam
        recs.append(rec)
    if complete and recs:
        others = [a for a in roles.cell if a not in ("page_size", "top_k")]
        seen = {(k[0], k[1]) for k in groups}
        o_combos = {tuple(ck[roles.cell.index(a)] for a in others) for ck, _, _ in groups}
        pages = {ck[roles.cell.index("page_size")] for ck, _, _ in groups}
        topks = {ck[roles.cell.index("top_k")] for ck, _, _ in groups}
        for o in o_combos:
            for p in pages:
                for k in topks:
                    vals = dict(zip(others, o), page_size=p, top_k=k)
                    ck = tuple(vals[a] for a in roles.cell)
                    for fam in roles.families:
                        if (ck, fam) not in seen:
                            rec = {c: None for c in d.columns}
                            rec.update(vals, family=fam, status=MISSING, n_rows=0)
                            recs.append(rec)
    cols = list(roles.cell) + ["family"] + keys_v
    out = pd.DataFrame(recs)
    if out.empty:
        return out
    out = out[cols + [c for c in out.columns if c not in cols]]
    order = sorted(range(len(out)), key=lambda i: _sort_key(
        tuple(_py(out.iloc[i][c]) for c in cols)))
    return out.iloc[order].reset_index(drop=True)


def outcome(ratio: float, tol: float = 0.05) -> str:
    """Which backend a latency ratio (hisparse / flashmla_sparse) favours: BASE when it exceeds
    1 + tol, COORD when below 1 / (1 + tol), 'tie' between, '' when not finite."""
    if ratio is None or not np.isfinite(ratio):
        return ""
    if ratio > 1 + tol:
        return BASE
    if ratio < 1 / (1 + tol):
        return COORD
    return "tie"


def _first_finite(recs: Sequence[Mapping], column: str) -> float:
    """The first finite value of ``column`` among ``recs``; NaN when none has one."""
    for rec in recs:
        v = number(rec, column)
        if np.isfinite(v):
            return v
    return float("nan")


def _variant_names(roles: AxisRoles, fam: str) -> Dict[str, str]:
    """Column name of each of ``fam``'s variant axes in side-by-side tables: ``<family>.<axis>``
    for ``backend`` and for an axis that is a variant of more than one family, else the axis."""
    shared = {a for f in roles.families if f != fam for a in roles.variants.get(f, [])}
    return {a: (f"{fam}.{a}" if a in shared or a == "backend" else a) for a in roles.variants.get(fam, [])}


def tradeoff_table(pb: pd.DataFrame, roles: AxisRoles, latency_col: str = "latency_us_median",
                   other: str = COORD) -> Optional[pd.DataFrame]:
    """The side-by-side table of ``other`` (hisparse by default, or hisparse_connector) against
    flashmla_sparse, one row per cell (x variants of both), from ``per_backend_table``.

    Returns None when the run does not hold both families. ``ratio`` = other / flashmla_sparse
    latency (< 1: other faster); ``winner`` is the backend with the lower median when both are
    ok, '<ok backend> (<other> <status>)' when the other failed for a design reason
    (``DESIGN_FAILURES``: oom, invalid), '-' otherwise (missing, error, unavailable, incorrect);
    ``separated`` is True when the two p10-p90 bands do not overlap. Columns of ``other`` carry
    its name (``<other>_us``, ``<other>_h2d_MB``, ``<other>_hit_rate``, ...).
    """
    C = other
    if pb is None or pb.empty or not all((pb["family"] == f).any() for f in (BASE, C)):
        return None
    name_b, name_c = _variant_names(roles, BASE), _variant_names(roles, C)
    cells: Dict[tuple, Dict[str, List[Mapping]]] = {}
    for rec in pb.to_dict("records"):
        ck = tuple(_py(rec.get(a)) for a in roles.cell)
        cells.setdefault(ck, {}).setdefault(rec["family"], []).append(rec)
    rows = []
    for ck in sorted(cells, key=_sort_key):
        fams = cells[ck]
        for b in fams.get(BASE, [{"status": MISSING}]):
            for c in fams.get(C, [{"status": MISSING}]):
                row: Dict[str, object] = dict(zip(roles.cell, ck))
                row.update({n: _py(b.get(a)) for a, n in name_b.items()})
                row.update({n: _py(c.get(a)) for a, n in name_c.items()})
                bs, cs = b.get("status") or MISSING, c.get("status") or MISSING
                bu, cu = number(b, latency_col), number(c, latency_col)
                row[f"{BASE}_status"], row[f"{C}_status"] = bs, cs
                row[f"{BASE}_us"], row[f"{C}_us"] = bu, cu
                for fam, rec in ((BASE, b), (C, c)):
                    for q in ("p10", "p90"):
                        row[f"{fam}_{q}_us"] = (number(rec, f"latency_us_{q}")
                                                if latency_col == "latency_us_median" else float("nan"))
                both = bs == "ok" and cs == "ok" and np.isfinite(bu) and np.isfinite(cu) and bu > 0
                row["ratio"] = cu / bu if both else float("nan")
                if both:
                    row["winner"] = BASE if bu < cu else C if cu < bu else "tie"
                    sep = (row[f"{C}_p90_us"] < row[f"{BASE}_p10_us"]
                           or row[f"{BASE}_p90_us"] < row[f"{C}_p10_us"])
                    row["separated"] = bool(sep)
                else:
                    row["winner"] = "-"
                    for fam, st, oth, ost in ((BASE, bs, C, cs), (C, cs, BASE, bs)):
                        if st == "ok" and ost in DESIGN_FAILURES:
                            row["winner"] = f"{fam} ({oth} {ost})"
                    row["separated"] = None
                row[f"{BASE}_hbm_MB"] = number(b, "hbm_MB")
                row[f"{C}_hbm_MB"] = number(c, "hbm_MB")
                row[f"{C}_h2d_MB"] = number(c, "h2d_MB")
                row["pages_touched_per_req"] = _first_finite((c, b), "pages_touched_per_req")
                row[f"{C}_pages_loaded_per_req"] = number(c, "pages_loaded_per_req")
                row[f"{C}_tokens_loaded_per_req"] = number(c, "tokens_loaded_per_req")
                row["amp_pages"] = _first_finite((c, b), "amp_pages")
                row["page_coverage"] = _first_finite((c, b), "page_coverage")
                row[f"{BASE}_amp_hbm"] = number(b, "amp_hbm")
                row[f"{C}_amp_h2d"] = number(c, "amp_h2d")
                row[f"{C}_hit_rate"] = number(c, "hit_rate")
                if C == CONNECTOR:
                    row[f"{C}_resident_page_share"] = number(c, "resident_page_share")
                for st_col in STAGE_COLS:
                    row[f"{C}_{st_col}"] = number(c, st_col)
                    row[f"{BASE}_{st_col}"] = number(b, st_col)
                row[f"{BASE}_error"] = b.get("error")
                row[f"{C}_error"] = c.get("error")
                rows.append(row)
    return pd.DataFrame(rows)


#: the connector's pairwise columns renamed when they join the hisparse table
CONNECTOR_PAIR_NAMES = {"ratio": "connector_ratio", "winner": "connector_winner",
                        "separated": "connector_separated"}


def tradeoff_tables(pb: pd.DataFrame, roles: AxisRoles, latency_col: str = "latency_us_median"
                    ) -> Tuple[Optional[pd.DataFrame], Dict[str, pd.DataFrame]]:
    """``(trade, pairs)``. ``pairs`` maps each family present beside flashmla_sparse (hisparse,
    hisparse_connector) to its ``tradeoff_table``. ``trade`` is the report's table: hisparse vs
    flashmla_sparse (``ratio``, ``winner``, ``separated``) with the connector's columns joined on
    the cell and flashmla_sparse's variants (``connector_ratio`` = hisparse_connector /
    flashmla_sparse, ``connector_winner``, ``connector_separated``, ``hisparse_connector_*``; a
    connector that varies within a cell repeats the hisparse row once per connector variant);
    the connector's own table, its pairwise columns renamed the same way, when the run has no
    hisparse; None when neither pair exists."""
    pairs = {f: t for f in OFFLOADING if (t := tradeoff_table(pb, roles, latency_col, other=f)) is not None}
    hs, cn = pairs.get(COORD), pairs.get(CONNECTOR)
    if cn is None:
        return hs, pairs
    if hs is None:
        return cn.rename(columns=CONNECTOR_PAIR_NAMES), pairs
    keys = list(roles.cell) + list(_variant_names(roles, BASE).values())
    own = [c for c in cn.columns if c.startswith(CONNECTOR) or c in _variant_names(roles, CONNECTOR).values()]
    joined = cn[keys + list(CONNECTOR_PAIR_NAMES) + own].rename(columns=CONNECTOR_PAIR_NAMES)
    return hs.merge(joined, on=keys, how="left"), pairs


def failures(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose status is not 'ok': backend, the axes, status and error."""
    bad = df[df["status"] != "ok"] if "status" in df else df.iloc[0:0]
    cols = [c for c in ("backend", "scenario") + CELL_AXES + VARIANT_AXES[1:] if c in bad.columns
            and bad[c].notna().any()]
    return bad[cols + ["status", "error"]].reset_index(drop=True)


# --------------------------------------------------------------------------- formatting

def fmt(v: object, digits: int = 3) -> str:
    """A compact cell for Markdown: '' for NA, ints without decimals, floats to ``digits``
    significant figures."""
    if is_missing(v):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isinf(f):
            return "inf"
        if f.is_integer() and abs(f) < 1e9:
            return str(int(f))
        return f"{f:.{digits}g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def to_markdown(df: Optional[pd.DataFrame], columns: Optional[Iterable[str]] = None,
                headers: Optional[Mapping[str, str]] = None, max_rows: int = 500) -> str:
    """A GitHub-flavoured Markdown table of ``columns`` of ``df`` (all when None)."""
    if df is None or df.empty:
        return "_(no rows)_\n"
    cols = [c for c in (columns or df.columns) if c in df.columns]
    headers = headers or {}
    lines = ["| " + " | ".join(headers.get(c, c) for c in cols) + " |",
             "|" + "|".join("---" for _ in cols) + "|"]
    for rec in df[cols].head(max_rows).to_dict("records"):
        lines.append("| " + " | ".join(fmt(rec[c]) for c in cols) + " |")
    if len(df) > max_rows:
        lines.append(f"\n_({len(df) - max_rows} more rows in the CSV)_")
    return "\n".join(lines) + "\n"
