"""``python -m harness``: the Hydra app. One configuration point per job; ``-m`` or
``+sweep=NAME`` for sweeps. See README.md."""
from __future__ import annotations

import hashlib
import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.config import CONF_DIR, load_model_preset, register_configs
from harness.validate import ConfigError, validate

log = logging.getLogger("harness")
register_configs()


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


def run_job(cfg: DictConfig, job_dir: Path) -> int:
    """Validates, runs and records one point. Returns a process exit code."""
    from harness.device import resolve_device
    from harness import results
    try:
        device = resolve_device(cfg.device)
        with open_dict(cfg):
            cfg.device = device.type
        resolve_model(cfg, device.type)
        validate(cfg)
        h = config_hash(cfg)
        done = job_dir / results.RESULT_FILE
        if done.exists() and not cfg.overwrite:
            import pandas as pd
            prev = pd.read_parquet(done)
            if "config_hash" in prev and (prev["config_hash"] == h).all() and not (prev["status"] == "error").any():
                log.info("skip: %s already holds this point (overwrite=true to re-run)", done)
                return 0
        from harness.runner import run_point
        rows = run_point(cfg, device, job_dir, repro_command(), h)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    log.info("wrote %s (%d rows)", job_dir / results.RESULT_FILE, len(rows))
    return 0


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    code = run_job(cfg, Path(HydraConfig.get().runtime.output_dir))
    if code:
        sys.exit(code)
