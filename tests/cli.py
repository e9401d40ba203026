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
