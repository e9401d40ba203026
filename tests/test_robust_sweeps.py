"""Sweeps that survive anything (issue 14, items 1-3 and 7): every failure is a row and the sweep
goes on, exit codes from the written rows, results that never poison a sweep (atomic files,
unreadable ones skipped and redone, one lock per point), a sweep directory found again, and
errors a user understands. Tiny points on the CPU (Triton interpreter)."""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cli import ROOT, compose
from harness import results
from harness.command_line import check_command_line, sweep_dir_name, with_sweep_dir
from harness.point_lock import LOCK_FILE, is_locked, point_lock
from harness.selection import Trace
from harness.sweep_outcome import sweep_outcome
from harness.validate import ConfigError, validate

TINY = ["device=cpu", "model=tiny", "context_len=64", "top_k=16", "steps=2", "timing.warmup_steps=1",
        "num_layers=1", "batch_size=2", "backend=flashmla_sparse"]


#: in-process points run on the CPU, which needs the Triton interpreter chosen before the kernels
#: were imported (tests/conftest.py does so only on a machine without CUDA)
cpu_in_process = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                    reason="in-process CPU points need TRITON_INTERPRET=1")


def harness(*args, cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=env)


def no_traceback(r: subprocess.CompletedProcess) -> bool:
    return "Traceback" not in r.stderr and "Traceback" not in r.stdout


# ------------------------------------------------------------------ every failure is a row

@pytest.fixture(scope="module")
def mixed_sweep(tmp_path_factory):
    """top_k 64 is invalid for hisparse only (its buffer holds 32); context_len 10**12 overflows
    int32 positions (before: ValueError in the selection generator, no row, no report)."""
    d = tmp_path_factory.mktemp("mixed") / "sw"
    args = [a for a in TINY if not a.startswith(("backend", "top_k", "context_len"))]
    r = harness("-m", *args, "backend=flashmla_sparse,hisparse", "top_k=64,16",
                "context_len=64,1000000000000", "hisparse.device_buffer_size=32", f"hydra.sweep.dir={d}")
    return d, r


def test_joint_invalid_and_overflow_points_become_rows_and_the_sweep_goes_on(mixed_sweep):
    d, r = mixed_sweep
    assert r.returncode == 0, r.stderr[-3000:]          # invalid is an outcome of a grid
    df = results.load(d)
    assert len(df) == 8                                  # 2 backends x 2 top_k x 2 contexts
    big = df[df["context_len"] == 10 ** 12]
    assert (big["status"] == "invalid").all()
    assert big["error"].str.contains("context_len=1000000000000").all()
    assert big["error"].str.contains("2\\*\\*31").all()
    small = df[df["context_len"] == 64].set_index(["backend", "top_k"])
    assert small.loc[("hisparse", 64), "status"] == "invalid"
    assert "hisparse.device_buffer_size=32" in small.loc[("hisparse", 64), "error"]
    assert ">= top_k (64)" in small.loc[("hisparse", 64), "error"]
    for point in [("flashmla_sparse", 64), ("flashmla_sparse", 16), ("hisparse", 16)]:
        assert small.loc[point, "status"] == "ok"
        assert small.loc[point, "max_rel_err"] < small.loc[point, "tolerance"]
    assert (d / "report" / "report.md").exists()
    assert f"sweep {d}: 8 points, 8 rows: ok 3, invalid 5" in r.stdout


def test_single_run_overflow_is_a_validation_error(tmp_path):
    r = harness(*TINY, "context_len=1000000000000", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 2 and no_traceback(r)
    assert "context_len=1000000000000" in r.stderr and "int32" in r.stderr
    assert not (tmp_path / "run" / "result.parquet").exists()


@pytest.mark.parametrize("over,field", [
    (["context_len=2147483600", "steps=100", "timing.warmup_steps=1"], "context_len"),
    (["batch_size=70000", "context_len=40000"], "batch_size"),
    (["scenario=extend", "context_len=1800000000", "extend.prefix_spread=0.25"], "context_len"),
])
def test_unrepresentable_sizes_name_the_field(over, field):
    cfg = compose(*[a for a in TINY if not a.startswith(("steps", "timing", "context_len"))], *over)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert e.value.field == field and "2**31" in str(e.value)


def test_largest_representable_context_is_accepted():
    cfg = compose(*[a for a in TINY if not a.startswith("context_len")], f"context_len={2**31 - 3}",
                  "batch_size=1", "page_size=64")
    validate(cfg)                  # 2**31 - 1 positions, one request: 2**31 slots, the last at 2**31 - 1
    cfg = compose(*[a for a in TINY if not a.startswith("context_len")], f"context_len={2**31 - 3}",
                  "batch_size=2", "page_size=64")
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert e.value.field == "batch_size"


@cpu_in_process
def test_an_unexpected_exception_becomes_error_rows(tmp_path, monkeypatch):
    """An exception inside the point (here the selection generator raising what int32 overflow
    raised before validation caught it) gives one error row per backend with the message."""
    import harness.scenarios.decode as decode
    from harness.cli import run_job

    def boom(*a, **k):
        raise ValueError("negative dimensions are not allowed")
    monkeypatch.setattr(decode, "synthetic_selection", boom)
    args = [a for a in TINY if not a.startswith("backend")]
    for in_sweep, d in ((False, tmp_path / "single"), (True, tmp_path / "swept")):
        code = run_job(compose(*args, "backend=all"), d, "python -m harness ...", in_sweep=in_sweep)
        assert code == 1
        df = results.load(d)
        assert sorted(df["backend"]) == ["flashmla_sparse", "hisparse", "hisparse_connector"]
        assert (df["status"] == "error").all()
        assert df["error"].str.contains("ValueError: negative dimensions are not allowed").all()
        assert (df["top_k"] == 16).all() and (df["context_len"] == 64).all()


def test_a_failing_point_gives_exit_1_after_the_others_ran(tmp_path):
    """Point 0 cannot write its steps table (a directory is in the way): an error row, the next
    point still runs, the summary names the failure, the report is written, exit code 1."""
    d = tmp_path / "sw"
    (d / "0" / results.STEPS_FILE).mkdir(parents=True)
    r = harness("-m", *[a for a in TINY if not a.startswith("seed")], "seed=0,1", f"hydra.sweep.dir={d}",
                "hydra.sweep.subdir=${hydra.job.num}")
    assert r.returncode == 1, r.stderr[-3000:]
    df = results.load(d).set_index("seed")
    assert df.loc[0, "status"] == "error" and "IsADirectoryError" in df.loc[0, "error"]
    assert df.loc[1, "status"] == "ok"
    assert "2 points, 2 rows: ok 1, error 1" in r.stdout and "error     0 [flashmla_sparse]" in r.stdout
    assert (d / "report" / "report.md").exists()


# ------------------------------------------------------------------ results never poison a sweep

def test_load_skips_a_truncated_result_with_one_warning(mixed_sweep):
    d, _ = mixed_sweep
    n = len(results.load(d))
    tree = d.parent / "copy"
    import shutil
    shutil.copytree(d, tree, ignore=shutil.ignore_patterns("report"))
    victim = sorted(tree.rglob(results.RESULT_FILE))[0]
    lost = len(pd.read_parquet(victim))
    victim.write_bytes(victim.read_bytes()[:200])
    with pytest.warns(results.UnreadableResultWarning) as w:
        df = results.load(tree)
    assert len(w) == 1 and str(victim) in str(w[0].message)
    assert len(df) == n - lost
    assert str(victim.parent) not in set(df["job_dir"])


@cpu_in_process
def test_resume_redoes_a_truncated_result_and_skips_a_complete_one(tmp_path, caplog):
    from harness.cli import run_job
    d = tmp_path / "job"
    assert run_job(compose(*TINY), d, "repro", in_sweep=True) == 0
    first = results.load(d)
    caplog.set_level("INFO", logger="harness")
    run_job(compose(*TINY), d, "repro", in_sweep=True)
    assert "already holds this point" in caplog.text
    assert results.load(d)["timestamp"].tolist() == first["timestamp"].tolist()   # not re-run
    path = d / results.RESULT_FILE
    path.write_bytes(path.read_bytes()[:100])
    caplog.clear()
    assert run_job(compose(*TINY), d, "repro", in_sweep=True) == 0
    assert "cannot be read" in caplog.text and "redoing" in caplog.text
    again = results.load(d)
    assert again["status"].tolist() == ["ok"] and again["config_hash"].tolist() == first["config_hash"].tolist()
    caplog.clear()
    run_job(compose(*TINY, "overwrite=true"), d, "repro", in_sweep=True)   # overwrite: runs again
    assert "already holds" not in caplog.text and "wrote" in caplog.text


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    """A write that fails half way leaves the previous file intact and no temporary file."""
    rows = [{"backend": "flashmla_sparse", "status": "ok", "schema_version": 1, "top_k": 7}]
    results.write_results(tmp_path, rows)

    def torn(self, f, **kw):
        f.write(b"PAR1 half a file")
        raise OSError("disk full")
    monkeypatch.setattr(pd.DataFrame, "to_parquet", torn)
    with pytest.raises(OSError):
        results.write_results(tmp_path, [{**rows[0], "top_k": 8}])
    monkeypatch.undo()
    assert results.load(tmp_path)["top_k"].tolist() == [7]
    assert sorted(p.name for p in tmp_path.iterdir()) == [results.RESULT_FILE]


def test_compact_round_trips(mixed_sweep, tmp_path):
    d, _ = mixed_sweep
    out = tmp_path / "all.parquet"
    assert results.main(["compact", str(d), "--out", str(out)]) == 0
    pd.testing.assert_frame_equal(results.load(out), results.load(d))
    path, n = results.compact(d)
    assert path == d / results.COMPACT_FILE and n == 8
    pd.testing.assert_frame_equal(results.load(path), results.load(d))
    assert len(results.load(d)) == 8                     # the compact file is not counted twice


LOCK_HOLDER = """
import sys, time
from harness.point_lock import point_lock
with point_lock(sys.argv[1]) as held:
    print("held" if held else "busy", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_point_locked_by_another_process_is_skipped(tmp_path):
    job = tmp_path / "job"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(job), "60"], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert is_locked(job)
        with point_lock(job) as held:
            assert held is False                         # another process holds it
        r = harness(*TINY, f"hydra.run.dir={job}")
        assert r.returncode == 0, r.stderr[-2000:]
        assert "is being run by another process" in r.stdout + r.stderr
        assert not (job / results.RESULT_FILE).exists()
    finally:
        holder.kill()
        holder.wait()
    assert not is_locked(job)                            # released when its holder dies (kill -9)


def test_two_concurrent_sweeps_compute_each_point_once(tmp_path):
    d = tmp_path / "sw"
    cmd = [sys.executable, "-m", "harness", "-m", *[a for a in TINY if not a.startswith("seed")],
           "seed=0,1,2,3", f"hydra.sweep.dir={d}", "report=false"]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    computed = sum(o.count("wrote ") for o in outs)
    skipped = sum(o.count("skip: ") for o in outs)
    assert computed == 4 and skipped == 4, outs
    df = results.load(d)
    assert sorted(df["seed"]) == [0, 1, 2, 3] and (df["status"] == "ok").all()


def test_summary_counts_running_and_missing_points(tmp_path):
    base = {"backend": "flashmla_sparse", "schema_version": 1}
    results.write_results(tmp_path / "a", [{**base, "status": "ok"}])
    results.write_results(tmp_path / "b", [{**base, "status": "incorrect", "error": "beyond tolerance\nmore"}])
    results.write_results(tmp_path / "c", [{**base, "status": "oom"}])
    (tmp_path / "d" / ".hydra").mkdir(parents=True)        # a job that started and left nothing
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / results.RESULT_FILE).write_bytes(b"PAR1 torn")
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(tmp_path / "f"), "60"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        out = sweep_outcome(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert out.points == 6 and out.rows_by_status == {"ok": 1, "incorrect": 1, "oom": 1}
    assert out.failed == [("b", "flashmla_sparse", "incorrect", "beyond tolerance")]
    assert out.missing == ["d", "e"] and out.running == ["f"] and out.exit_code == 1
    text = "\n".join(out.lines())
    assert "6 points, 3 rows: ok 1, incorrect 1, oom 1" in text and "running   f" in text
    ok_only = tmp_path / "only_ok"
    results.write_results(ok_only / "a", [{**base, "status": "ok"}])
    results.write_results(ok_only / "b", [{**base, "status": "invalid"}])
    assert sweep_outcome(ok_only).exit_code == 0


# ------------------------------------------------------------------ a sweep directory you can find again

def test_same_preset_command_resumes_its_directory_and_latest_points_at_it(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    args = ["+sweep=cpu_smoke", *[a for a in TINY if not a.startswith("steps")], "page_size=16",
            "steps=2", "report=false"]
    first = harness(*args, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    sweeps = tmp_path / "results" / "sweeps"
    dirs = [p for p in sweeps.iterdir() if p.name != "latest"]
    assert len(dirs) == 1 and dirs[0].name.startswith("cpu_smoke-")
    assert (sweeps / "latest").is_symlink() and (sweeps / "latest").resolve() == dirs[0].resolve()
    assert len(results.load(dirs[0])) == 1
    again = harness(*args, cwd=tmp_path, env=env)
    assert again.returncode == 0
    assert [p for p in sweeps.iterdir() if p.name != "latest"] == dirs
    assert "already holds this point" in again.stdout + again.stderr


def test_sweep_dir_name_is_stable_and_explicit_dir_wins():
    a = sweep_dir_name(["+sweep=page_topk", "pattern=clustered", "overwrite=true"])
    assert a == sweep_dir_name(["pattern=clustered", "+sweep=page_topk", "report=false",
                                "hydra/launcher=basic"])
    assert a.startswith("page_topk-") and a != sweep_dir_name(["+sweep=page_topk", "pattern=mixed"])
    assert sweep_dir_name(["top_k=1,2"]).startswith("sweep-")
    assert with_sweep_dir(["-m", "top_k=1,2", "hydra.sweep.dir=/x/y"]) == ["-m", "top_k=1,2", "hydra.sweep.dir=/x/y"]
    assert with_sweep_dir(["-m", "top_k=1,2"])[-1] == f"hydra.sweep.dir=results/sweeps/{sweep_dir_name(['top_k=1,2'])}"
    from hydra._internal.utils import get_args_parser
    for argv in (["model=tiny", "--cfg", "job"], ["-m", "top_k=1,2", "--cfg", "hydra"], ["--cfg", "job"]):
        args = get_args_parser().parse_args(with_sweep_dir(argv))   # still one run of overrides
        assert args.cfg in ("job", "hydra") and args.overrides[-1].startswith("hydra.sweep.dir=results/sweeps/")


# ------------------------------------------------------------------ traces

def _trace(tmp_path, name, topk_dtype=np.int32, seq_dtype=np.int32, duplicate=False):
    rng = np.random.default_rng(3)
    topk = np.stack([rng.permutation(65)[:16] for _ in range(2 * 1 * 2)]).reshape(2, 1, 2, 16)
    if duplicate:
        topk[1, 0, 1, 5] = topk[1, 0, 1, 2]
    path = tmp_path / name
    np.savez(path, topk=topk.astype(topk_dtype), seq_lens=np.full((2, 2), 65).astype(seq_dtype))
    return path


def test_truncated_trace_exits_2_without_traceback(tmp_path):
    good = _trace(tmp_path, "t.npz")
    bad = tmp_path / "cut.npz"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    r = harness(*TINY, "selection=trace", f"selection.path={bad}", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 2 and no_traceback(r)
    assert "selection.path=" in r.stderr and "not an .npz archive" in r.stderr


def test_trace_without_path_exits_2_without_traceback(tmp_path):
    r = harness(*TINY, "selection=trace", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 2 and no_traceback(r)
    assert "selection.path=None" in r.stderr and "give selection.path=FILE.npz" in r.stderr


@pytest.mark.parametrize("case,needle", [
    ("random_bytes", "not an .npz archive"),
    ("float32", "topk has dtype float32; it must be int32"),
    ("int64", "topk has dtype int64; it must be int32"),
    ("seq_int64", "seq_lens has dtype int64; it must be int32"),
    ("duplicate", "selects position"),
    ("missing_file", "does not exist"),
])
def test_bad_traces_are_rejected_naming_the_problem(tmp_path, case, needle):
    path = {
        "float32": lambda: _trace(tmp_path, "f.npz", topk_dtype=np.float32),
        "int64": lambda: _trace(tmp_path, "i.npz", topk_dtype=np.int64),
        "seq_int64": lambda: _trace(tmp_path, "s.npz", seq_dtype=np.int64),
        "duplicate": lambda: _trace(tmp_path, "d.npz", duplicate=True),
        "missing_file": lambda: tmp_path / "nothing.npz",
    }.get(case, lambda: None)()
    if case == "random_bytes":
        path = tmp_path / "r.npz"
        path.write_bytes(np.random.default_rng(1).bytes(4096))
    cfg = compose(*TINY, "selection=trace", f"selection.path={path}")
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert e.value.field == "selection.path" and needle in str(e.value)
    if case == "duplicate":
        assert "twice in row [step 1, layer 0, request 1]" in str(e.value)
    if case == "random_bytes":
        assert "pickle" not in str(e.value)


def test_a_trace_in_the_format_is_accepted(tmp_path):
    validate(compose(*TINY, "selection=trace", f"selection.path={_trace(tmp_path, 'ok.npz')}"))


# ------------------------------------------------------------------ errors a user understands

def test_unknown_key_exits_2_naming_it(tmp_path):
    r = harness(*TINY, "topk=5", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 2 and no_traceback(r)
    assert "topk='5': unknown key; did you mean top_k?" in r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv,needle", [
    (["top_k=abc"], "top_k='abc': must be an integer >= 1"),
    (["hisparse.copy_engin=x"], "hisparse.copy_engin='x': unknown key; did you mean hisparse.copy_engine?"),
    (["+contxt_len=5"], "contxt_len='5': unknown key; did you mean context_len?"),
    (["timing.cold_l2=maybe"], "timing.cold_l2='maybe': must be true or false"),
    (["model=huge"], "model='huge': no such option; allowed: auto, dsv32, tiny"),
    (["+sweep=nope"], "sweep='nope': no such option; allowed: capacity, cpu_smoke, granularity, page_topk"),
    (["-m", "hisparse.device_buffer_size=32,abc"], "hisparse.device_buffer_size='abc': must be an integer or null"),
    (["+sweep=page_topk", "hisparse.device_buffer_size=x"], "hisparse.device_buffer_size='x'"),
    (["top_k=["], "top_k='[': cannot parse this override"),
])
def test_command_line_errors_name_the_key_and_what_is_allowed(argv, needle):
    with pytest.raises(ConfigError) as e:
        check_command_line(argv)
    assert needle in str(e.value)


def test_good_command_lines_pass_the_check():
    check_command_line(["-m", "top_k=16,32", "hisparse.device_buffer_size=64", "model=tiny"])
    check_command_line(["+sweep=granularity", "page_size=16"])
    check_command_line(["--help"])


def test_help_lists_every_key_with_a_description_and_its_allowed_values():
    r = harness("--help")
    assert r.returncode == 0
    text = r.stdout
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith("  ") and ln.split()}
    cfg = compose()
    from omegaconf import OmegaConf
    tree = OmegaConf.to_container(cfg, resolve=False)

    def leaves(node, prefix=""):
        for k, v in node.items():
            yield from leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    keys = [k for k in leaves(tree) if k not in ("phase", "selection.source")]
    for k in keys:
        assert k in lines, k
        desc = lines[k][len(k):].split("[")[0].strip()
        assert desc, f"{k} has no description"
        assert "allowed:" in lines[k]
    assert "one of uva_kernel, memcpy, staged" in lines["hisparse.copy_engine"]
    assert "a power of two" in lines["page_size"] and "an integer >= 1" in lines["top_k"]
    assert "+sweep=NAME" in text
    for preset in (ROOT / "sweeps").glob("*.yaml"):
        assert preset.stem in lines, preset.stem
