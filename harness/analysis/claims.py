"""The seed article's claims, checked against the data.

Each check returns a ``Claim`` whose verdict is one of ``holds``, ``does not hold``,
``depends on <axis>`` (with the boundary found in ``detail``) or ``not enough data`` (with the
cells needed in ``detail``), and ``evidence`` with the numbers behind it.

A cell *favours* a backend when its latency ratio hisparse / flashmla_sparse is beyond
1 +- ``tol`` (default 5 %); within that it is a tie, which favours neither. Only cells where both
backends are ``ok`` count. Latencies are µs per decode layer step of the whole batch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from .model import expected_pages_uniform
from .rows import measured_layer_steps, num
from .tables import BASE, COORD, AxisRoles, _py, _sort_key, fmt, outcome

HOLDS, FAILS, DEPENDS, NO_DATA = "holds", "does not hold", "depends on", "not enough data"
DEFAULT_TOL = 0.05
#: claim (c): "about 2-4 pages" accepted as a median of 1.5 to 4.5 pages per request per layer step
PAGES_LO, PAGES_HI = 1.5, 4.5
#: claim (d): "most pages selected" = pages touched >= this fraction of the context's pages
MOST_PAGES = 0.5

_WORDS = {BASE: "flashmla_sparse faster", COORD: "hisparse faster", "tie": "tie (within tolerance)",
          True: "within range", False: "outside range"}


@dataclass
class Claim:
    key: str
    claim: str
    verdict: str
    detail: str
    evidence: str


def claims_frame(claims: Sequence[Claim]) -> pd.DataFrame:
    return pd.DataFrame([asdict(c) for c in claims])


def find_boundary(rows: pd.DataFrame, result: str, axes: Sequence[str],
                  continuous: Sequence[str] = ()) -> Optional[Tuple[str, str]]:
    """(axis, description) of the first axis whose value alone determines ``rows[result]``.

    A numeric axis with a single change point gives a threshold ('axis <= a: X; axis >= b: Y');
    otherwise a value-to-result mapping is given, except for ``continuous`` axes, which only
    count with a single threshold. Threshold axes are preferred. None when no axis separates.
    """
    mappings = []
    for axis in axes:
        if axis not in rows.columns:
            continue
        vals = [_py(v) for v in rows[axis]]
        if len(set(vals)) < 2:
            continue
        m: Dict[object, set] = {}
        for v, o in zip(vals, rows[result]):
            m.setdefault(v, set()).add(o)
        if any(len(s) > 1 for s in m.values()):
            continue
        m1 = {v: next(iter(s)) for v, s in m.items()}
        order = sorted(m1, key=lambda v: _sort_key([v]))
        numeric = all(isinstance(v, (int, float)) for v in order)
        if numeric:
            outs = [m1[v] for v in order]
            change = [i for i in range(1, len(outs)) if outs[i] != outs[i - 1]]
            if len(change) == 1:
                i = change[0]
                return axis, (f"{axis} <= {fmt(order[i - 1])}: {_WORDS.get(outs[0], outs[0])}; "
                              f"{axis} >= {fmt(order[i])}: {_WORDS.get(outs[i], outs[i])}")
        if axis not in continuous:
            mappings.append((axis, "; ".join(f"{axis}={v}: {_WORDS.get(m1[v], m1[v])}" for v in order)))
    return mappings[0] if mappings else None


def _both_ok(trade: Optional[pd.DataFrame]) -> pd.DataFrame:
    if trade is None or trade.empty:
        return pd.DataFrame()
    return trade[np.isfinite(num(trade["ratio"]))]


def _axes_of(rows: pd.DataFrame, roles: AxisRoles, skip: Sequence[str]) -> List[str]:
    cols = [c for c in roles.cell if c not in skip]
    cols += [c for c in rows.columns if (c in roles.variant_columns() or "." in c) and c not in cols]
    return cols


def _ratio_evidence(rows: pd.DataFrame, what: str, tol: float) -> str:
    r = num(rows["ratio"])
    outs = rows["_outcome"]
    return (f"{len(rows)} cell(s) {what} with both backends ok: latency ratio hisparse/flashmla_sparse "
            f"{r.min():.3g}-{r.max():.3g} (median {r.median():.3g}); flashmla_sparse faster in "
            f"{int((outs == BASE).sum())}, hisparse faster in {int((outs == COORD).sum())}, "
            f"within +-{tol:.0%} in {int((outs == 'tie').sum())}")


def _verdict(rows: pd.DataFrame, expect: str, roles: AxisRoles, skip: Sequence[str],
             continuous: Sequence[str] = ()) -> Tuple[str, str]:
    n_exp = int((rows["_outcome"] == expect).sum())
    if n_exp == len(rows):
        return HOLDS, ""
    if n_exp == 0:
        return FAILS, ""
    axes = _axes_of(rows, roles, skip) + list(continuous)
    b = find_boundary(rows, "_outcome", axes, continuous)
    if b:
        return f"{DEPENDS} {b[0]}", b[1]
    cells = "; ".join(
        ", ".join(f"{a}={_py(r[a])}" for a in _axes_of(rows, roles, skip)) + f" -> {_WORDS.get(r['_outcome'], r['_outcome'])}"
        for _, r in rows.iterrows())
    return f"{DEPENDS} several axes", f"no single axis separates the cells: {cells}"


def _statuses_at(trade: Optional[pd.DataFrame], page: int, k: int) -> str:
    if trade is None or trade.empty:
        return "the run does not hold both backends"
    at = trade[(num(trade["page_size"]) == page) & (num(trade["top_k"]) == k)]
    if at.empty:
        return f"the sweep has no page_size={page}, top_k={k} cell"
    st = sorted({f"{BASE} {a} / {COORD} {b}" for a, b in zip(at[f"{BASE}_status"], at[f"{COORD}_status"])})
    return "statuses there: " + "; ".join(st)


def claim_favours(trade: Optional[pd.DataFrame], roles: AxisRoles, key: str, page: int, k: int,
                  expect: str, text: str, tol: float = DEFAULT_TOL) -> Claim:
    """Claims (a)/(b): the cells at (page, k) favour ``expect``."""
    rows = _both_ok(trade)
    if not rows.empty:
        rows = rows[(num(rows["page_size"]) == page) & (num(rows["top_k"]) == k)]
    if rows.empty:
        return Claim(key, text, NO_DATA,
                     f"needs both backends ok at page_size={page}, top_k={k} "
                     f"({_statuses_at(trade, page, k)})", "")
    rows = rows.assign(_outcome=[outcome(r, tol) for r in num(rows["ratio"])])
    verdict, detail = _verdict(rows, expect, roles, ("page_size", "top_k"))
    return Claim(key, text, verdict, detail, _ratio_evidence(rows, f"at page {page} / top-k {k}", tol))


def claim_clustered_pages(df: pd.DataFrame, roles: AxisRoles, steps: Optional[pd.DataFrame] = None,
                          page: int = 256, k: int = 512, key: str = "c") -> Claim:
    """Claim (c): clustered top-``k`` at page ``page`` touches about 2-4 pages per request per
    layer step. Uses the per-step table when given (median and p90 over measured steps),
    otherwise pages_touched / ((steps - warmup_steps) * num_layers * batch_size)."""
    text = (f"With highly clustered selections, top-{k} at page {page} touches only about 2-4 pages "
            "(per request per layer step)")
    pats = sorted({str(p) for p in df.get("pattern", pd.Series(dtype=object)).dropna()})
    sel = df[df["pattern"].astype("string").str.contains("cluster", case=False, na=False)
             & (num(df["page_size"]) == page) & (num(df["top_k"]) == k)
             & num(df["pages_touched"]).notna()] if "pattern" in df else df.iloc[0:0]
    if sel.empty:
        return Claim(key, text, NO_DATA,
                     f"needs a clustered pattern (name containing 'cluster') at page_size={page}, "
                     f"top_k={k} with pages_touched counted; patterns in the run: {pats or 'none'}", "")
    per = num(sel["pages_touched"]) / (measured_layer_steps(sel) * num(sel["batch_size"]))
    sel = sel.assign(_pages=per)
    dist: Dict[int, Tuple[float, float, int]] = {}
    if steps is not None and not steps.empty and "job_dir" in sel:
        st = steps[~steps["warmup"].fillna(False).astype(bool)] if "warmup" in steps else steps
        for i, r in sel.iterrows():
            v = num(st[(st["job_dir"] == r["job_dir"]) & (st["backend"] == r["backend"])]["pages_touched"]).dropna()
            if len(v):
                dist[i] = (float(v.median()), float(v.quantile(0.9)), len(v))
    group_axes = [c for c in roles.cell if c not in ("page_size", "top_k", "device") and c in sel]
    groups: Dict[tuple, List[int]] = {}
    for i, r in sel.iterrows():
        groups.setdefault(tuple(_py(r[a]) for a in group_axes), []).append(i)
    recs, ev = [], []
    for g in sorted(groups, key=_sort_key):
        idx = groups[g]
        have = [dist[i] for i in idx if i in dist]
        med = float(np.median([h[0] for h in have])) if have else float(sel.loc[idx, "_pages"].median())
        src = (f"median over {sum(h[2] for h in have)} per-step rows, p90 {np.median([h[1] for h in have]):.3g}"
               if have else "mean over measured steps x layers x requests")
        N = _py(sel.loc[idx[0], "context_len"])
        uni = f"; uniform-random expectation {expected_pages_uniform(N, k, page):.3g}" if N else ""
        lab = ", ".join(f"{a}={v}" for a, v in zip(group_axes, g))
        ev.append(f"{lab}: {med:.3g} pages ({src}){uni}")
        rec = dict(zip(group_axes, g))
        rec["_outcome"] = bool(PAGES_LO <= med <= PAGES_HI)
        recs.append(rec)
    rows = pd.DataFrame(recs)
    n_in = int(rows["_outcome"].sum())
    if n_in == len(rows):
        verdict, detail = HOLDS, ""
    elif n_in == 0:
        verdict, detail = FAILS, ""
    else:
        b = find_boundary(rows, "_outcome", group_axes)
        verdict, detail = (f"{DEPENDS} {b[0]}", b[1]) if b else (f"{DEPENDS} several axes", "")
    return Claim(key, text, verdict,
                 detail or f"'about 2-4' accepted as a median of {PAGES_LO}-{PAGES_HI} pages",
                 "; ".join(ev))


def claim_translation_loss(trade: Optional[pd.DataFrame], roles: AxisRoles, key: str = "d",
                           tol: float = DEFAULT_TOL, most: float = MOST_PAGES) -> Claim:
    """Claim (d): where most pages are selected anyway (pages touched >= ``most`` of the
    context's pages), the coordinator's translation and swap-in are a net loss, i.e. hisparse is
    slower than flashmla_sparse."""
    text = "The coordinator's translation cost is a net loss when most pages are selected anyway"
    allrows = _both_ok(trade)
    if allrows.empty:
        return Claim(key, text, NO_DATA, "needs cells where both backends are ok", "")
    cov = num(allrows["page_coverage"])
    rows = allrows[cov >= most]
    if rows.empty:
        mx = cov.max()
        return Claim(key, text, NO_DATA,
                     f"needs cells with both backends ok where pages touched >= {most:.0%} of the "
                     f"context's pages (e.g. pattern=random with large pages or short context); "
                     f"highest coverage in the run: {'n/a' if not np.isfinite(mx) else f'{mx:.1%}'}", "")
    rows = rows.assign(_outcome=[outcome(r, tol) for r in num(rows["ratio"])])
    verdict, detail = _verdict(rows, BASE, roles, (), continuous=("page_coverage",))
    gap = num(rows[f"{COORD}_us"]) - num(rows[f"{BASE}_us"])
    tr = num(rows[f"{COORD}_stage_transform_us"]) + num(rows[f"{COORD}_stage_swap_in_us"]).fillna(0)
    ev = _ratio_evidence(rows, f"with page coverage >= {most:.0%} (coverage {num(rows['page_coverage']).min():.0%}"
                         f"-{num(rows['page_coverage']).max():.0%})", tol)
    ev += f"; latency gap hisparse - flashmla_sparse median {gap.median():.3g} µs"
    if np.isfinite(tr).any():
        ev += f"; hisparse transform + swap-in median {tr.median():.3g} µs"
    a2 = allrows.assign(_outcome=[outcome(r, tol) for r in num(allrows["ratio"])])
    b = find_boundary(a2, "_outcome", ["page_coverage"], continuous=("page_coverage",))
    if b:
        ev += f"; over all {len(a2)} cells: {b[1]}"
    return Claim(key, text, verdict, detail, ev)


def check_claims(trade: Optional[pd.DataFrame], df: pd.DataFrame, roles: AxisRoles,
                 steps: Optional[pd.DataFrame] = None, tol: float = DEFAULT_TOL) -> List[Claim]:
    """All four claims. ``trade`` from ``tables.tradeoff_table``; ``df`` the raw results;
    ``steps`` the optional per-step table (``harness.results.load(path, steps=True)``)."""
    return [
        claim_favours(trade, roles, "a", 16, 2048, BASE,
                      "Small pages (16) with large top-k (2048) favour the vLLM-style path", tol),
        claim_favours(trade, roles, "b", 256, 512, COORD,
                      "Large pages (256) with small top-k (512) favour the coordinator path", tol),
        claim_clustered_pages(df, roles, steps),
        claim_translation_loss(trade, roles, tol=tol),
    ]
