"""Claims table on synthetic results where each verdict is known."""
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from test_report import FM, HS, make_row, write_sweep  # noqa: E402

from harness import results  # noqa: E402
from harness.analysis import claims as cl  # noqa: E402
from harness.analysis import tables as tb  # noqa: E402
from harness.report import analyse  # noqa: E402


def verdicts(tmp_path, rows, steps=None):
    run = write_sweep(tmp_path / "run", rows)
    if steps:
        for job, srows in steps.items():
            results.write_steps(run / job, srows)
    a = analyse(run)
    return {c.key: c for c in a.claims}


def pair(P, k, fm_us, hs_us, **kw):
    return [make_row(FM, P, k, fm_us, **kw), make_row(HS, P, k, hs_us, **kw)]


# --------------------------------------------------------------------------- (a) and (b)

def test_a_b_hold(tmp_path):
    c = verdicts(tmp_path, pair(16, 2048, 100, 180) + pair(256, 512, 100, 40))
    assert c["a"].verdict == cl.HOLDS and c["b"].verdict == cl.HOLDS
    assert "ratio hisparse/flashmla_sparse 1.8-1.8" in c["a"].evidence
    assert "hisparse faster in 1" in c["b"].evidence


def test_a_b_do_not_hold(tmp_path):
    # reversed, and a tie (within 5 %) does not favour the claimed side either
    c = verdicts(tmp_path, pair(16, 2048, 100, 60) + pair(256, 512, 100, 103))
    assert c["a"].verdict == cl.FAILS
    assert c["b"].verdict == cl.FAILS
    assert "within +-5% in 1" in c["b"].evidence


def test_a_depends_on_batch_size_with_boundary(tmp_path):
    rows = (pair(16, 2048, 100, 150, batch_size=1) + pair(16, 2048, 100, 130, batch_size=8)
            + pair(16, 2048, 100, 70, batch_size=64))
    c = verdicts(tmp_path, rows)
    assert c["a"].verdict == "depends on batch_size"
    assert c["a"].detail == ("batch_size <= 8: flashmla_sparse faster; "
                             "batch_size >= 64: hisparse faster")


def test_b_depends_on_pattern_mapping(tmp_path):
    rows = pair(256, 512, 100, 40, pattern="sliding_window") + pair(256, 512, 100, 160, pattern="random")
    c = verdicts(tmp_path, rows)
    assert c["b"].verdict == "depends on pattern"
    assert "pattern=random: flashmla_sparse faster" in c["b"].detail
    assert "pattern=sliding_window: hisparse faster" in c["b"].detail


def test_a_b_not_enough_data(tmp_path):
    # (16, 2048) exists but hisparse ran out of memory there; (256, 512) is not in the sweep
    rows = [make_row(FM, 16, 2048, 100), make_row(HS, 16, 2048, 0, status="oom")] + pair(64, 1024, 1, 2)
    c = verdicts(tmp_path, rows)
    assert c["a"].verdict == cl.NO_DATA
    assert "page_size=16, top_k=2048" in c["a"].detail and "hisparse oom" in c["a"].detail
    assert c["b"].verdict == cl.NO_DATA
    assert "page_size=256, top_k=512" in c["b"].detail


# --------------------------------------------------------------------------- (c)

def test_c_holds_from_step_table_and_fails(tmp_path):
    rows = pair(256, 512, 100, 50, pattern="clustered", pages_per_req=3.0)
    steps = {"job000": [dict(backend=FM, step=s, layer=l, request=r, warmup=s == 0, pages_touched=2 if s else 99,
                             tokens_selected=512) for s in range(4) for l in range(2) for r in range(4)]}
    c = verdicts(tmp_path, rows, steps)
    assert c["c"].verdict == cl.HOLDS
    # the warmup step (99 pages) is excluded: median 2 from 24 measured per-step rows
    assert "2 pages (median over 24 per-step rows" in c["c"].evidence
    assert "uniform-random expectation" in c["c"].evidence

    c = verdicts(tmp_path / "b", pair(256, 512, 100, 50, pattern="clustered", pages_per_req=40.0))
    assert c["c"].verdict == cl.FAILS
    assert "40 pages" in c["c"].evidence


def test_c_depends_on_pattern_and_not_enough_data(tmp_path):
    rows = (pair(256, 512, 100, 50, pattern="clustered(run=512)", pages_per_req=2.0)
            + pair(256, 512, 100, 50, pattern="clustered(run=8)", pages_per_req=60.0))
    c = verdicts(tmp_path, rows)
    assert c["c"].verdict == "depends on pattern"
    assert "pattern=clustered(run=512): within range" in c["c"].detail

    c = verdicts(tmp_path / "b", pair(256, 512, 100, 50, pattern="random"))
    assert c["c"].verdict == cl.NO_DATA
    assert "clustered" in c["c"].detail and "random" in c["c"].detail


# --------------------------------------------------------------------------- (d)

# coverage: 32 K context, page 256 -> 128 pages; pages_per_req sets the covered fraction

def test_d_holds_and_does_not_hold(tmp_path):
    rows = (pair(256, 2048, 100, 130, pages_per_req=120.0)       # 93 % covered, hisparse slower
            + pair(64, 2048, 100, 150, pages_per_req=300.0)      # 59 %, hisparse slower
            + pair(16, 512, 100, 50, pages_per_req=400.0))       # 20 %: not "most pages"
    c = verdicts(tmp_path, rows)
    assert c["d"].verdict == cl.HOLDS
    assert "2 cell(s) with page coverage >= 50%" in c["d"].evidence
    # over all cells the coverage boundary is found
    assert "page_coverage <= 0.195: hisparse faster; page_coverage >= 0.585: flashmla_sparse faster" \
        in c["d"].evidence

    c = verdicts(tmp_path / "b", pair(256, 2048, 100, 60, pages_per_req=120.0))
    assert c["d"].verdict == cl.FAILS


def test_d_depends_and_not_enough_data(tmp_path):
    rows = (pair(256, 2048, 100, 130, pages_per_req=120.0)
            + pair(256, 512, 100, 50, pages_per_req=100.0))
    c = verdicts(tmp_path, rows)
    assert c["d"].verdict == "depends on top_k"
    assert c["d"].detail == "top_k <= 512: hisparse faster; top_k >= 2048: flashmla_sparse faster"

    c = verdicts(tmp_path / "b", pair(256, 512, 100, 50, pages_per_req=3.0))
    assert c["d"].verdict == cl.NO_DATA
    assert "highest coverage in the run: 2.3%" in c["d"].detail


def test_find_boundary_needs_a_separating_axis():
    rows = pd.DataFrame({"batch_size": [1, 1, 8, 8], "pattern": ["a", "b", "a", "b"],
                         "o": [tb.BASE, tb.COORD, tb.COORD, tb.BASE]})
    assert cl.find_boundary(rows, "o", ["batch_size", "pattern"]) is None
    # two changes along a numeric axis: a mapping, not a threshold
    rows = pd.DataFrame({"x": [1, 2, 3], "o": [tb.BASE, tb.COORD, tb.BASE]})
    assert cl.find_boundary(rows, "o", ["x"]) == (
        "x", "x=1: flashmla_sparse faster; x=2: hisparse faster; x=3: flashmla_sparse faster")
    assert cl.find_boundary(rows, "o", ["x"], continuous=["x"]) is None
