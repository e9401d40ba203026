"""The report's measured capacity section (harness.analysis.capacity_measured): from a tiny CPU
sweep the harness itself runs (scenario=capacity beside decode rows) and from hand-built rows
whose crossover and verdict are known; the trade-off analysis reads decode rows only."""
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cli import run_harness  # noqa: E402
from test_report import FM, HS, make_row, synthetic_grid, write_sweep  # noqa: E402

from harness import report, results  # noqa: E402
from harness.analysis import capacity_figures as cfigs  # noqa: E402
from harness.analysis import capacity_measured as cm  # noqa: E402
from harness.analysis import model as mdl  # noqa: E402

HC = "hisparse_connector"
OFFLOADING = (HS, HC)
CONTEXTS = (64, 256)
#: FM holds one request at context 64 and none at 256 under this budget (tiny model, 1 layer)
CPU_CAPACITY = ["+sweep=capacity", "device=cpu", "model=tiny", "top_k=16", "report=false",
                "capacity.kv_budget_gb=0.006", "capacity.rest_of_layer=none", "num_layers=1", "steps=2",
                "timing.warmup_steps=1", "context_len=64,256", "capacity.tp_size=1,2", "capacity.batch_sizes=[1]"]
CPU_DECODE = ["-m", "context_len=64,256", "top_k=16", "pattern=calibrated", "steps=2", "timing.warmup_steps=1",
              "num_layers=1", "batch_size=2", "report=false"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """``tree/capacity``: the capacity preset at tiny size (3 designs x 2 contexts x 2 tp sizes,
    listed batch 1); ``tree/decode``: decode rows at the same contexts, for the projection."""
    root = tmp_path_factory.mktemp("tree")
    run_harness(*CPU_CAPACITY, f"hydra.sweep.dir={root / 'capacity'}")
    run_harness(*CPU_DECODE, f"hydra.sweep.dir={root / 'decode'}")
    return root


# --------------------------------------------------------------------------- independent reference

def ratios_from_rows(rows):
    """{(tp_size, backend): {context: ratio}} from the raw capacity rows at capacity_point=max,
    with the module docstring's rules (oom/invalid of one side: inf or 0; else not compared)."""
    mx = rows[rows["capacity_point"] == "max"]
    out = {}
    for (tp, ctx), g in mx.groupby(["tp_size", "context_len"]):
        fm = g[g["backend"] == FM].iloc[0]
        fm_ok = fm["status"] == "ok" and np.isfinite(fm["tokens_per_s"])
        for _, o in g[g["backend"] != FM].iterrows():
            o_ok = o["status"] == "ok" and np.isfinite(o["tokens_per_s"])
            if fm_ok and o_ok:
                r = o["tokens_per_s"] / fm["tokens_per_s"]
            elif o_ok and fm["status"] in ("oom", "invalid"):
                r = math.inf
            elif fm_ok and o["status"] in ("oom", "invalid"):
                r = 0.0
            else:
                continue
            out.setdefault((int(tp), o["backend"]), {})[int(ctx)] = r
    return out


def expected_rows(rows) -> int:
    """Rows of the capacity preset: one ``max`` row per (design, context, tp size), and one at the
    listed batch 1 wherever the design holds more than one request (else that point is the max)."""
    mx = rows[rows["capacity_point"] == "max"]
    assert len(mx) == 3 * len(CONTEXTS) * 2
    return len(mx) + int((mx["max_batch"] > 1).sum())


def expected_verdict(ratios, short, long, band=(0.8, 1.25), long_min=2.0, tol=0.05):
    s = [r for c, r in ratios.items() if c <= short]
    lg = [r for c, r in ratios.items() if c >= long]
    s_out = None if not s else ("holds" if all(band[0] <= r <= band[1] for r in s) else "fails")
    l_out = (None if not lg else "holds" if all(r >= long_min for r in lg)
             else "fails" if all(r <= 1 + tol for r in lg) else "partly")
    parts = [p for p in (s_out, l_out) if p]
    if not parts:
        return "not enough data"
    if len(parts) == 2 and parts == ["holds", "holds"]:
        return "supported"
    return "not supported" if all(p == "fails" for p in parts) else "partly"


# --------------------------------------------------------------------------- the CLI sweep

def test_capacity_section_and_csvs_from_a_cpu_sweep(tree):
    path = report.write_report(tree, capacity_claim=cm.DirectionClaim(short_context=64, long_context=256))
    out, md = path.parent, path.read_text()
    cap_rows = results.load(tree / "capacity")
    assert set(cap_rows["scenario"]) == {"capacity"} and len(cap_rows) == expected_rows(cap_rows)
    assert "## Capacity under an HBM budget (measured)" in md
    assert "not evidence about GPU performance" in md.split("## Capacity under")[1]   # CPU caveat
    for f in report.CAPACITY_CSVS:
        assert (out / f).is_file(), f
    for name in ("capacity_tokens_per_s", "capacity_max_batch"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000 and (out / "figures" / f"{name}.svg").is_file()

    m = pd.read_csv(out / "capacity_measured.csv")
    assert len(m) == len(cap_rows)                         # one row per point: nothing merged away
    for _, r in cap_rows.iterrows():
        got = m[(m.design == r.backend) & (m.tp_size == r.tp_size) & (m.context_len == r.context_len)
                & (m.capacity_point == r.capacity_point) & (m.batch_size == r.batch_size)]
        assert len(got) == 1 and got.iloc[0]["status"] == r.status
        assert got.iloc[0]["max_batch"] == r.max_batch
        if r.status == "ok":
            assert got.iloc[0]["tokens_per_s"] == pytest.approx(r.tokens_per_s)
    # the budget holds no flashmla_sparse request at 256: oom, max batch 0, listed as failed
    mb = pd.read_csv(out / "capacity_max_batch.csv")
    fm256 = mb[(mb.design == FM) & (mb.context_len == 256)]
    assert set(fm256["max_batch"]) == {0} and set(fm256["status"]) == {"oom"}
    assert "| 1 | 256 | flashmla_sparse | max | 1 | 0 | oom |" in md

    want = ratios_from_rows(cap_rows)
    cross = pd.read_csv(out / "capacity_crossover.csv")
    verdicts = pd.read_csv(out / "capacity_claims.csv")
    assert len(cross) == len(verdicts) == 4                 # 2 offloading designs x 2 tp sizes
    for (tp, design), by_ctx in want.items():
        ahead = [c for c, r in sorted(by_ctx.items()) if r > 1.05]
        c = cross[(cross.tp_size == tp) & (cross.design == design)].iloc[0]
        assert str(c["crossover"]) == (str(ahead[0]) if ahead else f"none in range ({min(by_ctx)}-{max(by_ctx)})")
        # the resident design holds nothing at 256 (oom): ahead there, whatever the timings. Not
        # asserted: that it is not ahead at 64 too, a ratio of CPU timings of one measured step
        # (~0.5, but over 1.05 when the other process sharing the CPU slows flashmla's point)
        assert by_ctx[256] == math.inf and 256 in ahead
        v = verdicts[(verdicts.tp_size == tp) & (verdicts.design == design)].iloc[0]
        assert v["verdict"] == expected_verdict(by_ctx, 64, 256)
        assert "CPU" in v["caveat"]
    # the projection: decode rows at the same contexts, tp_size=1 only (they run every head)
    proj = pd.read_csv(out / "capacity_projection.csv")
    assert set(proj["tp_size"]) == {1} and set(proj["design"]) == {FM, HS}
    assert set(proj["context_len"]) == set(CONTEXTS)
    assert "### Measured vs the analytic projection" in md


def test_tradeoff_analysis_reads_decode_rows_only(tree):
    a = report.analyse(tree)
    dec = results.load(tree / "decode")
    assert len(a.df) == len(dec) and not (a.df["scenario"] == "capacity").any()
    assert int(a.pb["n_rows"].sum()) == len(dec)
    assert set(a.pairs) == set(OFFLOADING)                   # the decode sweep ran all three designs
    assert {"ratio", "connector_ratio", f"{HC}_us"} <= set(a.trade.columns)
    assert len(a.capacity_view.rows) == expected_rows(results.load(tree / "capacity"))


def test_capacity_only_tree_reports(tree):
    assert report.main([str(tree / "capacity"), "--out", str(tree / "cap_report")]) == 0
    out = tree / "cap_report"
    md = (out / "report.md").read_text()
    for section in ("## Trade-off table", "## The seed article's claims", "## Figures", "## Per-backend table",
                    "## Analytic model (roofline)", "## Capacity projection (analytic, from decode rows)"):
        assert md.split(section)[1].lstrip().startswith(report.NO_DECODE), section
    assert not (out / "tradeoff.csv").exists() and not (out / "per_backend.csv").exists()
    assert pd.read_csv(out / "capacity_crossover.csv").shape[0] == 4
    assert pd.read_csv(out / "capacity_projection.csv").empty   # no decode rows to project from


def test_notebook_capacity_cell(tree, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    NotebookClient = pytest.importorskip("nbclient").NotebookClient
    nb_path = Path(__file__).resolve().parents[1] / "notebooks" / "tradeoffs.ipynb"
    monkeypatch.setenv("DSA_RUN_DIR", str(tree / "capacity"))
    nb = nbformat.read(nb_path, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(nb_path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    cell = next(c for c in nb.cells if c.get("id") == "capacity-measured")
    html = "\n".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)
    assert "hisparse_connector tok/s" in html and "crossover" in html and "verdict" in html
    assert sum("image/png" in o.get("data", {}) for o in cell.outputs) == 2


# --------------------------------------------------------------------------- hand-built rows

def cap_row(backend, ctx, tps, *, tp=1, status="ok", batch=8, point="max", budget=50.0, model="dsv32", **kw):
    ok = status == "ok"
    heads = mdl.model_preset(model).num_heads // tp
    r = dict(schema_version=results.SCHEMA_VERSION, backend=backend, scenario="capacity", phase="decode",
             model=model, kv_dtype="fp8_ds_mla", kv_row_bytes=656, page_size=64, top_k=2048,
             pattern="calibrated", selection="synthetic", context_len=ctx, tp_size=tp, attention_heads=heads,
             batch_size=batch, max_batch=batch if status != "oom" else 0, capacity_point=point,
             kv_budget_gb=budget, rest_of_layer="measured", steps=12, warmup_steps=8, num_layers=2,
             device="cuda", status=status, error=None if ok else f"{status}: synthetic",
             latency_us_median=100.0 if ok else None, tokens_per_s=tps if ok else None,
             tpot_ms=batch / tps * 1e3 if ok and tps else None, bytes_h2d=0)
    r.update(kw)
    return r


CTX = (4096, 16384, 32768, 65536, 131072)


def curve(backend, tps, **kw):
    return [cap_row(backend, c, t, **kw) for c, t in zip(CTX, tps)]


def test_known_crossover_none_in_range_and_verdicts():
    fm = [1000.0, 500.0, 300.0, 150.0, 80.0]
    rows = (curve(FM, fm)
            + curve(HS, [f * r for f, r in zip(fm, (0.79, 0.34, 0.32, 0.31, 0.39))])   # the H200 run
            + curve(HC, [f * r for f, r in zip(fm, (1.03, 1.1, 3.0, 3.0, 3.0))])
            + curve(FM, fm, tp=8)
            + curve(HS, [f * r for f, r in zip(fm, (1.0, 1.2, 1.5, 2.5, 3.0))], tp=8))
    v = cm.analyse_capacity(pd.DataFrame(rows))
    assert v.setting == []
    c = v.crossover.set_index(["tp_size", "design"])
    assert c.loc[(1, HS), "crossover"] == "none in range (4096-131072)"
    assert pd.isna(c.loc[(1, HS), "crossover_context"])
    assert c.loc[(1, HC), "crossover_context"] == 16384           # 1.1 > 1 + 5 %
    assert c.loc[(8, HS), "crossover_context"] == 16384
    assert c.loc[(1, HC), "ahead_at"] == "16384, 32768, 65536, 131072"
    r = v.ratios.set_index(["tp_size", "design", "context_len"])["ratio"]
    assert r[(1, HS, 16384)] == pytest.approx(0.34) and r[(8, HS, 65536)] == pytest.approx(2.5)
    vd = v.verdicts.set_index(["tp_size", "design"])
    assert vd.loc[(1, HS), "verdict"] == cm.NOT_SUPPORTED            # 0.79 at 4K, no gain from 32K
    assert vd.loc[(1, HS), "short"] == cm.FAILS and vd.loc[(1, HS), "long"] == cm.FAILS
    assert vd.loc[(1, HC), "verdict"] == cm.SUPPORTED                 # 1.0 at 4K, 3x from 32K
    assert vd.loc[(8, HS), "verdict"] == cm.PARTLY and vd.loc[(8, HS), "long"] == cm.PARTLY   # 1.5 at 32K
    assert "32768: 0.32x" in vd.loc[(1, HS), "detail"] and vd.loc[(1, HS), "caveat"] == ""
    wide = cm.throughput_wide(v).set_index(["tp_size", "context_len"])
    assert wide.loc[(1, 32768), f"{HC} / {FM}"] == pytest.approx(3.0)


def test_published_numbers_support_the_direction():
    """The HiSparse paper's own numbers (8xH200) pass the check: 1.0x, 3.1x, 2.9x."""
    rows = [cap_row(FM, c, t) for c, t in ((4096, 2288), (32768, 624), (163840, 232))]
    rows += [cap_row(HS, c, t) for c, t in ((4096, 2280), (32768, 1919), (163840, 680))]
    v = cm.analyse_capacity(pd.DataFrame(rows))
    assert v.verdicts.iloc[0]["verdict"] == cm.SUPPORTED
    assert v.crossover.iloc[0]["crossover_context"] == 32768


def test_failed_rows_are_listed_compared_by_design_reason_and_not_drawn():
    fm = [1000.0, 500.0, 300.0, 150.0, 80.0]
    rows = [cap_row(FM, c, t, status="oom" if c == 131072 else "error" if c == 16384 else "ok")
            for c, t in zip(CTX, fm)]
    rows += [cap_row(HS, c, t * 0.9, status="incorrect" if c == 65536 else "ok") for c, t in zip(CTX, fm)]
    rows += [cap_row(HC, c, t, status="oom" if c == 4096 else "ok") for c, t in zip(CTX, fm)]
    v = cm.analyse_capacity(pd.DataFrame(rows))
    r = v.ratios.set_index(["design", "context_len"])
    assert r.loc[(HS, 131072), "ratio"] == math.inf and r.loc[(HS, 131072), "basis"] == f"{FM} oom"
    assert r.loc[(HC, 4096), "ratio"] == 0.0                       # the connector's own oom loses
    assert math.isnan(r.loc[(HS, 16384), "ratio"]) and "error" in r.loc[(HS, 16384), "basis"]
    assert math.isnan(r.loc[(HS, 65536), "ratio"]) and "incorrect" in r.loc[(HS, 65536), "basis"]
    c = v.crossover.set_index("design")
    assert c.loc[HS, "crossover_context"] == 131072                 # only where flashmla_sparse holds none
    assert "65536 (not compared: hisparse incorrect)" in c.loc[HS, "not_compared"]
    assert c.loc[HC, "crossover_context"] == 131072 and c.loc[HC, "ahead_at"] == "131072"   # 0, -, 1, 1, inf
    assert set(zip(v.failures["design"], v.failures["context_len"])) == {
        (FM, 16384), (FM, 131072), (HS, 65536), (HC, 4096)}
    fig = dict(cfigs.tokens_per_s_vs_context(v).figures)["capacity_tokens_per_s"]
    lines = {ln.get_label(): ln for ln in fig.axes[0].lines}
    assert list(lines[f"{HS} (max batch)"].get_xdata()) == [4096, 16384, 32768, 131072]   # 65536 not drawn
    assert list(lines[f"{FM} (max batch)"].get_xdata()) == [4096, 32768, 65536]
    marks = [t.get_text() for t in fig.axes[0].texts]
    assert sorted(marks) == ["error", "incorrect", "oom", "oom"]
    wide = cm.throughput_wide(v).set_index("context_len")
    assert wide.loc[65536, f"{HS} tok/s"] == "incorrect" and wide.loc[131072, f"{FM} tok/s"] == "oom"


def test_projection_by_hand_beside_the_measured_points(tmp_path):
    """The analytic view from decode rows at the same context and budget: max batch = budget //
    per-request bytes, tokens/s = decode batch / (61 x step) (one measured batch: proportional)."""
    N, L, R, I = 32768, 61, 656, 132
    dec = [make_row(FM, 64, 2048, 200.0, context_len=N, pattern="calibrated"),
           make_row(HS, 64, 2048, 400.0, context_len=N, pattern="calibrated", device_buffer_size=4096)]
    caprows = [cap_row(FM, N, 900.0), cap_row(HS, N, 700.0, device_buffer_size=4096), cap_row(FM, N, 950.0, tp=8),
               cap_row(HS, N, 800.0, tp=8, device_buffer_size=4096)]
    v = cm.analyse_capacity(pd.DataFrame(caprows), pd.DataFrame(dec))
    p = v.projection.set_index("design")
    assert set(v.projection["tp_size"]) == {1}                      # tp_size=8 computes 16 heads: not projected
    assert p.loc[FM, "projected_max_batch"] == 50e9 // (N * L * (R + I))
    hs_gpu = (4096 + 64) * L * R + N * L * I
    assert p.loc[HS, "projected_max_batch"] == 50e9 // hs_gpu
    assert p.loc[FM, "projected_tokens_per_s"] == pytest.approx(4 / (L * 200e-6))
    assert p.loc[HS, "projected_tokens_per_s"] == pytest.approx(4 / (L * 400e-6))
    assert p.loc[FM, "measured_over_projected"] == pytest.approx(900.0 / (4 / (L * 200e-6)))
    fig = dict(cfigs.tokens_per_s_vs_context(v).figures)["capacity_tokens_per_s"]
    tp1, tp8 = fig.axes[0], fig.axes[1]
    dashed = {ln.get_label(): ln.get_linestyle() for ln in tp1.lines if "projection" in ln.get_label()}
    assert dashed == {f"{FM}: projection (analytic)": "--", f"{HS}: projection (analytic)": "--"}
    assert not [ln for ln in tp8.lines if "projection" in ln.get_label()]
    mb = dict(cfigs.max_batch_vs_context(v).figures)["capacity_max_batch"]
    line = next(ln for ln in mb.axes[0].lines if ln.get_label() == f"{FM}: projection (analytic)")
    assert list(line.get_ydata()) == [50e9 // (N * L * (R + I))]


def test_capacity_rows_leave_the_tradeoff_analysis_unchanged(tmp_path):
    dec = synthetic_grid()
    caprows = curve(FM, [1000.0, 500.0, 300.0, 150.0, 80.0]) + curve(HS, [900.0, 450.0, 700.0, 400.0, 300.0])
    alone = report.analyse(write_sweep(tmp_path / "decode", dec))
    both = report.analyse(write_sweep(tmp_path / "both", dec + caprows))
    pd.testing.assert_frame_equal(alone.trade, both.trade)
    pd.testing.assert_frame_equal(alone.pb.drop(columns="job_dir"), both.pb.drop(columns="job_dir"))
    assert [c.verdict for c in alone.claims] == [c.verdict for c in both.claims]
    assert alone.capacity_view is None and len(both.capacity_view.rows) == 10
    assert both.capacity_view.crossover.iloc[0]["crossover_context"] == 32768   # 700 / 300
