"""Runs ``python -m harness`` in a subprocess from the repository root (shared by the tests)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_harness(*args, check: bool = True, module: str = "harness") -> subprocess.CompletedProcess:
    """The finished process; with ``check`` its exit code must be 0 (stderr shown otherwise)."""
    r = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def compose(*overrides):
    """The composed run config of ``overrides`` (in this process, without running anything)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    import harness.cli  # noqa: F401  (registers the structured configs)
    from harness.config import CONF_DIR
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))
