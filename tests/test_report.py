"""The report over synthetic sweeps whose answers are known (winners, missing and failed cells,
single backend, bad input). ``make_row`` / ``write_sweep`` are reused by the other analysis tests."""
import math
from pathlib import Path

import pandas as pd
import pytest

from harness import report, results
from harness.analysis import model as mdl
from harness.analysis import tables as tb

REPO = Path(__file__).resolve().parents[1]
FM, HS = "flashmla_sparse", "hisparse"


def make_row(backend, page_size, top_k, lat, *, status="ok", pattern="random", context_len=32768,
             batch_size=4, steps=4, warmup_steps=1, num_layers=2, pages_per_req=None, hit_rate=0.9,
             device="cuda", device_buffer_size=4096, step_overlap=0.8, **kw):
    """One result row with counts consistent with the axes (summed over the measured steps, i.e.
    steps - warmup_steps, x layers x requests)."""
    per = (steps - warmup_steps) * num_layers * batch_size
    sel = min(top_k, context_len) * per
    if pages_per_req is None:
        pages_per_req = mdl.expected_pages_uniform(context_len, top_k, page_size)
    ok = status == "ok"
    r = dict(schema_version=results.SCHEMA_VERSION, backend=backend, model="dsv32",
             kv_dtype="fp8_ds_mla", kv_row_bytes=656, page_size=page_size, top_k=top_k,
             batch_size=batch_size, context_len=context_len, pattern=pattern,
             step_overlap=step_overlap, phase="decode", selection="synthetic", steps=steps,
             warmup_steps=warmup_steps, num_layers=num_layers, seed=0, device=device, status=status,
             error=None if ok else f"{status}: synthetic", n_samples=(steps - warmup_steps) * num_layers,
             latency_us_median=lat if ok else None, latency_us_p10=lat * 0.95 if ok else None,
             latency_us_p90=lat * 1.05 if ok else None,
             stage_select_us=0.2 * lat, stage_transform_us=0.1 * lat, stage_attention_us=0.5 * lat,
             tokens_selected=sel, pages_touched=int(round(pages_per_req * per)),
             bytes_selected=sel * 656, bytes_hbm_read=2 * sel * 656,
             ceiling_hbm_gbps=math.nan if device == "cpu" else 4264.0,
             ceiling_h2d_gbps=math.nan if device == "cpu" else 55.5,
             ceiling_bf16_tflops=math.nan if device == "cpu" else 794.0,
             gpu_name=None if device == "cpu" else "NVIDIA H200", git_sha="0123abc",
             repro_command="python -m harness.bench synthetic", timestamp="2026-11-29T00:00:00")
    if backend == HS:
        loaded = int(sel * (1 - hit_rate))
        r.update(device_buffer_size=device_buffer_size, load_granularity="token", copy_engine="kernel",
                 hits=sel - loaded, misses=loaded, hit_rate=hit_rate, tokens_loaded=loaded,
                 pages_loaded=loaded, bytes_h2d=loaded * 656, stage_swap_in_us=0.2 * lat)
    else:
        r.update(tokens_loaded=0, pages_loaded=0, bytes_h2d=0)
    r.update(kw)
    return r


def write_sweep(root, rows):
    """One job directory per row, like a Hydra multirun."""
    for i, r in enumerate(rows):
        results.write_results(Path(root) / f"job{i:03d}", [r])
    return Path(root)


def synthetic_grid(skip=(), fail=None, backends=(FM, HS), **kw):
    """page 16/64/256 x top-k 512/2048. flashmla_sparse: 100 + k/20 µs; hisparse is 2x faster where
    page >= 64 and k = 512, 1.5x slower elsewhere."""
    rows = []
    for P in (16, 64, 256):
        for k in (512, 2048):
            for b in backends:
                if (P, k, b) in skip:
                    continue
                base = 100.0 + k / 20
                lat = base if b == FM else base * (0.5 if (P >= 64 and k == 512) else 1.5)
                rows.append(make_row(b, P, k, lat, status=(fail or {}).get((P, k, b), "ok"), **kw))
    return rows


def test_report_on_synthetic_sweep(tmp_path, capsys):
    run = write_sweep(tmp_path / "sweep", synthetic_grid(skip={(256, 2048, HS)},
                                                         fail={(16, 512, HS): "oom", (64, 2048, HS): "error"}))
    rc = report.main([str(run), "--project", str(REPO / "conf/hardware/gh200.yaml")])
    assert rc == 0
    out = run / "report"
    assert capsys.readouterr().out.strip() == str(out / "report.md")
    for f in ("report.md", "tradeoff.csv", "per_backend.csv", "claims.csv", "model.csv",
              "capacity.csv", "failures.csv", "projected_gh200.csv"):
        assert (out / f).is_file(), f
    for name in ("ratio_heatmap", "latency_vs_topk", "amplification__context_len=32768", "stage_breakdown"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000
        assert (out / "figures" / f"{name}.svg").is_file()

    t = pd.read_csv(out / "tradeoff.csv")
    # only page_size and top_k vary: the cell key is exactly those
    assert [c for c in t.columns if c in tb.CELL_AXES] == ["page_size", "top_k"]
    assert len(t) == 6
    win = {(r.page_size, r.top_k): r.winner for r in t.itertuples()}
    assert win[(16, 2048)] == FM
    assert win[(64, 512)] == HS and win[(256, 512)] == HS
    assert win[(16, 512)] == f"{FM} ({HS} oom)"            # a design failure loses the cell
    assert win[(64, 2048)] == "-"                            # an error decides nothing
    assert t[(t.page_size == 64) & (t.top_k == 2048)].iloc[0][f"{HS}_status"] == "error"
    assert win[(256, 2048)] == "-"                           # missing cell
    miss = t[(t.page_size == 256) & (t.top_k == 2048)].iloc[0]
    assert miss[f"{HS}_status"] == "missing" and miss[f"{FM}_status"] == "ok"
    r = t[(t.page_size == 64) & (t.top_k == 512)].iloc[0]
    assert r["ratio"] == pytest.approx(0.5)
    assert bool(r["separated"]) is True
    # bytes per tier per layer step (batch of 4): 4 x 512 x 656 B selected, HBM 2x, H2D 10 % misses
    # of the 3 measured steps x 2 layers x 4 requests (the warm-up step is not counted)
    assert r[f"{FM}_hbm_MB"] == pytest.approx(2 * 4 * 512 * 656 / 1e6)
    assert r[f"{HS}_h2d_MB"] == pytest.approx(int(24 * 512 * 0.1) * 656 / 6 / 1e6)
    assert r[f"{FM}_amp_hbm"] == pytest.approx(2.0)
    assert r[f"{HS}_hit_rate"] == pytest.approx(0.9)
    pages = round(mdl.expected_pages_uniform(32768, 512, 64) * 24) / 24
    assert r["pages_touched_per_req"] == pytest.approx(pages)
    assert r["amp_pages"] == pytest.approx(pages * 64 / 512)

    md = (out / "report.md").read_text()
    assert "| 256 | 2048 | ok | missing |" in md
    assert "oom: synthetic" in md                           # failures section lists the error
    assert "PROJECTION" in md and "gh200" in md
    # hit rate: hisparse is ok at one top-k per page size here, so a line would be one point
    assert "Skipped: every line would be a single point" in md
    assert "CPU" not in md.split("## Ceilings")[0]          # GPU rows: no CPU warning
    proj = pd.read_csv(out / "projected_gh200.csv")
    assert proj[f"{HS}_us"].notna().sum() == 3              # the 3 ok hisparse rows are projected
    claims = pd.read_csv(out / "claims.csv").set_index("key")
    assert claims.loc["a", "verdict"] == "holds" and claims.loc["b", "verdict"] == "holds"
    cap = pd.read_csv(out / "capacity.csv")
    fm_cap = cap[(cap.family == FM)].iloc[0]
    assert fm_cap["max_batch"] == int(51e9 // (32768 * 61 * 788))


def test_variants_repeats_and_varying_axes(tmp_path):
    rows = []
    for ctx in (8192, 32768):
        rows.append(make_row(FM, 64, 2048, 100.0, context_len=ctx))
        for D, lat in ((2048, 300.0), (4096, 80.0)):
            for seed, jitter in ((0, 0.0), (1, 10.0), (2, 20.0)):      # repeats -> median
                rows.append(make_row(HS, 64, 2048, lat + jitter, context_len=ctx,
                                     device_buffer_size=D, seed=seed))
    a = report.analyse(write_sweep(tmp_path / "s", rows))
    assert a.roles.cell == ["page_size", "top_k", "context_len"]
    assert a.roles.variants[HS] == ["device_buffer_size"]
    t = a.trade
    assert len(t) == 4
    by = {(r.context_len, r.device_buffer_size): r for r in t.itertuples()}
    assert by[(8192, 4096)].hisparse_us == pytest.approx(90.0)
    assert by[(8192, 4096)].winner == HS
    assert by[(32768, 2048)].winner == FM and by[(32768, 2048)].ratio == pytest.approx(3.1)
    pb = a.pb[(a.pb.family == HS)]
    assert set(pb["n_rows"]) == {3}


def test_single_backend_cpu_report(tmp_path):
    run = write_sweep(tmp_path / "s", synthetic_grid(backends=(HS,), device="cpu"))
    path = report.write_report(run)
    md = path.read_text()
    assert "Only hisparse in this run" in md
    assert "CPU timings are not performance figures" in md
    assert "No prediction: the run has no measured ceilings" in md
    assert not (path.parent / "tradeoff.csv").exists()
    pb = pd.read_csv(path.parent / "per_backend.csv")
    assert len(pb) == 6 and set(pb["family"]) == {HS}
    claims = pd.read_csv(path.parent / "claims.csv").set_index("key")
    assert (claims["verdict"] == "not enough data").all()
    assert "ratio_heatmap" not in " ".join(p.name for p in (path.parent / "figures").iterdir())


def test_bad_input_exits_with_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report.main([str(empty)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no result.parquet" in err

    assert report.main([str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("hello")
    pd.DataFrame({"x": [1]}).to_parquet(foreign / "result.parquet")      # not a harness file
    assert report.main([str(foreign)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a harness result file" in err

    newer = tmp_path / "newer"
    results.write_results(newer / "job0", [make_row(FM, 64, 512, 1.0, schema_version=results.SCHEMA_VERSION + 1)])
    assert report.main([str(newer)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "schema error" in err and "newer" in err
    with pytest.raises(results.SchemaError):
        report.write_report(newer)

    ok = write_sweep(tmp_path / "ok", [make_row(FM, 64, 512, 1.0)])
    assert report.main([str(ok), "--project", str(tmp_path / "missing.yaml")]) == 2
    assert "no hardware file" in capsys.readouterr().err


def test_filter_slices_the_run(tmp_path):
    run = write_sweep(tmp_path / "s", synthetic_grid())
    a = report.analyse(run, filt={"page_size": [64, 256], "top_k": 512})
    assert sorted(a.trade["page_size"]) == [64, 256] and set(a.trade["top_k"]) == {512}
    assert set(a.trade["winner"]) == {HS}
    with pytest.raises(KeyError, match="no_such_column"):
        report.analyse(run, filt={"no_such_column": 1})
    with pytest.raises(FileNotFoundError, match="matching"):
        report.analyse(run, filt={"page_size": 999})


def test_attention_kernel_is_a_cell_axis_only_when_both_backends_vary_it(tmp_path):
    both = [make_row(b, 64, 512, lat, attention_kernel=ak)
            for b, ak, lat in ((FM, "triton", 100.0), (FM, "flashmla", 50.0),
                               (HS, "triton", 80.0), (HS, "flashmla", 60.0))]
    a = report.analyse(write_sweep(tmp_path / "a", both))
    assert "attention_kernel" in a.roles.cell
    by = {r.attention_kernel: r for r in a.trade.itertuples()}
    assert by["triton"].winner == HS and by["flashmla"].winner == FM      # like compared with like
    one = [make_row(FM, 64, 512, 100.0, attention_kernel="triton"),
           make_row(FM, 64, 512, 50.0, attention_kernel="flashmla"),
           make_row(HS, 64, 512, 80.0, attention_kernel="triton")]
    b = report.analyse(write_sweep(tmp_path / "b", one))
    assert "attention_kernel" not in b.roles.cell and b.roles.variants[FM] == ["attention_kernel"]
    assert len(b.trade) == 2 and set(b.trade["hisparse_us"]) == {80.0}


def test_third_backend_joins_the_tradeoff_table(tmp_path):
    """hisparse_connector beside the two others: its ratio to flashmla_sparse as extra columns,
    one hisparse row per connector variant, the hisparse-vs-flashmla claims unchanged."""
    HC = "hisparse_connector"
    grid = synthetic_grid()
    conn = []
    for r in grid:
        if r["backend"] != FM:
            continue
        for rf, scale in ((1.0, 0.8), (0.0, 2.0)):
            conn.append(make_row(HC, r["page_size"], r["top_k"], r["latency_us_median"] * scale,
                                 resident_fraction=rf, stage_resolve_us=0.1, hit_rate=rf))
    two = report.analyse(write_sweep(tmp_path / "two", grid))
    run = write_sweep(tmp_path / "three", grid + conn)
    three = report.analyse(run)
    assert three.roles.families == [FM, HS, HC] and three.roles.variants[HC] == ["resident_fraction"]
    t = three.trade
    assert len(t) == 2 * len(two.trade)                      # each hisparse cell once per connector variant
    for rf, scale in ((1.0, 0.8), (0.0, 2.0)):
        sub = t[t["resident_fraction"] == rf]
        assert list(sub["connector_ratio"]) == pytest.approx([scale] * 6)
        assert set(sub["connector_winner"]) == {HC if scale < 1 else FM}
        pd.testing.assert_series_equal(sub["ratio"].reset_index(drop=True), two.trade["ratio"], check_names=False)
    assert [c.verdict for c in three.claims] == [c.verdict for c in two.claims]
    assert set(three.pairs) == {HS, HC} and len(three.pairs[HC]) == 12
    path = report.write_report(run)
    md = path.read_text()
    wins = {ln.split(": ", 1)[0]: ln.split(": ", 1)[1] for ln in md.splitlines() if ln.startswith("Winners")}
    assert sorted(wins["Winners (hc vs fm)"].split(", ")) == [f"{FM} 6", f"{HC} 6"]
    assert sorted(wins["Winners (hs vs fm)"].split(", ")) == [f"{FM} 4", f"{HS} 2"]   # per cell, not per join
    assert (path.parent / "figures" / "ratio_heatmap_hisparse_connector__resident_fraction=0.png").is_file()
    pb = pd.read_csv(path.parent / "per_backend.csv")
    assert (pb["family"] == HC).sum() == 12
