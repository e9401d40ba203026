"""Figures of the measured capacity section (``capacity_measured.CapacityView``), matplotlib's
object API like ``figures``: decode tokens/s vs context and max batch vs context per design,
one panel per tp_size, one figure per setting (the ``SETTING_AXES`` that vary).

Measured points (``capacity_point='max'``) are markers joined by lines; ``'listed'`` batches
are small hollow markers at their context; a design whose row failed at a context (oom,
invalid, incorrect, ...) or has no tokens/s gets an ``x`` on the panel's lower edge labelled
with its status, never a number. The analytic view (``projection_table``) is drawn dashed in
the design's colour, labelled "projection (analytic)", where it exists (tp_size=1; a projected
batch of 0 appears in the max-batch figure and the CSV only, as tokens/s are drawn on a log scale).
Units: context in tokens, tokens/s of one GPU, batch in requests.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import pandas as pd
from matplotlib.figure import Figure

from .capacity_measured import CapacityView, _family_order, _finite_pos, _groups
from .figures import FigureSet, _cap, _grid, _label, _slug, _value_ticks
from .rows import num
from .tables import _py


def _colors(designs: Sequence[Tuple[str, str]]) -> Dict[str, str]:
    """A colour per design, in family order (flashmla_sparse C0, hisparse C1, connector C2)."""
    ordered = sorted(set(designs), key=lambda d: (_family_order(d[1]), d[0]))
    return {d: f"C{i}" for i, (d, _) in enumerate(ordered)}


def _failed_marks(ax, fails: pd.DataFrame, color: str, slot: int) -> None:
    """An x per failed context on the panel's lower edge, labelled with the status."""
    tr = ax.get_xaxis_transform()          # x in data, y in axes coordinates
    y = 0.03 + 0.06 * slot
    for _, r in fails.iterrows():
        what = r["status"] if r["status"] != "ok" else "no tokens/s"
        ax.plot([_py(r["context_len"])], [y], "x", color=color, transform=tr, markersize=8, clip_on=False)
        ax.annotate(str(what), (_py(r["context_len"]), y), xycoords=tr, xytext=(4, 0),
                    textcoords="offset points", fontsize=6.5, color=color, va="center")


def _log_y(ax, base: float = 10) -> None:
    """A log y axis with a free band at the bottom for the failure marks."""
    if ax.has_data():
        ax.set_yscale("log", base=base)
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo / 2, hi)


def _panels(view: CapacityView, fs: FigureSet, stem: str, title: str, ylabel: str, draw) -> FigureSet:
    m = view.measured
    if m.empty:
        fs.note = "no capacity rows"
        return fs
    colors = _colors(list(zip(m["design"], m["family"])))
    for vals, sub in _cap(fs, [(dict(zip(view.setting, k)), g) for k, g in _groups(m, view.setting)]):
        tps = _groups(sub, ["tp_size"])
        nr, nc = _grid(len(tps))
        fig = Figure(figsize=(5.4 * nc, 4.2 * nr), layout="constrained")
        axes = fig.subplots(nr, nc, squeeze=False).ravel()
        proj = view.projection
        for k, c in zip(view.setting, vals.values()):
            proj = proj[proj[k].map(_py) == c] if not proj.empty else proj
        for ax, ((tp,), ts) in zip(axes, tps):
            pj = proj[proj["tp_size"].map(_py) == tp] if not proj.empty else proj
            draw(ax, ts, pj, colors)
            ax.set_xscale("log", base=2)
            _value_ticks(ax, ts["context_len"])
            ax.set_xlabel("context (tokens)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"tp_size={tp}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        for ax in axes[len(tps):]:
            ax.set_visible(False)
        fig.suptitle(title + (f"\n{_label(vals)}" if vals else ""))
        fs.figures.append((f"{stem}{'__' + _slug(vals) if vals else ''}", fig))
    return fs


def _design_groups(ts: pd.DataFrame) -> List[Tuple[str, pd.DataFrame]]:
    return sorted(((d, g) for (d,), g in _groups(ts, ["design"])),
                  key=lambda t: (_family_order(t[1]["family"].iloc[0]), t[0]))


def tokens_per_s_vs_context(view: CapacityView) -> FigureSet:
    """Decode tokens/s at each design's max batch vs context, per tp_size, with the analytic
    projection dashed."""
    fs = FigureSet("capacity_tokens_per_s", "Decode tokens/s vs context under the HBM budget (measured)")

    def draw(ax, ts, pj, colors):
        for slot, (design, g) in enumerate(_design_groups(ts)):
            col = colors[design]
            mx = g[g["capacity_point"] == "max"].sort_values("context_len")
            good = mx[(mx["status"] == "ok") & mx["tokens_per_s"].map(_finite_pos)]
            ax.plot(num(good["context_len"]), num(good["tokens_per_s"]), "o-", color=col,
                    label=f"{design} (max batch)")
            lst = g[(g["capacity_point"] == "listed") & (g["status"] == "ok") & g["tokens_per_s"].map(_finite_pos)]
            if not lst.empty:
                ax.plot(num(lst["context_len"]), num(lst["tokens_per_s"]), "o", mfc="none", markersize=4,
                        color=col, label=f"{design} (listed batches)")
            _failed_marks(ax, mx.drop(good.index), col, slot)
            p = pj[pj["design"] == design].sort_values("context_len") if not pj.empty else pj
            p = p[num(p["projected_tokens_per_s"]) > 0] if not p.empty else p   # 0: none fits (max-batch figure)
            if not p.empty:
                ax.plot(num(p["context_len"]), num(p["projected_tokens_per_s"]), "s--", mfc="none", color=col,
                        alpha=0.8, label=f"{design}: projection (analytic)")
        _log_y(ax)

    return _panels(view, fs, "capacity_tokens_per_s", "Decode tokens/s per GPU at each design's max batch",
                   "decode tokens/s (one GPU)", draw)


def max_batch_vs_context(view: CapacityView) -> FigureSet:
    """Each design's max batch under the budget vs context, per tp_size (0 = oom marked on the
    lower edge), with the analytic view's max batch dashed."""
    fs = FigureSet("capacity_max_batch", "Max batch vs context under the HBM budget")

    def draw(ax, ts, pj, colors):
        for slot, (design, g) in enumerate(_design_groups(ts)):
            col = colors[design]
            mx = g[g["capacity_point"] == "max"].sort_values("context_len")
            held = mx[num(mx["max_batch"]) >= 1]
            ax.plot(num(held["context_len"]), num(held["max_batch"]), "o-", color=col, label=design)
            none = mx.drop(held.index)
            _failed_marks(ax, none.assign(status=[f"0 ({st})" for st in none["status"]]), col, slot)
            p = pj[pj["design"] == design].sort_values("context_len") if not pj.empty else pj
            p = p[num(p["projected_max_batch"]) >= 1] if not p.empty else p
            if not p.empty:
                ax.plot(num(p["context_len"]), num(p["projected_max_batch"]), "s--", mfc="none", color=col,
                        alpha=0.8, label=f"{design}: projection (analytic)")
        _log_y(ax, base=2)

    return _panels(view, fs, "capacity_max_batch", "Requests each design holds under the budget",
                   "max batch (requests)", draw)


def capacity_figures(view: CapacityView) -> List[FigureSet]:
    """Both capacity figure kinds, in report order."""
    return [tokens_per_s_vs_context(view), max_batch_vs_context(view)]
