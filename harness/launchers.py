"""Sweep launchers on existing engines: ``hydra/launcher=local_gpus`` runs the points of a sweep on
every GPU of this host at once, one point per GPU at a time; ``hydra/launcher=slurm`` (hydra-
submitit-launcher, ``conf/hydra/launcher/slurm.yaml``) submits one Slurm job per point. The default
stays Hydra's sequential launcher. Both plugins come with ``pip install -e '.[launchers]'``.

local_gpus
----------
Hydra's joblib launcher (hydra-joblib-launcher: a pool of loky worker processes) runs the
points, with one worker per *GPU slot* and one point handed out at a time (``batch_size=1``), so
a worker that finishes takes the next point. Hydra only loads launchers from the
``hydra_plugins`` package: ``hydra_plugins/dsa_harness_launchers.py`` holds the launcher class,
this module the work.

* **Slots** are fixed once, in the sweep's own process, before any point runs
  (``plan_slots``): slot ``i`` is the ``i``-th GPU that process sees (``CUDA_VISIBLE_DEVICES``
  respected, so ``CUDA_VISIBLE_DEVICES=2,3`` gives slots 0 -> GPU 2 and 1 -> GPU 3). Their
  number is ``hydra.launcher.gpus`` (default: every visible GPU); more slots than visible GPUs
  is rejected (exit 2), since two timed points must never share a GPU.
* **Pinning** (``take_slot``): a worker's first point takes the lowest free slot, an exclusive
  ``flock`` on ``<sweep dir>/.gpu_slots/slot-<i>.lock``, and sets ``CUDA_VISIBLE_DEVICES`` to
  that slot's GPU alone before CUDA is initialised in the worker (a worker where it already is
  stops with an error instead of running on the wrong GPU). The worker keeps the lock and the
  GPU for every later point it runs; the OS releases the lock when the process ends, however it
  ends. So ``N`` workers over ``N`` slots never share one, and a second sweep launched into the
  same directory waits for a free slot instead of doubling up on a GPU.
* **Simulated slots**: without CUDA, or with ``device=cpu``, the slots are not GPUs: ``gpus``
  of them (default 1) are locked the same way and ``CUDA_VISIBLE_DEVICES`` is left alone. This is
  how the launcher is tested on the CPU.
* With one slot joblib runs the points in the sweep's own process (no worker); that process's
  first GPU is slot 0's GPU, so nothing needs pinning.

Every point writes into its own job directory of the one sweep directory, as with the
sequential launcher, and the sweep's callbacks (the report, the summary) run once, in the
sweep's process, after the last point. A row records the slot its point ran on (``gpu_slot``:
``None`` under the other launchers) and the ``CUDA_VISIBLE_DEVICES`` it saw.
"""
from __future__ import annotations

import fcntl
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from backends.base import ConfigError

log = logging.getLogger("harness")

#: folder of the slot locks inside the sweep directory (hidden: result loaders skip it)
SLOT_DIR = ".gpu_slots"
#: seconds between attempts while every slot is held
POLL_S = 0.2
EXTRA_HINT = "pip install -e '.[launchers]'"


@dataclass(frozen=True)
class SlotPlan:
    """The GPU slots of one sweep.

    ``slots``: how many; ``devices``: the ``CUDA_VISIBLE_DEVICES`` entry of each slot's GPU
    (index or UUID, as the sweep's process saw them), ``None`` for simulated slots; ``lock_dir``:
    where the slot locks live.
    """

    slots: int
    devices: Optional[Tuple[str, ...]]
    lock_dir: Path


def visible_gpus() -> List[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries of the GPUs this process sees, in CUDA's order
    (``["0", "1", ...]`` when the variable is unset); ``[]`` without CUDA."""
    import torch
    if not torch.cuda.is_available():
        return []
    n = torch.cuda.device_count()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return [str(i) for i in range(n)]
    return [e.strip() for e in env.split(",") if e.strip()][:n]


def plan_slots(gpus: object, sweep_dir: Path, devices: Optional[Sequence[str]]) -> SlotPlan:
    """The slots of a sweep: ``gpus`` (``hydra.launcher.gpus``: ``None`` or an int >= 1) over
    ``devices`` (the visible GPUs, ``None`` when the points run on the CPU). ConfigError naming
    ``hydra.launcher.gpus`` for a bad value or more slots than GPUs."""
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise ConfigError("hydra.launcher.gpus", gpus,
                          "an integer >= 1, or null for every visible GPU")
    lock_dir = Path(sweep_dir) / SLOT_DIR
    if devices is None:
        return SlotPlan(gpus or 1, None, lock_dir)
    if not devices:
        raise ConfigError("hydra.launcher.gpus", gpus, "no GPU is visible; use device=cpu for "
                          "simulated slots")
    n = len(devices) if gpus is None else gpus
    if n > len(devices):
        raise ConfigError("hydra.launcher.gpus", gpus,
                          f"at most the {len(devices)} visible GPU(s) "
                          f"(CUDA_VISIBLE_DEVICES={','.join(devices)}): two timed points never "
                          "share a GPU")
    return SlotPlan(n, tuple(devices[:n]), lock_dir)


# ------------------------------------------------------------------ in each worker process

#: lock directory -> (slot, open file descriptor holding its flock), for this process
_HELD: Dict[str, Tuple[int, int]] = {}
#: the GPU this process pinned itself to (a CUDA_VISIBLE_DEVICES entry), once it has
_PINNED: Optional[str] = None
#: the slot of the sweep this process is running a point of
_CURRENT: Optional[int] = None


def gpu_slot() -> Optional[int]:
    """The GPU slot this process runs its points on; ``None`` outside ``local_gpus``."""
    return _CURRENT


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def _try_lock(path: Path) -> Optional[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _pin(device: str) -> None:
    """Makes ``device`` the only GPU of this process (before CUDA is initialised in it)."""
    global _PINNED
    if _PINNED == device:
        return
    if _PINNED is not None or _cuda_initialised():
        raise RuntimeError(
            f"local_gpus: this worker already uses "
            f"{'GPU ' + _PINNED if _PINNED else 'CUDA'} and cannot move to GPU {device} "
            "(CUDA_VISIBLE_DEVICES is read when CUDA is initialised)")
    os.environ["CUDA_VISIBLE_DEVICES"] = device
    _PINNED = device


def take_slot(plan: SlotPlan, pin: bool = True) -> int:
    """Takes a slot of ``plan`` for this process (blocking while every slot is held) and, for GPU
    slots with ``pin``, pins the process to the slot's GPU. A process that already holds a slot
    of this plan keeps it; one already pinned to a GPU takes that GPU's slot. Returns the slot."""
    global _CURRENT
    key = str(plan.lock_dir)
    if key in _HELD:
        _CURRENT = _HELD[key][0]
        return _CURRENT
    candidates = list(range(plan.slots))
    if _PINNED is not None and plan.devices is not None:
        if _PINNED not in plan.devices:
            raise RuntimeError(f"local_gpus: this worker is pinned to GPU {_PINNED}, which is "
                               f"not among this sweep's GPUs {list(plan.devices)}")
        candidates = [plan.devices.index(_PINNED)]
    plan.lock_dir.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        for i in candidates:
            fd = _try_lock(plan.lock_dir / f"slot-{i}.lock")
            if fd is None:
                continue
            _HELD[key] = (i, fd)
            if plan.devices is not None and pin:
                _pin(plan.devices[i])
            _CURRENT = i
            where = f"GPU {plan.devices[i]}" if plan.devices is not None else "a simulated slot"
            log.info("local_gpus: process %d took slot %d (%s)", os.getpid(), i, where)
            return i
        if not waited:
            log.info("local_gpus: every slot of %s is held; waiting for one", plan.lock_dir)
            waited = True
        time.sleep(POLL_S)


class PinnedTask:
    """The sweep's task function behind a slot: takes (or keeps) this process's slot, then runs
    the point. Picklable, so joblib's workers receive it."""

    def __init__(self, task: Callable[[Any], Any], plan: SlotPlan):
        self.task, self.plan = task, plan
        self.sweep_pid = os.getpid()

    def __call__(self, cfg: Any) -> Any:
        # in the sweep's own process (one slot: joblib runs the points inline) CUDA may already be
        # initialised; its first GPU is slot 0's, so only the lock is taken
        take_slot(self.plan, pin=os.getpid() != self.sweep_pid)
        return self.task(cfg)


def launch_local_gpus(launcher: Any, job_overrides: Sequence[Sequence[str]],
                      initial_job_idx: int) -> Sequence[Any]:
    """``LocalGpusLauncher.launch``: plans the slots (exit 2 for a bad ``gpus``) and runs the
    points through Hydra's joblib launcher, one worker per slot. Returns Hydra's JobReturns."""
    try:
        from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
    except ImportError:
        print(f"error: hydra/launcher=local_gpus needs hydra-joblib-launcher: {EXTRA_HINT}",
              file=sys.stderr)
        sys.exit(2)
    import torch
    cfg = launcher.config
    on_gpu = str(cfg.get("device", "auto")) != "cpu" and torch.cuda.is_available()
    try:
        plan = plan_slots(launcher.gpus, Path(str(cfg.hydra.sweep.dir)),
                          visible_gpus() if on_gpu else None)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    log.info("local_gpus: %d point(s) over %d slot(s): %s", len(job_overrides), plan.slots,
             ", ".join(f"{i} -> GPU {d}" for i, d in enumerate(plan.devices))
             if plan.devices is not None else "simulated (the points run on the CPU)")
    pool = JoblibLauncher(n_jobs=plan.slots, batch_size=1)
    pool.setup(hydra_context=launcher.hydra_context,
               task_function=PinnedTask(launcher.task_function, plan), config=cfg)
    return pool.launch(job_overrides, initial_job_idx)
