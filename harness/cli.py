"""``python -m harness``: the Hydra app. One configuration point per job; ``-m`` or
``+sweep=NAME`` for sweeps. See README.md.

``main()`` checks the command line before Hydra runs anything (``harness.command_line``: a
typo, unknown key or wrongly typed value exits 2 naming the key), gives a sweep its stable
directory, runs Hydra, and exits with the run's code:

* 0: every point ran and no row is ``error`` or ``incorrect`` (``invalid``, ``oom`` and
  ``unavailable`` are outcomes of a grid);
* 1: some row is ``error`` or ``incorrect``, or a point of a sweep has no result (after
  everything that ran is written, summarised and reported);
* 2: bad input caught before any work (nothing ran).

Inside a sweep nothing a point does stops the sweep: a point invalid for all its backends, or
only jointly (``top_k`` above ``hisparse.device_buffer_size``), gives ``status=invalid`` rows; an
unexpected exception gives ``status=error`` rows with the message. A single run with bad
input exits 2 before any kernel.
"""
from __future__ import annotations

import hashlib
import logging
import sys
import traceback
from pathlib import Path
from typing import Dict, List, Mapping, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.callbacks import ExitCode
from harness.config import CONF_DIR, backend_settings, load_model_preset, register_configs
from harness.keys import help_text
from harness.sweep_outcome import FAILING
from harness.validate import ConfigError, backends_of, validate_point

log = logging.getLogger("harness")
register_configs()
OmegaConf.register_new_resolver("harness_help", help_text, replace=True)  # conf/config.yaml: hydra.help


def resolve_model(cfg: DictConfig, device_type: str) -> None:
    """``model=auto`` -> dsv32 on the GPU, tiny on the CPU (said in the log)."""
    if cfg.model.name != "auto":
        return
    name = "dsv32" if device_type == "cuda" else "tiny"
    with open_dict(cfg):
        cfg.model = OmegaConf.merge(cfg.model, load_model_preset(name))
    log.info("device=%s -> model=%s%s", device_type, name,
             " (Triton interpreter, TRITON_INTERPRET=1; CPU timings are not performance figures)"
             if device_type == "cpu" else "")


def repro_command() -> str:
    hc = HydraConfig.get()
    args = list(hc.overrides.task)
    if hc.mode is not None and str(hc.mode).endswith("MULTIRUN") and any("sweep=" in a for a in args):
        args.append("hydra.mode=RUN")
    return " ".join(["python -m harness", *args])


def config_hash(cfg: DictConfig) -> str:
    blob = OmegaConf.to_yaml(cfg, resolve=True, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _get(cfg: DictConfig, key: str):
    """``cfg``'s value at dotted ``key``, None when it is missing or does not resolve."""
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=False, throw_on_resolution_failure=False)
    except Exception:  # a value that cannot even be selected: the row records it as null
        return None


def failed_point_rows(cfg: DictConfig, status: str, message: str, repro: str,
                      cfg_hash: Optional[str]) -> List[Dict]:
    """One row per backend of a point that did not run (``status``, ``message``), with the
    point's parameters and the backend's settings, as far as the config holds them."""
    from harness import env, results
    keys = ("attention_kernel", "kv_dtype", "page_size", "top_k", "batch_size", "context_len",
            "pattern", "step_overlap", "scenario", "steps", "num_layers", "seed", "device")
    base: Dict[str, object] = {k: _get(cfg, k) for k in keys}
    base.update({"schema_version": results.SCHEMA_VERSION, "model": _get(cfg, "model.name"),
                 "selection": _get(cfg, "selection.source"), "phase": _get(cfg, "phase"),
                 "warmup_steps": _get(cfg, "timing.warmup_steps"), "cold_l2": _get(cfg, "timing.cold_l2"),
                 "cold_host_translations": _get(cfg, "timing.cold_host_translations"),
                 "cuda_graph": _get(cfg, "timing.cuda_graph"), "tolerance": _get(cfg, "timing.check_tolerance"),
                 "repro_command": repro, "config_hash": cfg_hash, "timestamp": env.timestamp(),
                 "status": status, "error": message})
    base.update(env.provenance(str(base["device"])))
    try:
        names = backends_of(cfg)
    except Exception:  # an unknown backend: the row names what was asked for
        names = [str(_get(cfg, "backend"))]
    rows = []
    for name in names:
        try:
            cls, settings = backend_settings(cfg, name)
            cols = cls.settings_columns(settings)
        except Exception:  # settings that cannot even be built: the message says why
            cols = {}
        rows.append({**base, **cols, "backend": name})
    return rows


def _finished(job_dir: Path, cfg_hash: str) -> bool:
    """Whether ``job_dir`` already holds this point's rows, none of them ``error`` (an
    unreadable result file counts as absent: the point is redone)."""
    from harness import results
    path = job_dir / results.RESULT_FILE
    if not path.exists():
        return False
    prev = results.read_result(path)
    if prev is None:
        log.warning("%s cannot be read (truncated or damaged): redoing the point", path)
        return False
    return ("config_hash" in prev and bool((prev["config_hash"] == cfg_hash).all())
            and not (prev["status"] == "error").any())


def _code(rows: List[Mapping]) -> int:
    return 1 if any(r.get("status") in FAILING for r in rows) else 0


def run_job(cfg: DictConfig, job_dir: Path, repro: str, in_sweep: bool) -> int:
    """Validates, runs and records one point into ``job_dir``; returns 0, 1 (a row is error or
    incorrect) or, for a single run only, 2 (bad input; the message is printed, nothing runs).
    In a sweep (``in_sweep``) bad input becomes ``invalid`` rows and any exception ``error``
    rows. The point runs under its lock (``harness.point_lock``): a point another process is
    running is skipped."""
    from harness import results
    from harness.device import resolve_device
    from harness.point_lock import LOCK_FILE, point_lock
    invalid: Optional[ConfigError] = None
    backend_errors: Dict[str, ConfigError] = {}
    device = None
    try:
        device = resolve_device(cfg.device)
        with open_dict(cfg):
            cfg.device = device.type
        resolve_model(cfg, device.type)
        backend_errors = validate_point(cfg)
        if backend_errors and not in_sweep:
            raise next(iter(backend_errors.values()))
    except ConfigError as e:
        if not in_sweep:
            print(f"error: {e}", file=sys.stderr)
            return 2
        invalid = e
    h = config_hash(cfg) if invalid is None else None
    with point_lock(job_dir) as held:
        if not held:
            log.info("skip: %s is being run by another process (it holds %s)", job_dir, LOCK_FILE)
            return 0
        if h is not None and not cfg.overwrite and _finished(job_dir, h):
            log.info("skip: %s already holds this point (overwrite=true to re-run)", job_dir / results.RESULT_FILE)
            return 0
        names = backends_of(cfg) if invalid is None else []
        if invalid is None and len(backend_errors) == len(names):
            invalid = next(iter(backend_errors.values()))
        if invalid is not None:
            rows = failed_point_rows(cfg, "invalid", str(invalid), repro, h)
            results.write_results(job_dir, rows)
            log.info("invalid: %s", invalid)
            return 0
        from harness.runner import run_point
        try:
            rows = run_point(cfg, device, job_dir, repro, h, invalid={n: str(e) for n, e in backend_errors.items()})
        except ConfigError as e:  # found while building the workload (a trace that disagrees, ...)
            if not in_sweep:
                print(f"error: {e}", file=sys.stderr)
                return 2
            rows = failed_point_rows(cfg, "invalid", str(e), repro, h)
            results.write_results(job_dir, rows)
            log.info("invalid: %s", e)
            return 0
        except Exception as e:  # recorded as a row, and a sweep goes on
            log.error("the point failed:\n%s", traceback.format_exc())
            rows = failed_point_rows(cfg, "error", f"{type(e).__name__}: {e}", repro, h)
            results.write_results(job_dir, rows)
    log.info("wrote %s (%d rows)", job_dir / results.RESULT_FILE, len(rows))
    return _code(rows)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def app(cfg: DictConfig) -> None:
    """One Hydra job: one point (a single run's exit code is set for ``main``)."""
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    job_dir = Path(HydraConfig.get().runtime.output_dir)
    if not in_sweep:
        code = run_job(cfg, job_dir, repro_command(), in_sweep=False)
        if code == 2:
            sys.exit(2)
        ExitCode.raise_to(code)
        return
    try:
        run_job(cfg, job_dir, repro_command(), in_sweep=True)
    except Exception:  # even writing its rows failed: the sweep's summary reports the point missing
        log.error("point %s left no result:\n%s", job_dir, traceback.format_exc())


def main() -> None:
    """``python -m harness``: checks the command line, runs Hydra, exits with the run's code."""
    from harness.command_line import check_command_line, with_sweep_dir
    argv = sys.argv[1:]
    try:
        check_command_line(argv)
        argv = with_sweep_dir(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [sys.argv[0], *argv]
    ExitCode.value = 0
    app()
    sys.exit(ExitCode.value)
