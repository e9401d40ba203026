"""Figures of the trade-off, built with matplotlib's object API (no pyplot state), so they
render with Agg in the report and inline in the notebook.

Every builder returns a ``FigureSet``: zero or more (name, Figure) pairs and a note saying why
the set is empty or truncated. Units: latency in µs per decode layer step of the whole batch;
page size and top-k in tokens; amplification dimensionless; hit rate as a fraction.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import NullLocator

from .rows import num
from .tables import BASE, COORD, OFFLOADING, AxisRoles, _py, _sort_key

MAX_FIGURES = 12   #: per kind; further combinations are listed in the note
STAGES = (("stage_select_us", "select (indexer + top-k)"), ("stage_transform_us", "transform"),
          ("stage_swap_in_us", "swap-in (H2D)"), ("stage_resolve_us", "resolve (resident/hot/H2D)"),
          ("stage_attention_us", "attention"))
STAGE_COLORS = ("#4c72b0", "#dd8452", "#c44e52", "#8172b3", "#55a868")
HATCHES = ("", "///", "...", "xxx", "\\\\", "+++", "ooo", "---")


@dataclass
class FigureSet:
    """Figures of one kind. ``note`` explains a skip or a truncation ('' when complete)."""

    kind: str
    title: str
    figures: List[Tuple[str, Figure]] = field(default_factory=list)
    note: str = ""


def _slug(vals: Dict[str, object]) -> str:
    s = "__".join(f"{k}={v}" for k, v in vals.items())
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", s)[:120]


def _label(vals: Dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in vals.items())


def _varying(df: pd.DataFrame, cols: Sequence[str]) -> List[str]:
    return [c for c in cols if c in df.columns and len({_py(v) for v in df[c]}) > 1]


def _split(df: pd.DataFrame, cols: Sequence[str]) -> List[Tuple[Dict[str, object], pd.DataFrame]]:
    """(values, rows) for each observed combination of the columns of ``cols`` that vary."""
    cols = _varying(df, cols)
    if not cols:
        return [({}, df)]
    keys = [tuple(_py(v) for v in t) for t in df[cols].itertuples(index=False)]
    out = []
    for k in sorted(set(keys), key=_sort_key):
        mask = [kk == k for kk in keys]
        out.append((dict(zip(cols, k)), df[mask]))
    return out


def _split_wild(df: pd.DataFrame, cols: Sequence[str], wild: Sequence[str]):
    """Like ``_split`` over ``cols`` + ``wild``, but a missing (None) value of a ``wild`` column
    (a backend variant of a cell where that backend has no row) matches every combination."""
    out = []
    for vals, sub in _split(df, cols):
        w = _varying(sub, wild)
        keys = [tuple(_py(v) for v in t) for t in sub[w].itertuples(index=False)] if w else []
        combos = sorted({k for k in keys if all(v is not None for v in k)}, key=_sort_key)
        if not combos:
            out.append((vals, sub))
            continue
        for combo in combos:
            mask = [all(kv is None or kv == cv for kv, cv in zip(k, combo)) for k in keys]
            out.append(({**vals, **dict(zip(w, combo))}, sub[mask]))
    return out


def _cap(fs: FigureSet, combos: list) -> list:
    if len(combos) > MAX_FIGURES:
        fs.note = (f"{len(combos) - MAX_FIGURES} further combinations not drawn "
                   f"(slice the run in the notebook): " + "; ".join(_label(v) for v, _ in combos[MAX_FIGURES:]))
    return combos[:MAX_FIGURES]


def _series_label(rec: dict, roles: AxisRoles) -> str:
    fam = rec["family"]
    extra = [f"{a}={_py(rec.get(a))}" for a in roles.variants.get(fam, []) if a != "backend"]
    name = str(rec.get("backend") or fam) if "backend" in roles.variants.get(fam, []) else fam
    return name + (f" ({', '.join(extra)})" if extra else "")


def _grid(n: int) -> Tuple[int, int]:
    cols = min(n, 3)
    return (n + cols - 1) // cols, cols


def _value_ticks(ax, values) -> None:
    """x ticks at the given values, labelled as plain numbers (not 2^n)."""
    v = sorted({float(x) for x in pd.Series(values).dropna()})
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(v, [f"{x:g}" for x in v])


def _ok(pb: pd.DataFrame) -> pd.DataFrame:
    return pb[pb["status"] == "ok"] if pb is not None and not pb.empty else pd.DataFrame()


# --------------------------------------------------------------------------- heatmap

#: ratios labelled on a heatmap's colour bar where they fall inside its range
NICE_RATIOS = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 2 / 3, 1, 1.5, 2, 4, 8, 16, 32, 64)


def ratio_ticks(lim: float) -> List[float]:
    """Colour-bar ticks (ratios) of a heatmap coloured by log2(ratio) over [-lim, lim]: both
    ends, labelled with the ratio they stand for (so the largest cell's ratio, which sets
    ``lim``, is on the bar), and the ``NICE_RATIOS`` inside, less those within 0.25 (in log2)
    of an end."""
    inner = [r for r in NICE_RATIOS if abs(np.log2(r)) < lim - 0.25]
    return [2.0 ** -lim, *inner, 2.0 ** lim]


def ratio_heatmaps(trade: Optional[pd.DataFrame], roles: AxisRoles, other: str = COORD) -> FigureSet:
    """Heatmap of ``other`` / flashmla_sparse median latency over page_size x top_k, one panel
    per pattern; one figure per combination of the other varying axes. ``trade``: the pair's
    ``tables.tradeoff_table``. Failed or missing cells are grey with their status."""
    stem = "ratio_heatmap" if other == COORD else f"ratio_heatmap_{other}"
    fs = FigureSet(stem, f"Latency ratio {other} / {BASE} over page size x top-k")
    if trade is None or trade.empty:
        fs.note = "needs both backends in the run"
        return fs
    if not np.isfinite(num(trade["ratio"])).any():
        fs.note = "no cell where both backends are ok"
        return fs
    split_axes = [c for c in trade.columns if c in roles.cell and c not in ("page_size", "top_k", "pattern")]
    variants = [c for c in trade.columns if c in roles.variant_columns() or "." in c]
    all_pages = sorted({_py(v) for v in trade["page_size"]}, key=lambda v: _sort_key([v]))
    all_ks = sorted({_py(v) for v in trade["top_k"]}, key=lambda v: _sort_key([v]))
    for vals, sub in _cap(fs, _split_wild(trade, split_axes, variants)):
        pats = _split(sub, ["pattern"]) if "pattern" in roles.cell else [({}, sub)]
        nr, nc = _grid(len(pats))
        fig = Figure(figsize=(5.2 * nc, 4.2 * nr), layout="constrained")
        axes = fig.subplots(nr, nc, squeeze=False).ravel()
        r = num(sub["ratio"])
        lim = max(1.0, float(np.nanmax(np.abs(np.log2(r[r > 0]))))) if (r > 0).any() else 1.0
        im = None
        for ax, (pv, ps) in zip(axes, pats):
            pages, ks = all_pages, all_ks
            m = np.full((len(pages), len(ks)), np.nan)
            text = [["missing" for _ in ks] for _ in pages]
            for rec in ps.to_dict("records"):
                i, j = pages.index(_py(rec["page_size"])), ks.index(_py(rec["top_k"]))
                rv = rec["ratio"]
                if rv is not None and np.isfinite(rv) and rv > 0:
                    m[i, j] = np.log2(rv)
                    text[i][j] = f"{rv:.2f}"
                else:
                    bad = [f"{fam}:\n{rec[f'{fam}_status']}" for fam in (BASE, other)
                           if rec[f"{fam}_status"] != "ok"]
                    text[i][j] = "\n".join(bad) or "n/a"
            ax.set_facecolor("#d0d0d0")
            im = ax.imshow(np.ma.masked_invalid(m), cmap="coolwarm", vmin=-lim, vmax=lim,
                           origin="lower", aspect="auto")
            for i in range(len(pages)):
                for j in range(len(ks)):
                    ax.text(j, i, text[i][j], ha="center", va="center",
                            fontsize=8 if np.isfinite(m[i, j]) else 6.5)
            ax.set_xticks(range(len(ks)), [str(k) for k in ks])
            ax.set_yticks(range(len(pages)), [str(p) for p in pages])
            ax.set_xlabel("top-k (tokens)")
            ax.set_ylabel("page size (tokens)")
            ax.set_title(_label(pv) or "latency ratio")
        for ax in axes[len(pats):]:
            ax.set_visible(False)
        if im is not None:
            cb = fig.colorbar(im, ax=list(axes[:len(pats)]), shrink=0.9)
            ticks = ratio_ticks(lim)
            cb.set_ticks(np.log2(ticks))
            cb.set_ticklabels([f"{t:.2g}" for t in ticks])
            cb.set_label(f"latency {other} / {BASE}\n(<1: {other} faster, >1: {BASE} faster)")
        fig.suptitle(f"Decode layer step latency ratio, {other} / {BASE}"
                     + (f"\n{_label(vals)}" if vals else ""))
        fs.figures.append((f"{stem}{'__' + _slug(vals) if vals else ''}", fig))
    return fs


# --------------------------------------------------------------------------- per-page panels

def _page_panels(fs: FigureSet, ok: pd.DataFrame, roles: AxisRoles, panel: tuple):
    """One figure per combination of the cell axes other than page_size / top_k, one panel per
    page size. Yields ``(vals, sub, fig, axes, pages, labels)``; ``labels`` are the series of
    the figure, sorted."""
    other = [c for c in roles.cell if c not in ("page_size", "top_k")]
    for vals, sub in _cap(fs, _split(ok, other)):
        pages = _split(sub, ["page_size"])
        nr, nc = _grid(len(pages))
        fig = Figure(figsize=(panel[0] * nc, panel[1] * nr), layout="constrained")
        axes = fig.subplots(nr, nc, squeeze=False).ravel()
        labels = sorted({_series_label(r, roles) for r in sub.to_dict("records")})
        yield vals, sub, fig, axes, pages, labels


def _finish(fs: FigureSet, fig, axes, pages, vals, stem: str, title: str) -> None:
    """Hides unused panels, titles the figure and adds it to ``fs``."""
    for ax in axes[len(pages):]:
        ax.set_visible(False)
    fig.suptitle(title + (f"\n{_label(vals)}" if vals else ""))
    fs.figures.append((f"{stem}{'__' + _slug(vals) if vals else ''}", fig))


# --------------------------------------------------------------------------- latency vs top-k

def latency_vs_topk(pb: pd.DataFrame, roles: AxisRoles) -> FigureSet:
    """Median latency vs top-k per backend (and variant) with the p10-p90 band, one panel per
    page size, one figure per combination of the other varying cell axes."""
    fs = FigureSet("latency_vs_topk", "Latency vs top-k per backend (p10-p90 bands)")
    ok = _ok(pb)
    if ok.empty or not np.isfinite(num(ok["latency_us_median"])).any():
        fs.note = "no ok rows with a latency"
        return fs
    if len({_py(v) for v in ok["top_k"]}) < 2:
        fs.note = "needs at least two top_k values"
        return fs
    for vals, sub, fig, axes, pages, names in _page_panels(fs, ok, roles, (5.0, 3.8)):
        for ax, (pv, ps) in zip(axes, pages):
            series: Dict[str, list] = {}
            for rec in ps.to_dict("records"):
                series.setdefault(_series_label(rec, roles), []).append(rec)
            for name, recs in sorted(series.items()):
                i = names.index(name)
                recs = sorted(recs, key=lambda r: r["top_k"])
                x = np.array([r["top_k"] for r in recs], dtype=float)
                y = np.array([r["latency_us_median"] for r in recs], dtype=float)
                lo = np.array([r.get("latency_us_p10") for r in recs], dtype=float)
                hi = np.array([r.get("latency_us_p90") for r in recs], dtype=float)
                color = f"C{i}"
                ax.plot(x, y, "o-", color=color, label=name)
                if np.isfinite(lo).any() and np.isfinite(hi).any():
                    ax.fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)
            ax.set_xscale("log", base=2)
            _value_ticks(ax, ps["top_k"])
            ax.set_xlabel("top-k (tokens)")
            ax.set_ylabel("latency per decode layer step (µs)")
            ax.set_title(_label(pv) if pv else f"page_size={_py(ps['page_size'].iloc[0])}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, title="median, band p10-p90", title_fontsize=7)
        _finish(fs, fig, axes, pages, vals, "latency_vs_topk", "Latency vs top-k")
    return fs


# --------------------------------------------------------------------------- amplification

def amplification_vs_page(pb: pd.DataFrame, roles: AxisRoles) -> FigureSet:
    """Page amplification (tokens in the pages touched / tokens selected) vs page size, per
    pattern, beside two lines computed from the rows' own lengths (``tables.derive``): the upper
    bound no selection can exceed, min(P, P x context pages / tokens selected)
    (``model.page_amplification_bound``: a touched page holds at least one selected token, and no
    more pages are touched than the context has, decode tokens included; the line is the largest
    bound of the panel's rows at each page size), and the uniform-random expectation E[pages] x
    P / k at the same lengths (not a bound: random selections scatter around it); 1x is the
    ideal. The offloading designs' loaded amplification (tokens loaded / tokens selected, after
    their hot buffers; the connector's resident pages load nothing) as hollow markers. One panel
    per top-k, one figure per context length."""
    fs = FigureSet("amplification", "Page amplification vs page size, with its upper bound and the "
                   "uniform-random expectation")
    d = pb[pb["status"].isin(["ok", "incorrect"])] if pb is not None and not pb.empty else pd.DataFrame()
    if d.empty or not np.isfinite(num(d["amp_pages"])).any():
        fs.note = "needs rows with pages_touched and tokens_selected"
        return fs
    d = d[np.isfinite(num(d["amp_pages"])) & num(d["context_len"]).notna()]
    for vals, sub in _cap(fs, _split(d, ["context_len"])):
        N = int(_py(sub["context_len"].iloc[0]))
        ks = _split(sub, ["top_k"])
        nr, nc = _grid(len(ks))
        fig = Figure(figsize=(5.0 * nc, 3.9 * nr), layout="constrained")
        axes = fig.subplots(nr, nc, squeeze=False).ravel()
        for ax, (kv, ksub) in zip(axes, ks):
            k = int(_py(ksub["top_k"].iloc[0]))
            by_page = ksub.groupby(num(ksub["page_size"]))
            bound = by_page["amp_pages_bound"].max()
            ax.plot(bound.index, bound.values.astype(float), "-", color="0.45", lw=2,
                    label="upper bound: each selected token on its own page, at most the context")
            uniform = by_page["amp_pages_uniform"].median()
            if np.isfinite(uniform.values.astype(float)).any():
                ax.plot(uniform.index, uniform.values.astype(float), "k--",
                        label="uniform-random expectation")
            ax.axhline(1.0, color="k", linestyle=":", label="ideal (1x)")
            for i, (pv, psub) in enumerate(_split(ksub, ["pattern"])):
                name = psub["pattern"].iloc[0] if "pattern" in psub else "selection"
                g = psub.groupby(num(psub["page_size"]))
                touched = g["amp_pages"].median()
                ax.plot(touched.index, touched.values, "o-", color=f"C{i}", label=f"{name}: pages touched")
                for fam, mark in zip(OFFLOADING, ("o--", "s:")):
                    hs = psub[psub["family"] == fam]
                    loaded = hs.groupby(num(hs["page_size"]))["amp_loaded"].median() if not hs.empty else None
                    if loaded is not None and np.isfinite(loaded.values.astype(float)).any():
                        ax.plot(loaded.index, loaded.values, mark, mfc="none", color=f"C{i}",
                                label=f"{name}: loaded by {fam} (median over variants)")
            ax.set_xscale("log", base=2)
            _value_ticks(ax, bound.index)
            ax.set_yscale("log")
            ax.set_xlabel("page size (tokens)")
            ax.set_ylabel("tokens moved / tokens selected (x)")
            ax.set_title(f"top_k={k}, context={N}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        for ax in axes[len(ks):]:
            ax.set_visible(False)
        fig.suptitle(f"Page amplification vs page size (prompt {N} tokens, plus the decode steps)")
        fs.figures.append((f"amplification__context_len={N}", fig))
    return fs


# --------------------------------------------------------------------------- stage breakdown

def stage_breakdown(pb: pd.DataFrame, roles: AxisRoles) -> FigureSet:
    """Stacked per-stage medians (select, transform, swap-in, attention) per backend and top-k,
    one panel per page size, with the measured total median as a black tick (stage medians need
    not add up to the median total)."""
    fs = FigureSet("stage_breakdown", "Per-stage breakdown (stacked medians)")
    ok = _ok(pb)
    cols = [c for c, _ in STAGES if c in ok.columns]
    if ok.empty or not cols or not np.isfinite(ok[cols].astype(float).to_numpy()).any():
        fs.note = "no ok rows with per-stage times"
        return fs
    for vals, sub, fig, axes, pages, labels in _page_panels(fs, ok, roles, (5.5, 4.0)):
        for ax, (pv, ps) in zip(axes, pages):
            ks = sorted({_py(v) for v in ps["top_k"]}, key=lambda v: _sort_key([v]))
            width = 0.8 / max(1, len(labels))
            for li, name in enumerate(labels):
                hatch = HATCHES[li % len(HATCHES)]
                recs = [r for r in ps.to_dict("records") if _series_label(r, roles) == name]
                by_k = {_py(r["top_k"]): r for r in recs}
                x = np.arange(len(ks)) + (li - (len(labels) - 1) / 2) * width
                bottom = np.zeros(len(ks))
                for (col, sname), color in zip(STAGES, STAGE_COLORS):
                    h = np.array([float(by_k[k].get(col) or np.nan) if k in by_k else np.nan for k in ks])
                    h = np.nan_to_num(h)
                    ax.bar(x, h, width * 0.95, bottom=bottom, color=color, hatch=hatch,
                           label=sname if li == 0 else None, edgecolor="white", linewidth=0.5)
                    bottom += h
                tot = [float(by_k[k].get("latency_us_median") or np.nan) if k in by_k else np.nan for k in ks]
                ax.plot(x, tot, "_", color="k", markersize=14, markeredgewidth=2,
                        label="total (median)" if li == 0 else None)
            ax.set_xticks(range(len(ks)), [str(k) for k in ks])
            ax.set_xlabel("top-k (tokens)")
            ax.set_ylabel("time per decode layer step (µs)")
            ax.set_title(_label(pv) if pv else f"page_size={_py(ps['page_size'].iloc[0])}")
            ax.legend(fontsize=7)
        fig.legend(handles=[Patch(facecolor="white", edgecolor="black", hatch=HATCHES[i % len(HATCHES)],
                                  label=name) for i, name in enumerate(labels)],
                   loc="outside lower center", ncols=min(3, len(labels)), fontsize=7,
                   title="bar (left to right within a top-k)", title_fontsize=7)
        _finish(fs, fig, axes, pages, vals, "stage_breakdown", "Per-stage breakdown")
    return fs


# --------------------------------------------------------------------------- hit rate

#: the axes a hit-rate line may run over, in order of preference
HIT_RATE_AXES = ("device_buffer_size", "step_overlap", "top_k")


def _tied(df: pd.DataFrame, col: str, x: str) -> bool:
    """True when ``col`` takes one value per (family, ``x``) in ``df`` (e.g. the default
    device_buffer_size = 2 x top_k): a function of ``x``, not a separate line."""
    if col not in df.columns:
        return True
    return bool((df.groupby(["family", num(df[x])])[col].nunique(dropna=False) <= 1).all())


def _hit_rate_axis(hs: pd.DataFrame, roles: AxisRoles):
    """(x, line columns, figure columns) of the first ``HIT_RATE_AXES`` axis along which some
    line (design, and the other axes and the connector's resident_fraction where they vary
    within a design) has two or more points; ``None`` when every line would be a single point."""
    variants = [a for f in OFFLOADING for a in roles.variants.get(f, [])]
    for x in HIT_RATE_AXES:
        if len({_py(v) for v in hs[x]}) < 2:
            continue
        free = [c for c in HIT_RATE_AXES if c != x
                and not (x == "top_k" and c == "device_buffer_size" and _tied(hs, c, x))]
        line_cols = _varying(hs, ["family"]) + [
            c for c in (*free, "resident_fraction")
            if any(_varying(g, [c]) for _, g in hs.groupby("family"))]
        other = [c for c in dict.fromkeys(list(roles.cell) + variants)
                 if c not in (*HIT_RATE_AXES, "pattern", "batch_size", "resident_fraction")]
        lines = [ls for _, fs in _split(hs, other) for _, ls in _split(fs, line_cols)]
        if any(len({_py(v) for v in ls[x]}) >= 2 for ls in lines):
            return x, line_cols, other
    return None


def hit_rate(pb: pd.DataFrame, roles: AxisRoles) -> FigureSet:
    """Hit rate of the offloading designs (hisparse; hisparse_connector, whose resident pages
    count as hits) as lines over the first swept axis a line can run along: device_buffer_size,
    else step_overlap, else top-k (where the buffer follows top-k, e.g. its default 2 x top-k,
    the line runs over top-k with the buffer tied to it). One line per design and per value of
    the other axes and the connector's resident_fraction; one panel per pattern, one figure per
    combination of the other varying axes (e.g. page_size). A run where every line would be one
    point gets no figure and a note saying so."""
    fs = FigureSet("hit_rate", "Hit rate of the offloading designs over the swept buffer size, "
                   "step overlap or top-k")
    ok = _ok(pb)
    hs = ok[ok["family"].isin(OFFLOADING)] if not ok.empty else ok
    if hs.empty or not np.isfinite(num(hs["hit_rate"])).any():
        fs.note = "needs hisparse or hisparse_connector rows with a hit rate"
        return fs
    hs = hs[np.isfinite(num(hs["hit_rate"]))]
    axis = _hit_rate_axis(hs, roles)
    if axis is None:
        fs.note = ("every line would be a single point: the run sweeps none of "
                   f"{', '.join(HIT_RATE_AXES)} at fixed other settings of a design")
        return fs
    x, line_cols, other = axis
    combos = [(v, s) for v, s in _split(hs, other) if len({_py(x) for x in s[x]}) >= 2]
    dropped = len(_split(hs, other)) - len(combos)
    tied = x == "top_k" and "device_buffer_size" not in line_cols and _varying(hs, ["device_buffer_size"])
    for vals, sub in _cap(fs, combos):
        pats = _split(sub, ["pattern"])
        nr, nc = _grid(len(pats))
        fig = Figure(figsize=(5.0 * nc, 3.8 * nr), layout="constrained")
        axes = fig.subplots(nr, nc, squeeze=False).ravel()
        for ax, (pv, ps) in zip(axes, pats):
            for i, (lv, ls) in enumerate(_split(ps, line_cols)):
                g = ls.groupby(num(ls[x]))["hit_rate"].median()
                ax.plot(g.index, g.values.astype(float), "o-", color=f"C{i}",
                        label=_label(lv) or str(ls["family"].iloc[0]))
            if x == "step_overlap":
                ax.set_xlabel("step_overlap (fraction of top-k shared with the previous step)")
            else:
                ax.set_xscale("log", base=2)
                _value_ticks(ax, ps[x])
                ax.set_xlabel("device_buffer_size (tokens per request per layer)" if x != "top_k"
                              else "top-k (tokens)" + ("; device_buffer_size follows top-k" if tied else ""))
            ax.set_ylabel("hit rate (fraction already on GPU)")
            ax.set_ylim(0, 1.02)
            ax.set_title(_label(pv) or "hit rate")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        for ax in axes[len(pats):]:
            ax.set_visible(False)
        fig.suptitle(f"Hit rate vs {x}" + (f"\n{_label(vals)}" if vals else ""))
        fs.figures.append((f"hit_rate{'__' + _slug(vals) if vals else ''}", fig))
    if dropped:
        fs.note = (fs.note + "; " if fs.note else "") + f"{dropped} slice(s) with a single {x} value not drawn"
    return fs


def all_figures(pb: pd.DataFrame, pairs: Dict[str, pd.DataFrame], roles: AxisRoles) -> List[FigureSet]:
    """Every figure kind, in report order. ``pairs``: ``tables.tradeoff_tables``' pairwise
    tables (the hisparse heatmap always, its note saying when it is empty; the connector's when
    the run has it)."""
    heat = [ratio_heatmaps(pairs.get(COORD), roles)]
    heat += [ratio_heatmaps(t, roles, other=f) for f, t in pairs.items() if f != COORD]
    return heat + [latency_vs_topk(pb, roles), amplification_vs_page(pb, roles),
                   stage_breakdown(pb, roles), hit_rate(pb, roles)]


def save(fs: FigureSet, out_dir: Path, dpi: int = 110) -> List[Path]:
    """Writes each figure of ``fs`` as PNG and SVG under ``out_dir``; returns the PNG paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in fs.figures:
        png = out_dir / f"{name}.png"
        fig.savefig(png, dpi=dpi)
        fig.savefig(out_dir / f"{name}.svg")
        paths.append(png)
    return paths
