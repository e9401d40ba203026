"""Hydra callbacks: reject a sweep with an invalid value before any job runs and link
``latest`` to its directory; when a run or sweep ends, summarise the sweep's rows, write the
report from what exists and decide the exit code (``ExitCode``, read by ``harness.cli.main``)."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from harness.validate import CHECKED_FIELDS, ConfigError, check_value

log = logging.getLogger("harness")
LATEST = "latest"


class ExitCode:
    """The exit code ``python -m harness`` ends with: set by a single run's job, or from the
    rows when a sweep ends (``harness.sweep_outcome``); the highest code set wins."""

    value = 0

    @classmethod
    def raise_to(cls, code: int) -> None:
        cls.value = max(cls.value, code)


def check_sweep_values(overrides) -> None:
    """Checks every value of every swept axis (``page_size=16,48``) on its own."""
    parser = OverridesParser.create()
    for ov in parser.parse_overrides(list(overrides)):
        key = ov.key_or_group
        if key not in CHECKED_FIELDS:
            continue
        values = list(ov.sweep_iterator()) if ov.is_sweep_override() else [ov.value()]
        for v in values:
            check_value(key, v)


def link_latest(sweep_dir: Path) -> None:
    """Points ``<parent of sweep_dir>/latest`` at ``sweep_dir`` (a relative symlink, replaced
    atomically); a ``latest`` that is not a symlink is left alone."""
    link = sweep_dir.parent / LATEST
    if sweep_dir.name == LATEST:
        return
    if link.exists() and not link.is_symlink():
        log.warning("%s is not a symlink: left as it is", link)
        return
    sweep_dir.mkdir(parents=True, exist_ok=True)
    tmp = sweep_dir.parent / f".{LATEST}.{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(sweep_dir.name, tmp)
    os.replace(tmp, link)


class ReportCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        params = config.hydra.sweeper.get("params") or {}
        overrides = list(config.hydra.overrides.task) + [f"{k}={v}" for k, v in params.items()]
        try:
            check_sweep_values(overrides)
        except ConfigError as e:
            print(f"error: {e} (sweep rejected before any job ran)", file=sys.stderr)
            sys.exit(2)
        link_latest(Path(config.hydra.sweep.dir).absolute())

    def _report(self, config: DictConfig, out_dir: str) -> None:
        if not config.get("report", True):
            return
        try:
            from harness.report import write_report
            path = write_report(Path(out_dir))
            log.info("report: %s", path)
        except Exception as e:  # a failed report must not lose the recorded results
            log.error("report failed: %s: %s", type(e).__name__, e)

    def on_run_end(self, config: DictConfig, **kwargs) -> None:
        self._report(config, config.hydra.runtime.output_dir)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from harness.sweep_outcome import sweep_outcome
        outcome = sweep_outcome(config.hydra.sweep.dir)
        print("\n".join(outcome.lines()), flush=True)
        self._report(config, config.hydra.sweep.dir)
        ExitCode.raise_to(outcome.exit_code)
        if outcome.exit_code:
            print(f"exit code {outcome.exit_code}: some point is error or incorrect, or has no result",
                  file=sys.stderr)
