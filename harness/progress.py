"""Progress of a sweep (point i of N, the point's swept values, elapsed and time left) and of the
steps of each backend run of a point.

In a terminal (stderr is a TTY and ``CI`` is not set) one rich progress display shows the sweep's
bar and, under it, a bar per running backend's steps; log lines print above it. Elsewhere (piped,
CI, or a job that a parallel launcher runs in another process) the same facts are plain log lines
(no escape sequences, no carriage returns): one when a point starts, one when it ends (with the
time left), and for a long run of steps one line at most every ``PLAIN_STEP_INTERVAL_S`` seconds.

* ``SweepProgress``: a Hydra callback (``hydra.callbacks.progress`` in ``conf/config.yaml``).
  N is the number of jobs of Hydra's basic sweeper (the sweeper's ``params`` times the
  command line's sweep overrides); with another sweeper the points are counted as they come.
  With the sequential launcher every job runs in the process that started the sweep and shares
  its bar; a job running in another process (joblib, submitit) prints lines naming its point
  ``hydra.job.num + 1`` of N.
* ``steps(total, backend, run)``: what ``harness.runner.run_backend`` iterates its steps over.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("harness")

#: plain mode: the least time (s) between two step lines of one backend run
PLAIN_STEP_INTERVAL_S = 10.0
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def interactive(stream=None) -> bool:
    """Whether progress may redraw a bar: ``stream`` (default stderr) is a terminal and the
    environment is not CI (``CI`` unset, empty, ``0``, ``false`` or ``no``)."""
    stream = sys.stderr if stream is None else stream
    ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not ci


def duration(seconds: float) -> str:
    """``12.3 s``, ``4 min 05 s`` or ``2 h 03 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(round(seconds)), 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def sweep_shape(config: DictConfig) -> Tuple[Optional[int], List[str]]:
    """``(number of jobs, swept keys)`` of a multirun's config as Hydra's basic sweeper expands
    it (preset ``hydra.sweeper.params`` first, then the command line); ``(None, keys or [])``
    when another sweeper runs it or the overrides cannot be expanded here."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    sweeper = config.hydra.sweeper
    params = sweeper.get("params") or {}
    args = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except Exception:  # noqa: BLE001  (e.g. a glob sweep, which needs the config loader)
        return None, []
    keys = [ov.get_key_element() for ov in overrides if ov.is_sweep_override()]
    if sweeper.get("_target_") != BASIC_SWEEPER:
        return None, keys
    try:
        return len(BasicSweeper.split_arguments(overrides, None)[0]), keys
    except Exception:  # noqa: BLE001  (a sweep type the basic sweeper refuses: Hydra says so)
        return None, keys


def time_left(elapsed_s: float, done: int, total: Optional[int]) -> str:
    """``about 1 min 05 s left`` from the mean time per finished item; "" when unknown."""
    if total is None or done <= 0 or done >= total:
        return ""
    return f"about {duration(elapsed_s / done * (total - done))} left"


def point_label(task_overrides: Sequence[str], swept: Sequence[str]) -> str:
    """The swept ``key=value`` pairs of one job's overrides (all of them when none is swept)."""
    ovs = [str(o) for o in task_overrides]
    picked = [o for o in ovs if o.split("=", 1)[0] in set(swept)]
    return " ".join(picked or ovs)


class _Display:
    """This process's progress display: the live rich Progress of a sweep, or plain lines."""

    def __init__(self):
        self.live = None           # rich.progress.Progress while a sweep's bar is shown
        self.plain: Optional[bool] = None  # forced by a sweep; None: decide by the terminal

    def is_plain(self) -> bool:
        return self.plain if self.plain is not None else not interactive()

    def start_live(self):
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)
        # time left: from the mean time per finished item since the task began (every task
        # carries it as its ``left`` field), not rich's windowed speed estimate
        # markup=False: swept values such as capacity.batch_sizes=[8,32] are text, not markup
        self.live = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                             MofNCompleteColumn(), TimeElapsedColumn(),
                             TextColumn("{task.fields[left]}", markup=False), console=Console(stderr=True))
        self.live.start()
        self.route_logging()
        return self.live

    def route_logging(self) -> None:
        """Log handlers writing to the real stdout/stderr write through the live display's
        proxies instead (so log lines print above the bars; Hydra re-creates its handlers for
        every job)."""
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                for proxy in (sys.stdout, sys.stderr):
                    if h.stream is getattr(proxy, "rich_proxied_file", None):
                        h.setStream(proxy)

    def stop_live(self) -> None:
        if self.live is None:
            return
        self.live.stop()
        self.live = None
        for h in logging.getLogger().handlers:
            real = getattr(getattr(h, "stream", None), "rich_proxied_file", None)
            if isinstance(h, logging.StreamHandler) and real is not None:
                h.setStream(real)


DISPLAY = _Display()


class SweepProgress(Callback):
    """Hydra callback: a bar over the points of a multirun, or plain lines (module docstring)."""

    def __init__(self):
        self.total: Optional[int] = None
        self.swept: List[str] = []
        self.pid: Optional[int] = None
        self.t0 = 0.0
        self.done = 0
        self.task = None
        self.job_t0 = 0.0
        self.label = ""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.total, self.swept = sweep_shape(config)
        self.pid, self.t0, self.done = os.getpid(), time.monotonic(), 0
        if self.total is not None and DISPLAY.is_plain():
            log.info("sweep: %d points into %s", self.total, config.hydra.sweep.dir)

    def _of(self, i: int) -> str:
        return f"{i}/{self.total}" if self.total is not None else f"{i}"

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        if self.pid is None:  # a single run: only the steps show progress
            return
        self.label = point_label(config.hydra.overrides.task, self.swept)
        self.job_t0 = time.monotonic()
        i = int(config.hydra.job.get("num", self.done)) + 1
        if os.getpid() != self.pid:  # a parallel launcher's worker: lines, no shared count
            DISPLAY.plain = True
            log.info("point %s: %s", self._of(i), self.label)
            return
        if DISPLAY.is_plain():
            DISPLAY.plain = True
            log.info("point %s: %s", self._of(i), self.label)
            return
        live = DISPLAY.live or DISPLAY.start_live()
        DISPLAY.route_logging()
        if self.task is None:
            self.task = live.add_task(f"point {self.label}", total=self.total, completed=self.done, left="")
        live.update(self.task, description=f"point {self.label}")
        live.refresh()

    def on_job_end(self, config: DictConfig, job_return=None, **kwargs) -> None:
        if self.pid is None:
            return
        self.done += 1
        failed = job_return is not None and job_return.status == JobStatus.FAILED
        took = duration(time.monotonic() - self.job_t0)
        if os.getpid() != self.pid:
            i = int(config.hydra.job.get("num", 0)) + 1
            log.info("point %s %s in %s: %s", self._of(i), "failed" if failed else "done", took, self.label)
            return
        elapsed = time.monotonic() - self.t0
        left = time_left(elapsed, self.done, self.total)
        if DISPLAY.live is not None and self.task is not None:
            DISPLAY.live.update(self.task, completed=self.done, left=left)
            if failed:
                DISPLAY.live.console.print(f"point {self.label} failed after {took}", markup=False)
            DISPLAY.live.refresh()
            return
        log.info("point %s %s in %s: %s (elapsed %s%s)", self._of(self.done), "failed" if failed else "done",
                 took, self.label, duration(elapsed), f", {left}" if left else "")

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if self.pid is None or os.getpid() != self.pid:
            return
        DISPLAY.stop_live()
        DISPLAY.plain = None
        self.task = None
        took = duration(time.monotonic() - self.t0)
        if self.done == 0 and self.total:
            log.info("sweep: %d points, run by the launcher's workers, in %s", self.total, took)
        else:
            log.info("sweep: %d points in %s", self.done, took)


def steps(total: int, backend: str, run: Optional[Dict] = None) -> Iterator[int]:
    """Yields the step indices ``0 .. total - 1`` of one backend run, showing them as a bar
    (under the sweep's bar, or on its own in a terminal) or as plain lines (module docstring).
    ``run``: the run's row columns (``scenario=capacity`` names its ``batch_size``)."""
    label = backend if not (run and "batch_size" in run) else f"{backend} batch {run['batch_size']}"
    if DISPLAY.is_plain():
        t0 = last = time.monotonic()
        for s in range(total):
            yield s
            now = time.monotonic()
            if now - last >= PLAIN_STEP_INTERVAL_S and s + 1 < total:
                log.info("%s: step %d/%d, elapsed %s, %s", label, s + 1, total, duration(now - t0),
                         time_left(now - t0, s + 1, total))
                last = now
        return
    own = DISPLAY.live is None
    live = DISPLAY.start_live() if own else DISPLAY.live
    task = live.add_task(f"  {label}: step", total=total, left="")
    live.refresh()
    t0 = time.monotonic()
    try:
        for s in range(total):
            yield s
            live.update(task, completed=s + 1, left=time_left(time.monotonic() - t0, s + 1, total))
    finally:
        live.remove_task(task)
        live.refresh()
        if own:
            DISPLAY.stop_live()
