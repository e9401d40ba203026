"""Progress of a sweep (a bar in a terminal, plain lines piped, in CI, or from a parallel
launcher's workers) and ``python -m harness.doctor`` (table, JSON, exit codes), on the CPU."""
import errno
import fcntl
import io
import json
import logging
import os
import re
import struct
import subprocess
import sys
import termios

import pytest
import torch
from omegaconf import OmegaConf

from cli import ROOT, run_harness
from harness import doctor, progress, results

TINY_SWEEP = ["-m", "page_size=16,32", "device=cpu", "model=tiny", "context_len=64", "top_k=16",
              "steps=2", "timing.warmup_steps=1", "num_layers=1", "batch_size=2",
              "backend=flashmla_sparse", "report=false"]
ANSI = re.compile(r"\x1b\[")
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_pty(args, env):
    """Runs ``python -m harness ARGS`` with stdin, stdout and stderr on a 160-column
    pseudo-terminal; returns ``(exit code, everything it wrote)``."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    p = subprocess.Popen([sys.executable, "-m", "harness", *args], stdin=slave, stdout=slave,
                         stderr=slave, env=env, cwd=ROOT, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 65536)
        except OSError as e:  # EIO: the child closed the terminal
            if e.errno != errno.EIO:
                raise
            break
        if not b:
            break
        chunks.append(b)
    os.close(master)
    return p.wait(timeout=300), b"".join(chunks).decode(errors="replace")


def terminal_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE")}
    return {**env, "TERM": "xterm-256color", **extra}


def assert_points_written(sweep_dir, n):
    assert len(list(sweep_dir.rglob(results.RESULT_FILE))) == n
    assert (results.load(sweep_dir)["status"] == "ok").all()


def test_sweep_bar_in_a_terminal(tmp_path):
    # a swept list value: the bar shows it as text (rich would read '[4]' as markup)
    sweep = [a if a != "page_size=16,32" else "capacity.batch_sizes=[2],[4]" for a in TINY_SWEEP]
    rc, out = run_in_pty([*sweep, f"hydra.sweep.dir={tmp_path}"], terminal_env())
    assert rc == 0, out[-3000:]
    assert ANSI.search(out) and "\r\x1b[2K" in out  # a redrawn bar, not lines
    text = ESCAPE.sub("", out)
    assert re.search(r" 1/2 ", text) and re.search(r" 2/2 ", text)  # the bar's i of N
    assert "point capacity.batch_sizes=[4]" in text  # the running point's swept value
    assert "flashmla_sparse: step" in text  # the step bar under it
    assert "point 1/2:" not in text  # the plain lines are not printed beside the bar
    assert_points_written(tmp_path, 2)


def plain_checks(out: str) -> None:
    """Plain progress lines: no escape sequences, no carriage-return redraws, i of N, time left."""
    assert not ANSI.search(out) and "\r" not in out
    assert "sweep: 2 points into" in out
    assert re.search(r"point 1/2: page_size=16\n", out) and re.search(r"point 2/2: page_size=32\n", out)
    assert re.search(r"point 1/2 done in [\d.]+ s: page_size=16 \(elapsed [\d.]+ s, about [\d.]+ s left\)", out)
    assert re.search(r"point 2/2 done in [\d.]+ s: page_size=32 \(elapsed [\d.]+ s\)\n", out)
    assert re.search(r"sweep: 2 points in [\d.]+ s", out)


def test_sweep_plain_lines_in_ci_even_on_a_terminal(tmp_path):
    rc, out = run_in_pty([*TINY_SWEEP, f"hydra.sweep.dir={tmp_path}"], terminal_env(CI="true"))
    assert rc == 0, out[-3000:]
    plain_checks(out.replace("\r\n", "\n"))  # the terminal itself turns \n into \r\n
    assert_points_written(tmp_path, 2)


def test_sweep_plain_lines_when_piped(tmp_path):
    r = subprocess.run([sys.executable, "-m", "harness", *TINY_SWEEP, f"hydra.sweep.dir={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=terminal_env())
    assert r.returncode == 0, r.stderr[-3000:]
    plain_checks(r.stdout + r.stderr)
    assert_points_written(tmp_path, 2)


def test_parallel_launcher_workers_print_lines(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    rc, out = run_in_pty([*TINY_SWEEP, f"hydra.sweep.dir={tmp_path}", "hydra/launcher=joblib",
                          "hydra.launcher.n_jobs=2"], terminal_env())
    assert rc == 0, out[-3000:]
    # each worker names its point (hydra.job.num + 1 of N) on lines; no bar in any process
    assert "point 1/2: page_size=16" in out and "point 2/2: page_size=32" in out
    assert "\x1b[2K" not in out
    assert "sweep: 2 points, run by the launcher's workers" in out
    assert_points_written(tmp_path, 2)


def test_sweep_shape_counts_preset_and_command_line_axes():
    cfg = OmegaConf.create({"hydra": {
        "sweeper": {"_target_": progress.BASIC_SWEEPER, "params": {"page_size": "16,64,256", "top_k": "64,256"}},
        "overrides": {"task": ["+sweep=cpu_smoke", "seed=0,1", "device=cpu"]}}})
    n, keys = progress.sweep_shape(cfg)
    assert n == 3 * 2 * 2 and keys == ["page_size", "top_k", "seed"]
    cfg.hydra.sweeper._target_ = "some.other.Sweeper"
    assert progress.sweep_shape(cfg) == (None, ["page_size", "top_k", "seed"])
    assert progress.point_label(["page_size=64", "top_k=256", "seed=1", "device=cpu"], keys) == \
        "page_size=64 top_k=256 seed=1"
    assert progress.point_label(["device=cpu"], []) == "device=cpu"


def test_time_left_and_durations():
    assert progress.time_left(10.0, 2, 5) == "about 15.0 s left"  # 5 s a point, 3 to go
    assert progress.time_left(10.0, 0, 5) == "" and progress.time_left(10.0, 5, 5) == ""
    assert progress.time_left(10.0, 2, None) == ""
    assert progress.duration(245) == "4 min 05 s" and progress.duration(7380) == "2 h 03 min"


def test_plain_step_lines_at_most_one_per_interval(monkeypatch, caplog):
    monkeypatch.setattr(progress.DISPLAY, "plain", True)
    monkeypatch.setattr(progress, "PLAIN_STEP_INTERVAL_S", 0.0)
    with caplog.at_level(logging.INFO, logger="harness"):
        assert list(progress.steps(3, "hisparse", {"batch_size": 8})) == [0, 1, 2]
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2, msgs  # after steps 1 and 2; the last step is the backend's own line
    assert re.match(r"hisparse batch 8: step 1/3, elapsed [\d.]+ s, about [\d.]+ s left$", msgs[0])
    assert msgs[1].startswith("hisparse batch 8: step 2/3")
    caplog.clear()
    monkeypatch.setattr(progress, "PLAIN_STEP_INTERVAL_S", 3600.0)
    with caplog.at_level(logging.INFO, logger="harness"):
        assert list(progress.steps(3, "hisparse")) == [0, 1, 2]
    assert not caplog.records  # fast steps print nothing


def test_interactive_needs_a_terminal_and_no_ci(monkeypatch):
    class Tty:
        def isatty(self):
            return True
    for value, want in (("true", False), ("1", False), ("false", True), ("", True)):
        monkeypatch.setenv("CI", value)
        assert progress.interactive(Tty()) is want, value
    monkeypatch.delenv("CI")
    assert progress.interactive(Tty()) and not progress.interactive(open(os.devnull, "w"))


def ulimit_l_bytes():
    out = subprocess.run(["bash", "-c", "ulimit -l"], capture_output=True, text=True).stdout.strip()
    return None if out == "unlimited" else int(out) * 1024


def test_doctor_json_and_table():
    r = run_harness("--json", module="harness.doctor")
    rep = json.loads(r.stdout)
    assert rep["ok"] is True and rep["problems"] == []
    for section in doctor.SECTIONS:
        assert rep[section], section
    for item in (i for s in doctor.SECTIONS for i in rep[s].values()):
        assert item["status"] in doctor.STATUSES and item["detail"]
    assert rep["device"]["default"]["device"] == "cpu"          # the CPU suite hides the GPUs
    assert rep["versions"]["torch"]["version"] == torch.__version__
    assert rep["triton"]["kernel"]["status"] == "ok"
    assert rep["memory"]["memlock"]["soft_bytes"] == ulimit_l_bytes()
    from backends.host_memory import hugetlb_free_bytes
    from harness.env import host_virtualized
    assert rep["memory"]["hugepages"]["free_2m"] == hugetlb_free_bytes(2 << 20) // (2 << 20)
    assert rep["memory"]["hugepages"]["free_1g"] == hugetlb_free_bytes(1 << 30) // (1 << 30)
    assert rep["memory"]["virtualized"]["virtualized"] == host_virtualized()
    assert rep["launchers"]["basic"]["status"] == "ok"
    for peer in ("flashmla", "sglang_kernel", "vllm"):
        p = rep["peers"][peer]
        assert p["status"] in ("ok", "missing") and len(p["detail"]) > 10, p
    assert rep["triton"]["mode"]["mode"] == "interpreter"
    assert "CUDA" in rep["peers"]["flashmla"]["detail"] and "CUDA" in rep["peers"]["sglang_kernel"]["detail"]
    assert rep["ceilings"]["measured"]["measured"] is False
    assert "skipped on the CPU" in rep["ceilings"]["measured"]["detail"]
    k = rep["kernels"]["cuda_resolve"]
    assert k["status"] == "missing" and "takes the Triton resolve here" in k["detail"] and \
        "needs a CUDA device" in k["detail"]
    # the table (plain: stdout is a pipe) holds the same items with the same statuses
    t = run_harness(module="harness.doctor")
    assert not ANSI.search(t.stdout)
    lines = t.stdout.splitlines()
    for section in doctor.SECTIONS:
        for name, item in rep[section].items():
            assert any(re.match(rf"{section}\s+{re.escape(name)}\s+{item['status']}\s", ln) for ln in lines), \
                (section, name)


def test_doctor_table_on_a_terminal_keeps_brackets():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    out = Tty()
    doctor.print_table([doctor.Item("peers", "flashmla", "missing", "pip install -e '.[flashmla]'"),
                        doctor.Item("triton", "mode", "problem", "[bold]x[/] stays text")], out)
    text = ESCAPE.sub("", out.getvalue())
    assert "pip install -e '.[flashmla]'" in text and "[bold]x[/] stays text" in text
    assert re.search(r"flashmla\s*│\s*missing", text)


def test_doctor_exits_1_naming_what_the_default_run_lacks(tmp_path):
    hidden = tmp_path / "hydra"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('hydra is hidden by the test')\n")
    r = subprocess.run([sys.executable, "-m", "harness.doctor"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the default run cannot work" in r.stderr and "hydra.config" in r.stderr
    assert "Traceback" not in r.stderr


def test_triton_interpreter_on_a_gpu_is_a_problem(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    mode = doctor.triton_items("1")[0]
    assert mode.status == "problem" and "TRITON_INTERPRET" in mode.detail
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert doctor.triton_items(None)[0].status == "ok"
