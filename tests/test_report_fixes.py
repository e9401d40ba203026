"""The report's defects of issue 14, each with the test that would have caught it: page coverage
over 100 %, an amplification "bound" below measured points, a colour bar that stops short of the
data, hit-rate "lines" of one point, and the peers bench comparing against SGLang's call. The
first four read a real tiny CPU sweep (context 64 tokens, 2 measured decode steps that add tokens
after the prompt) or rows built to a known ratio; the last runs the swap-in peers at --quick size.
"""
import argparse
import itertools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from harness import results
from harness.analysis import figures as fg
from harness.analysis import model as mdl
from harness.analysis import tables as tb
from harness.bench import swap_in as swap_in_bench
from harness.bench.measure import BenchRun
from harness.bench.swap_in_peer import swap_in_peers
from harness.sglang_model import modelled_peer

sys.path.insert(0, str(Path(__file__).parent))
from test_report import FM, HS, make_row, write_sweep  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONTEXT = 64


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """page 16/64 x top-k 16/32, every backend (hisparse's buffer at its default 2 x top-k)."""
    out = tmp_path_factory.mktemp("sweep")
    r = subprocess.run([sys.executable, "-m", "harness", "-m", "page_size=16,64", "top_k=16,32",
                        "device=cpu", "model=tiny", f"context_len={CONTEXT}", "steps=3",
                        "timing.warmup_steps=1", "num_layers=1", "batch_size=2", "report=false",
                        f"hydra.sweep.dir={out}"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    df = results.load(out)
    assert set(df["status"]) == {"ok"} and len(df) == 12
    return out, df


def test_page_coverage_counts_the_decode_tokens(sweep):
    out, df = sweep
    d = tb.derive(df)
    st = results.load(out, steps=True)
    st = st[~st["warmup"].astype(bool)]
    for job, rows in d.groupby("job_dir"):
        s = st[st["job_dir"] == job]
        for rec in rows.to_dict("records"):
            mine = s[s["backend"] == rec["backend"]]
            # reference from the per-(step, layer, request) table: pages touched / pages there are
            want = mine["pages_touched"].sum() / np.ceil(mine["seq_len"] / rec["page_size"]).sum()
            assert rec["page_coverage"] == pytest.approx(want), rec["backend"]
    assert (d["page_coverage"] <= 1).all() and (d["page_coverage"] == 1).any()
    # the old divisor, ceil(context_len / page_size), put some of these cells above 100 %
    old = d["pages_touched_per_req"] / np.ceil(d["context_len"] / d["page_size"])
    assert (old > 1).any()


def test_extend_and_trace_rows_have_no_coverage():
    rows = pd.DataFrame([make_row(FM, 64, 512, 100.0, phase="extend"),
                         make_row(FM, 64, 512, 100.0, selection="trace"),
                         make_row(FM, 64, 512, 100.0)])
    d = tb.derive(rows)
    assert d["page_coverage"].isna().tolist() == [True, True, False]
    assert d["amp_pages_bound"].tolist()[:2] == [64.0, 64.0]      # pages <= tokens still holds


@pytest.mark.parametrize("N,P", [(10, 4), (9, 3), (8, 8), (7, 2)])
def test_amplification_bound_is_the_largest_any_selection_reaches(N, P):
    """Over every selection of k of N positions: max pages x P / k equals the bound (it is
    tight for one step), and the expectation equals the mean over all selections."""
    pages_in_context = math.ceil(N / P)
    for k in range(1, N + 1):
        amps = [len({p // P for p in sel}) * P / k for sel in itertools.combinations(range(N), k)]
        assert max(amps) == pytest.approx(mdl.page_amplification_bound(pages_in_context, k, P))
        assert np.mean(amps) == pytest.approx(mdl.expected_amplification_uniform(N, k, P))


def test_expectation_over_several_steps_weights_by_tokens():
    lens, k, P = [9, 10, 11], 4, 4
    mean_pages = [np.mean([len({p // P for p in s}) for s in itertools.combinations(range(n), k)])
                  for n in lens]
    want = P * sum(mean_pages) / (k * len(lens))
    assert mdl.expected_amplification_uniform(lens, k, P) == pytest.approx(want)


def _lines(fig):
    return [ln for ax in fig.axes for ln in ax.get_lines()]


def test_amplification_figure_bound_lies_above_every_measured_point(sweep):
    _, df = sweep
    d = tb.derive(df)
    assert (d["amp_pages"] <= d["amp_pages_bound"] + 1e-12).all()
    roles = tb.axis_roles(d)
    fs = fg.amplification_vs_page(tb.per_backend_table(df, roles), roles)
    assert len(fs.figures) == 1
    fig = fs.figures[0][1]
    for ax in fig.axes:
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        bound = next(ln for name, ln in lines.items() if name.startswith("upper bound"))
        top = dict(zip(bound.get_xdata(), bound.get_ydata()))
        measured = [ln for name, ln in lines.items() if "pages touched" in name or "loaded by" in name]
        assert measured
        for ln in measured:
            for x, y in zip(ln.get_xdata(), ln.get_ydata()):
                assert y <= top[x] + 1e-12, (ax.get_title(), ln.get_label(), x, y, top[x])
        assert not any("bound" in name for name in lines if name.startswith("uniform"))
    # the old line, the uniform-random expectation at the prompt length, lay below a measured point
    old = [mdl.expected_amplification_uniform(CONTEXT, int(k), int(p))
           for k, p in zip(d["top_k"], d["page_size"])]
    assert (d["amp_pages"] > np.array(old) + 1e-9).any()


def test_heatmap_colour_bar_reaches_the_largest_ratio(tmp_path):
    rows = []
    for P in (16, 64):
        for k in (512, 2048):
            ratio = 6.3 if (P, k) == (64, 2048) else 0.7
            rows += [make_row(FM, P, k, 100.0), make_row(HS, P, k, 100.0 * ratio)]
    df = results.load(write_sweep(tmp_path, rows))
    roles = tb.axis_roles(tb.derive(df))
    fs = fg.ratio_heatmaps(tb.tradeoff_table(tb.per_backend_table(df, roles), roles), roles)
    fig = fs.figures[0][1]
    cbar = fig.axes[-1]                                   # the colour bar's axes
    lo, hi = sorted(cbar.get_ylim())
    assert hi >= math.log2(6.3) - 1e-9 and lo <= -math.log2(6.3) + 1e-9
    labels = [t.get_text() for t in cbar.get_yticklabels()]
    assert labels[-1] == "6.3" and labels[0] == f"{1 / 6.3:.2g}", labels
    ticks = np.asarray(cbar.get_yticks())
    assert ticks.max() == pytest.approx(math.log2(6.3))
    assert fg.ratio_ticks(1.0) == pytest.approx([0.5, 2 / 3, 1, 1.5, 2])   # the smallest range


def test_hit_rate_lines_run_over_the_swept_axis(sweep):
    _, df = sweep
    roles = tb.axis_roles(tb.derive(df))
    fs = fg.hit_rate(tb.per_backend_table(df, roles), roles)
    # the buffer follows top-k (2 x top_k): lines over top-k, one figure per page size
    assert [name for name, _ in fs.figures] == ["hit_rate__page_size=16", "hit_rate__page_size=64"]
    for _, fig in fs.figures:
        lines = [ln for ln in _lines(fig) if not ln.get_label().startswith("_")]
        assert {ln.get_label() for ln in lines} == {"family=hisparse", "family=hisparse_connector"}
        for ln in lines:
            assert list(ln.get_xdata()) == [16.0, 32.0], ln.get_label()
        assert "top-k" in fig.axes[0].get_xlabel()


def test_hit_rate_says_why_there_is_no_line(tmp_path):
    df = results.load(write_sweep(tmp_path, [make_row(FM, P, 512, 100.0) for P in (16, 64)]
                                  + [make_row(HS, P, 512, 90.0) for P in (16, 64)]))
    roles = tb.axis_roles(tb.derive(df))
    fs = fg.hit_rate(tb.per_backend_table(df, roles), roles)
    assert not fs.figures and fs.note.startswith("every line would be a single point")


def test_peers_compare_kernel_with_kernel_and_the_call_on_a_second_row(capsys):
    args = argparse.Namespace(quick=True, warmup=1, repeats=2)
    run = BenchRun("peers", args, torch.device("cpu"), "python -m harness.bench run peers --quick")
    swap_in_peers(run, swap_in_bench.QUICK, modelled_peer, "sglang_model")
    df = pd.DataFrame(run.rows)
    assert set(df["status"]) == {"ok"}
    printed = capsys.readouterr().out
    for case, g in df.groupby("case"):
        call, kernel = (g[g["kernel"] == k].iloc[0] for k in ("sglang_model_call",
                                                              "sglang_model_kernel"))
        assert call["peer"] == "sglang_model_kernel"
        assert call["ratio_to_peer"] == pytest.approx(call["latency_us_median"] / kernel["latency_us_median"])
        assert pd.isna(kernel["peer"])
        mine = g[g["kernel"] == "swap_in_selected_pages"]
        assert sorted(mine["lru_order"]) == ["position", "upstream"]    # a row of ours per order
        for _, ours in mine.iterrows():
            assert ours["peer"] == "sglang_model_kernel"
            assert ours["ratio_to_peer"] == pytest.approx(ours["latency_us_median"] / kernel["latency_us_median"])
            line = next(ln for ln in printed.splitlines()
                        if ln.startswith(f"[peers] {case} lru_order={ours['lru_order']}: "))
            r_kernel = ours["latency_us_median"] / kernel["latency_us_median"]
            r_call = ours["latency_us_median"] / call["latency_us_median"]
            assert (f"ours / sglang_model_kernel = {r_kernel:.2f} (the comparison); "
                    f"ours / sglang_model_call = {r_call:.2f}") in line
