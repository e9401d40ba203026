"""Hydra callbacks: reject a sweep with an invalid value before any job runs, and write the
report when a run or sweep ends."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from harness.validate import CHECKED_FIELDS, ConfigError, check_value

log = logging.getLogger("harness")


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


class ReportCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        params = config.hydra.sweeper.get("params") or {}
        overrides = list(config.hydra.overrides.task) + [f"{k}={v}" for k, v in params.items()]
        try:
            check_sweep_values(overrides)
        except ConfigError as e:
            print(f"error: {e} (sweep rejected before any job ran)", file=sys.stderr)
            sys.exit(2)

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
        self._report(config, config.hydra.sweep.dir)
