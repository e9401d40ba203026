"""Launchers (``harness.launchers``): ``hydra/launcher=local_gpus`` gives the same rows as the
sequential launcher, each point on a slot of its own, the report once; slot locks are exclusive
and pin a worker to its GPU; bad ``gpus`` values exit 2; ``hydra/launcher=slurm`` submits one
array job with the configured GPUs, time, partition and array parallelism.

On the CPU the slots are simulated (``hydra.launcher.gpus=2``: two locked slots, two joblib
workers, ``CUDA_VISIBLE_DEVICES`` untouched); GPU pinning is checked on GPU machines (README)."""
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from backends.base import ConfigError
from harness import launchers, results
from harness.launchers import SlotPlan, plan_slots, take_slot

REPO = Path(__file__).resolve().parents[1]
SWEEP = ["-m", "page_size=16,32", "top_k=16,32", "device=cpu", "model=tiny", "context_len=64",
         "steps=2", "timing.warmup_steps=1", "num_layers=1", "batch_size=2",
         "backend=flashmla_sparse"]
#: what must not depend on the launcher
SAME = ["status", "config_hash", "repro_command", "page_size", "top_k", "tokens_selected",
        "pages_touched", "bytes_selected", "bytes_hbm_read", "max_rel_err"]


def harness(*args, env=None, timeout=240):
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    e = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=timeout)


def rows(sweep_dir: Path) -> pd.DataFrame:
    df = results.load(sweep_dir)
    df["point"] = [Path(j).name for j in df["job_dir"]]
    return df.set_index("point").sort_index()


@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    """SWEEP through the sequential launcher: the rows both parallel launchers must give (one
    run shared by their tests)."""
    d = tmp_path_factory.mktemp("seq")
    seq = harness(*SWEEP, "report=true", f"hydra.sweep.dir={d}")
    assert seq.returncode == 0, (seq.stdout[-3000:], seq.stderr[-3000:])
    return d


def test_local_gpus_gives_the_sequential_rows_each_point_on_its_own_slot(tmp_path, sequential):
    par = harness(*SWEEP, "report=true", f"hydra.sweep.dir={tmp_path / 'par'}",
                  "hydra/launcher=local_gpus", "hydra.launcher.gpus=2")
    assert par.returncode == 0, par.stderr[-3000:]
    a, b = rows(sequential), rows(tmp_path / "par")
    assert len(a) == 4 and list(a.index) == list(b.index)
    pd.testing.assert_frame_equal(a[SAME], b[SAME])
    assert set(a["status"]) == {"ok"}
    assert a["gpu_slot"].isna().all()
    # two workers, each holding one slot for all its points; both slots worked
    assert set(b["gpu_slot"]) == {0, 1}
    took = [ln for ln in par.stdout.splitlines() if "took slot" in ln]
    assert len(took) == 2 and len({ln.split("process ")[1].split()[0] for ln in took}) == 2
    # the report: once, by the sweep's own process, over all four points
    out = par.stdout + par.stderr
    assert out.count(f"report: {tmp_path / 'par'}") == 1, out[-3000:]
    assert (tmp_path / "par" / "report" / "report.md").exists()
    lock_files = sorted(p.name for p in (tmp_path / "par" / launchers.SLOT_DIR).iterdir())
    assert lock_files == ["slot-0.lock", "slot-1.lock"]


def test_submitit_local_gives_the_sequential_rows(tmp_path, sequential):
    """The same 4-point sweep through hydra-submitit-launcher's local executor (each point a
    submitit job in a process of its own): the sequential launcher's rows, the report once."""
    sub = harness(*SWEEP, "report=true", f"hydra.sweep.dir={tmp_path / 'sub'}",
                  "hydra/launcher=submitit_local")
    assert sub.returncode == 0, (sub.stdout[-3000:], sub.stderr[-3000:])
    a, b = rows(sequential), rows(tmp_path / "sub")
    assert len(a) == 4 and list(a.index) == list(b.index)
    pd.testing.assert_frame_equal(a[SAME], b[SAME])
    assert set(b["status"]) == {"ok"} and b["gpu_slot"].isna().all()
    jobs = [p for p in (tmp_path / "sub" / ".submitit").iterdir() if p.name.isdigit()]
    assert len(jobs) == 4                      # one submitit job (a process) per point
    assert (tmp_path / "sub" / "report" / "report.md").exists()
    out = sub.stdout + sub.stderr
    assert out.count(f"report: {tmp_path / 'sub'}") == 1, out[-3000:]


def test_local_gpus_with_one_slot_runs_in_the_sweep_process(tmp_path):
    """Default ``gpus`` on the CPU: one simulated slot, joblib runs the points inline."""
    r = harness("-m", "top_k=16,32", "device=cpu", "model=tiny", "context_len=64", "steps=2",
                "timing.warmup_steps=1", "num_layers=1", "batch_size=2",
                "backend=flashmla_sparse", "report=false", f"hydra.sweep.dir={tmp_path}",
                "hydra/launcher=local_gpus")
    assert r.returncode == 0, r.stderr[-3000:]
    df = rows(tmp_path)
    assert len(df) == 2 and set(df["status"]) == {"ok"} and set(df["gpu_slot"]) == {0}
    assert "over 1 slot(s): simulated" in r.stdout


@pytest.mark.parametrize("gpus", ["0", "two"])
def test_bad_gpus_exits_2_before_any_point(tmp_path, gpus):
    r = harness("-m", "top_k=16,32", "device=cpu", "model=tiny", "report=false",
                f"hydra.sweep.dir={tmp_path}", "hydra/launcher=local_gpus",
                f"hydra.launcher.gpus={gpus}", timeout=120)
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "hydra.launcher.gpus" in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.rglob(results.RESULT_FILE))


GPU_SWEEP = ["-m", "page_size=16,64", "top_k=64,128", "device=cuda", "model=tiny",
             "context_len=512", "steps=3", "timing.warmup_steps=1", "num_layers=1",
             "batch_size=4", "backend=flashmla_sparse,hisparse", "report=false"]
GPU_SAME = SAME + ["hits", "misses", "tokens_loaded", "bytes_h2d"]


@pytest.mark.gpu
def test_local_gpus_on_the_gpus_gives_the_sequential_rows(tmp_path):
    """On a GPU machine: every visible GPU a slot; the rows equal the sequential launcher's
    (decisions, counts, config hash), each point on a slot, pinned to that slot's GPU when
    there are several; more slots than GPUs exits 2 before any point. Needs the launchers
    extra (the GPU machine has it only where its wheels were carried)."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher",
                        reason="hydra/launcher=local_gpus needs pip install -e '.[launchers]'")
    import torch
    n = torch.cuda.device_count()
    seq = harness(*GPU_SWEEP, f"hydra.sweep.dir={tmp_path / 'seq'}", timeout=600)
    assert seq.returncode == 0, seq.stderr[-3000:]
    par = harness(*GPU_SWEEP, f"hydra.sweep.dir={tmp_path / 'par'}", "hydra/launcher=local_gpus",
                  timeout=600)
    assert par.returncode == 0, par.stderr[-3000:]
    a, b = rows(tmp_path / "seq"), rows(tmp_path / "par")
    a = a.set_index("backend", append=True).sort_index()
    b = b.set_index("backend", append=True).sort_index()
    assert len(a) == 8 and list(a.index) == list(b.index)
    assert set(a["status"]) == {"ok"}
    pd.testing.assert_frame_equal(a[GPU_SAME], b[GPU_SAME])
    assert f"over {n} slot(s)" in par.stdout
    assert set(b["gpu_slot"]) <= set(range(n)) and b["gpu_slot"].notna().all()
    if n > 1:   # workers pinned: each row saw only its slot's GPU
        visible = launchers.visible_gpus()
        for slot, dev in zip(b["gpu_slot"], b["cuda_visible_devices"]):
            assert dev == visible[int(slot)]
    too_many = harness(*GPU_SWEEP, f"hydra.sweep.dir={tmp_path / 'bad'}",
                       "hydra/launcher=local_gpus", f"hydra.launcher.gpus={n + 1}", timeout=300)
    assert too_many.returncode == 2 and "hydra.launcher.gpus" in too_many.stderr
    assert not list((tmp_path / "bad").rglob(results.RESULT_FILE))


def test_plan_slots():
    d = Path("/sweep")
    assert plan_slots(None, d, None) == SlotPlan(1, None, d / ".gpu_slots")
    assert plan_slots(3, d, None).slots == 3                         # simulated: as many as asked
    assert plan_slots(None, d, ["2", "3"]).devices == ("2", "3")     # every visible GPU, in order
    assert plan_slots(1, d, ["GPU-a", "GPU-b"]).devices == ("GPU-a",)
    for bad in (0, -2, True, "2", 1.5):
        with pytest.raises(ConfigError, match="hydra.launcher.gpus"):
            plan_slots(bad, d, ["0"])
    with pytest.raises(ConfigError, match="at most the 2 visible GPU.*never .*share"):
        plan_slots(3, d, ["0", "1"])
    with pytest.raises(ConfigError, match="no GPU is visible"):
        plan_slots(None, d, [])


def _hold(plan, pin, out, release):
    """Child process: takes a slot, reports (pid, slot, CUDA_VISIBLE_DEVICES), holds it until
    ``release`` is set, then exits (which frees the slot)."""
    slot = take_slot(plan, pin=pin)
    out.put((os.getpid(), slot, os.environ.get("CUDA_VISIBLE_DEVICES")))
    release.wait(60)


def test_slots_are_exclusive_pin_their_gpu_and_free_when_a_worker_ends(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ctx = mp.get_context("fork")
    plan = SlotPlan(2, ("5", "7"), tmp_path / ".gpu_slots")
    out, release = ctx.Queue(), [ctx.Event() for _ in range(3)]
    procs = [ctx.Process(target=_hold, args=(plan, True, out, release[i])) for i in range(3)]
    try:
        for p in procs[:2]:
            p.start()
        held = {pid: (slot, dev) for pid, slot, dev in (out.get(timeout=60) for _ in range(2))}
        assert sorted(held.values()) == [(0, "5"), (1, "7")]      # one slot each, pinned to its GPU
        procs[2].start()
        with pytest.raises(Exception):                            # both held: the third waits
            out.get(timeout=1.5)
        release[0].set()
        procs[0].join(30)
        pid, slot, dev = out.get(timeout=30)                       # ... until the first one ends
        assert pid == procs[2].pid and (slot, dev) == held[procs[0].pid]
    finally:
        for e in release:
            e.set()
        for p in procs:
            if p.pid is not None:
                p.join(30)


def test_a_pinned_worker_keeps_its_gpu(tmp_path, monkeypatch):
    """A worker pinned to GPU 7 (an earlier sweep of the same process) takes GPU 7's slot, even
    with slot 0 free, and refuses a sweep without GPU 7."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.setattr(launchers, "_PINNED", "7")
    monkeypatch.setattr(launchers, "_HELD", {})
    try:
        assert take_slot(SlotPlan(2, ("5", "7"), tmp_path / "a")) == 1
        assert launchers.gpu_slot() == 1 and os.environ["CUDA_VISIBLE_DEVICES"] == "7"
        assert take_slot(SlotPlan(2, ("5", "7"), tmp_path / "a")) == 1   # held: kept
        with pytest.raises(RuntimeError, match="pinned to GPU 7.*not among"):
            take_slot(SlotPlan(1, ("5",), tmp_path / "b"))
    finally:
        for _, fd in launchers._HELD.values():
            os.close(fd)


def test_slurm_submits_one_array_job_with_the_configured_resources(tmp_path):
    """The real path (Hydra -> hydra-submitit-launcher -> submitit -> sbatch) with ``sbatch`` and
    ``srun`` replaced by recorders: the job array's script carries the GPUs, time, partition and
    array parallelism of the command line, and its jobs write into the sweep directory."""
    bin_dir, record = tmp_path / "bin", tmp_path / "job.sbatch"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {record}\necho "Submitted batch job 4242"\n')
    (bin_dir / "srun").write_text('#!/bin/sh\nexec "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    sweep = tmp_path / "sweep"
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *SWEEP, "report=false", f"hydra.sweep.dir={sweep}",
         "hydra/launcher=slurm", "hydra.launcher.partition=h200", "hydra.launcher.timeout_min=30",
         "hydra.launcher.array_parallelism=2", "hydra.launcher.gpus_per_node=1"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not record.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert record.exists(), err[-3000:]
    script = record.read_text().splitlines()
    for line in ("#SBATCH --array=0-3%2", "#SBATCH --gpus-per-node=1", "#SBATCH --time=30",
                 "#SBATCH --partition=h200", "#SBATCH --ntasks-per-node=1"):
        assert line in script, "\n".join(script)
    assert any(ln.startswith("srun ") and f"{sweep}/.submitit/" in ln for ln in script)
