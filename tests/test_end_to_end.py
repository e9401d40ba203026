"""End to end on the CPU: a Hydra multirun into a temporary directory, results, report, resume."""
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cli import run_harness
from backends import BACKENDS
from harness import results

ELAPSED = {}   # sweep directory -> seconds the sweep's process ran
SMALL = ["context_len=200", "steps=3", "timing.warmup_steps=1", "num_layers=2", "batch_size=2"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    t0 = time.perf_counter()
    run_harness("-m", "page_size=16,64", "top_k=32,64", *SMALL, f"hydra.sweep.dir={d}")
    ELAPSED[d] = time.perf_counter() - t0
    return d


def test_sweep_writes_one_row_per_point_and_backend(sweep):
    df = results.load(sweep)
    backends = sorted(df["backend"].unique())
    assert backends == sorted(BACKENDS)
    assert len(df) == 4 * len(backends)
    assert set(zip(df.page_size, df.top_k)) == {(16, 32), (16, 64), (64, 32), (64, 64)}
    assert (df["status"] == "ok").all(), df[["backend", "status", "error"]]
    assert (df["device"] == "cpu").all() and (df["model"] == "tiny").all()
    assert (df["max_rel_err"] < df["tolerance"]).all()
    assert (df["n_samples"] == 2 * 2).all()  # 2 measured steps x 2 layers
    # counts: every selected token is distinct and valid; pages touched lie in [tokens/P, tokens]
    assert (df["tokens_selected"] == df["top_k"] * 2 * 2 * 2).all()
    assert ((df["pages_touched"] * df["page_size"] >= df["tokens_selected"])
            & (df["pages_touched"] <= df["tokens_selected"])).all()
    fm = df[df.backend == "flashmla_sparse"]
    assert (fm["bytes_h2d"] == 0).all() and (fm["tokens_loaded"] == 0).all()
    for c in results.COLUMNS:
        assert c in df.columns
    assert df["repro_command"].str.startswith("python -m harness").all()


def test_rows_split_each_backends_wall_time(sweep):
    """setup_s / first_step_s / later_steps_s / final_check_s / teardown_s: every phase of every
    backend was timed (positive), and, being laps of one clock run one backend after another,
    all of them together fit inside the sweep process's own run time."""
    df = results.load(sweep)
    phases = ["setup_s", "first_step_s", "later_steps_s", "final_check_s", "teardown_s"]
    assert (df[phases] > 0).all().all(), df[phases]
    assert df[phases].to_numpy().sum() < ELAPSED[sweep]


def test_steps_table_matches_summary(sweep):
    df = results.load(sweep)
    st = results.load(sweep, steps=True)
    for _, row in df.iterrows():
        s = st[(st.job_dir == row.job_dir) & (st.backend == row.backend)]
        assert len(s) == 3 * 2 * 2  # steps x layers x requests
        meas = s[~s.warmup.astype(bool)]
        assert meas["tokens_selected"].sum() == row["tokens_selected"]
        assert meas["pages_touched"].sum() == row["pages_touched"]
        assert meas["tokens_loaded"].sum() == row["tokens_loaded"]


def test_report_written(sweep):
    rep = sweep / "report"
    text = (rep / "report.md").read_text()
    assert "not evidence about GPU performance" in text  # CPU rows: the claims say so
    assert list(rep.rglob("*.png"))


def test_rerun_skips_done_points_and_keeps_results(sweep):
    before = {p: p.stat().st_mtime_ns for p in sweep.rglob(results.RESULT_FILE)}
    r = run_harness("-m", "page_size=16,64", "top_k=32,64", *SMALL, f"hydra.sweep.dir={sweep}")
    assert "skip:" in r.stderr + r.stdout
    after = {p: p.stat().st_mtime_ns for p in sweep.rglob(results.RESULT_FILE)}
    assert before == after


def test_trace_record_and_replay(tmp_path):
    trace = tmp_path / "sel.npz"
    run_harness("backend=flashmla_sparse", "pattern=clustered", *SMALL, "top_k=32",
             f"selection.record={trace}", f"hydra.run.dir={tmp_path}/a", "report=false")
    with np.load(trace) as z:
        assert z["topk"].shape == (3, 2, 2, 32) and z["seq_lens"].shape == (3, 2)
    run_harness("backend=flashmla_sparse", "selection=trace", f"selection.path={trace}", "steps=3",
             "num_layers=2", "batch_size=2", "top_k=32", "timing.warmup_steps=1",
             f"hydra.run.dir={tmp_path}/b", "report=false")
    a = results.load(tmp_path / "a").iloc[0]
    b = results.load(tmp_path / "b").iloc[0]
    assert b["selection"] == "trace" and b["status"] == "ok"
    assert a["pages_touched"] == b["pages_touched"] and a["tokens_selected"] == b["tokens_selected"]
    assert b["context_len"] == 200
