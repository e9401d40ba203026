"""Results: one tidy row per (configuration point, backend), Parquet, written atomically.

Layout of a run directory (one Hydra job = one configuration point)::

    RUN_DIR/                      # a single run, or one job of a sweep
      result.parquet              # one row per backend (COLUMNS below)
      steps.parquet               # one row per (backend, step, layer, request) (STEP_COLUMNS)
      .hydra/                     # Hydra's composed config and overrides
    SWEEP_DIR/<override_dirname>/result.parquet ...

``load(path)`` returns one DataFrame over a job directory, a sweep, or any tree of them (a
file that cannot be read is skipped with one warning naming it); ``python -m harness.results
compact DIR`` merges a sweep's rows into ``DIR/compact.parquet``, which ``load`` reads back.
Every file is written to a temporary name, fsynced and renamed, so it is complete or absent.
The meaning of every column is documented in ``results/README.md``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from backends import backend_classes
from harness.scenarios import scenario_classes

SCHEMA_VERSION = 1


def declared_stages() -> Tuple[str, ...]:
    """Every timed stage a scenario or backend declares, in first-declared order."""
    names: List[str] = []
    for c in scenario_classes():
        names += c.stages
    for c in backend_classes():
        names += c.extend_stages + c.stages
    return tuple(dict.fromkeys(names))


def declared_columns() -> Dict[str, str]:
    """Result columns the backends and scenarios declare (-> pandas dtype)."""
    cols: Dict[str, str] = {}
    for c in (*backend_classes(), *scenario_classes()):
        cols.update(c.columns)
    return cols


#: stage names (each has a ``stage_<name>_us`` column in both tables)
STAGES = declared_stages()
#: per-stage time columns (microseconds), in both tables
STAGE_TIME_COLUMNS: Dict[str, str] = {f"stage_{s}_us": "float64" for s in STAGES}
RESULT_FILE = "result.parquet"
STEPS_FILE = "steps.parquet"
#: ``python -m harness.results compact DIR`` writes DIR/COMPACT_FILE
COMPACT_FILE = "compact.parquet"

#: column -> pandas dtype. Order is the order of the Parquet file.
COLUMNS: Dict[str, str] = {
    "schema_version": "Int64",
    # what was measured
    "backend": "string",
    "attention_kernel": "string",
    "model": "string",
    "kv_dtype": "string",
    "kv_scale_format": "string",
    "kv_row_bytes": "Int64",
    "page_size": "Int64",
    "top_k": "Int64",
    "batch_size": "Int64",
    "context_len": "Int64",
    "pattern": "string",
    "step_overlap": "float64",
    "cluster_len": "Int64",
    "reuse_overlap": "float64",
    "reuse_alpha": "float64",
    "layer_share": "float64",
    "selection": "string",
    "scenario": "string",
    "phase": "string",
    "steps": "Int64",
    "warmup_steps": "Int64",
    "num_layers": "Int64",
    "seed": "Int64",
    # the backends' and scenarios' own columns (declared on their classes)
    **declared_columns(),
    "fuse_topk": "boolean",
    "query_corr": "float64",
    "query_dtype": "string",
    "cold_l2": "boolean",
    "cold_host_translations": "boolean",  # host-address translations evicted before each timed step
    "cuda_graph": "boolean",
    "device": "string",
    # outcome
    "status": "string",
    "error": "string",
    # latency of one decode layer step (all stages), microseconds
    "latency_us_median": "float64",
    "latency_us_p10": "float64",
    "latency_us_p90": "float64",
    "n_samples": "Int64",
    "launch_gap_us": "float64",
    "sm_clock_mhz_min": "float64",
    "sm_clock_mhz_max": "float64",
    "throttled": "boolean",
    # per-stage medians, microseconds (NaN where the backend has no such stage)
    **STAGE_TIME_COLUMNS,
    "stage_plan_us": "float64",
    "plan_builds_per_step": "float64",
    # counts, summed over measured steps, layers and requests
    "tokens_selected": "Int64",
    "pages_touched": "Int64",
    "tokens_loaded": "Int64",
    "pages_loaded": "Int64",
    "hits": "Int64",
    "misses": "Int64",
    "resident_hits": "Int64",
    "hit_rate": "float64",
    "bytes_selected": "Int64",
    "bytes_hbm_read": "Int64",
    "bytes_h2d": "Int64",
    "flops": "float64",
    # rates derived from the counts and the median latency
    "hbm_gbps": "float64",
    "h2d_gbps": "float64",
    "tflops": "float64",
    # ceilings measured in the same process
    "ceiling_hbm_gbps": "float64",
    "ceiling_h2d_gbps": "float64",
    "ceiling_bf16_tflops": "float64",
    # memory
    "working_set_bytes": "Int64",
    "host_bytes": "Int64",
    # correctness against the torch reference
    "max_rel_err": "float64",
    "max_lse_err": "float64",
    "tolerance": "float64",
    # wall time of the backend's run (seconds, host clock): set-up (pools, host KV, prefill),
    # the first step (Triton compilation, warm-up), the other steps (timed work, checks,
    # bookkeeping), the final check and the teardown
    "setup_s": "float64",
    "first_step_s": "float64",
    "later_steps_s": "float64",
    "final_check_s": "float64",
    "teardown_s": "float64",
    # provenance
    "git_sha": "string",
    "git_dirty": "boolean",
    "code_tree_sha": "string",    # harness.env.code_tree_sha: the code's git tree id, as run
    "torch_version": "string",
    "triton_version": "string",
    "flashmla_build": "string",   # harness.env.flashmla_build: distribution version commit, or none
    "gpu_name": "string",
    "hostname": "string",
    "host_virtualized": "boolean",  # harness.env.host_virtualized: a VM (None: unknown)
    "gpu_slot": "Int64", "cuda_visible_devices": "string",  # hydra/launcher=local_gpus slot; as the job saw it
    "repro_command": "string",
    "config_hash": "string",
    "timestamp": "string",
    # micro-benchmarks (harness.bench): null on sweep rows ------------------------------------
    "bench": "string",            # registered bench name (python -m harness.bench list)
    "kernel": "string",           # what was timed, e.g. sparse_mla_decode, flashmla
    "variant": "string",          # launch-configuration variant of the kernel ("default", ...)
    "launch_config": "string",    # that variant's keyword arguments, JSON
    "case": "string",             # the bench's workload case, e.g. all_misses, B8_H128_k2048
    "num_heads": "Int64",         # query (attention) or index (indexer) heads
    "head_dim": "Int64",          # q/k width: attention d_qk, indexer D
    "head_dim_v": "Int64",        # attention V width (d_v)
    "peer": "string",             # the row this one is compared with: its kernel [variant]
    "ratio_to_peer": "float64",   # latency_us_median / the peer row's
    "n_regs": "Int64",            # compiled kernel: registers per thread (Triton's n_regs)
    "n_spills": "Int64",          # compiled kernel: local memory in 4-byte words (Triton's n_spills)
    "smem_bytes": "Int64",        # compiled kernel: shared memory per program, bytes
    # end of micro-benchmarks ------------------------------------------------------------------
}

#: the per-step table; ``backend`` + (step, layer, request) identify a row.
STEP_COLUMNS: Dict[str, str] = {
    "backend": "string",
    "step": "Int64",
    "layer": "Int64",
    "request": "Int64",
    "warmup": "boolean",
    "seq_len": "Int64",
    "tokens_selected": "Int64",
    "pages_touched": "Int64",
    "hits": "Int64",
    "misses": "Int64",
    "resident_hits": "Int64",
    "tokens_loaded": "Int64",
    "pages_loaded": "Int64",
    "bytes_h2d": "Int64",
    "latency_us": "float64",
    **STAGE_TIME_COLUMNS,
}

STATUSES = ("ok", "incorrect", "invalid", "oom", "unavailable", "error")


class SchemaError(ValueError):
    """A results file that this version of the harness cannot read."""


def _frame(rows: Iterable[Mapping], columns: Dict[str, str]) -> pd.DataFrame:
    rows = list(rows)
    extra = sorted({k for r in rows for k in r} - set(columns))
    if extra:
        raise KeyError(f"unknown result columns {extra}; add them to harness.results")
    df = pd.DataFrame([{c: r.get(c) for c in columns} for r in rows], columns=list(columns))
    for c, dt in columns.items():
        if dt == "float64":
            df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
        else:
            df[c] = df[c].astype(dt)
    return df


def _fsync_dir(path: Path) -> None:
    """Makes a rename inside directory ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write_parquet(df: pd.DataFrame, path: Path) -> None:
    """Writes ``df`` to a temporary file beside ``path``, fsyncs it, renames it over ``path`` and
    fsyncs the directory: after a crash ``path`` is the old file, the new one, or absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            df.to_parquet(f, index=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def write_results(job_dir: str | os.PathLike, rows: List[Mapping]) -> Path:
    """Writes ``rows`` (dicts keyed by COLUMNS; missing keys become null) to RESULT_FILE."""
    path = Path(job_dir) / RESULT_FILE
    _atomic_write_parquet(_frame(rows, COLUMNS), path)
    return path


def write_steps(job_dir: str | os.PathLike, rows: List[Mapping]) -> Path:
    """Writes the per-(backend, step, layer, request) table to STEPS_FILE."""
    path = Path(job_dir) / STEPS_FILE
    _atomic_write_parquet(_frame(rows, STEP_COLUMNS), path)
    return path


def _check_schema(df: pd.DataFrame, path: Path) -> None:
    if "schema_version" not in df.columns:
        raise SchemaError(f"{path}: not a harness result file (no schema_version column)")
    newest = int(df["schema_version"].max())
    if newest > SCHEMA_VERSION:
        raise SchemaError(f"{path}: schema_version {newest} is newer than this harness "
                          f"reads ({SCHEMA_VERSION}); update the harness")


def result_files(path: str | os.PathLike) -> List[Path]:
    p = Path(path)
    if p.is_file():
        return [p]
    return sorted(q for q in p.rglob(RESULT_FILE) if not any(s.startswith(".") for s in q.parts[len(p.parts):-1]))


class UnreadableResultWarning(UserWarning):
    """A result file that is not valid Parquet (truncated, or not a result file at all)."""


def read_result(path: str | os.PathLike) -> Optional[pd.DataFrame]:
    """The rows of one Parquet file, or None when it cannot be read (missing, truncated,
    corrupt): what a resumed sweep treats as a point still to run."""
    try:
        return pd.read_parquet(path)
    except Exception:  # pyarrow raises ArrowInvalid, OSError, ... for a damaged file
        return None


def _read_or_warn(path: Path) -> Optional[pd.DataFrame]:
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... for a damaged file
        first = (str(e).splitlines() or [""])[0]
        warnings.warn(f"skipping unreadable {path} ({type(e).__name__}: {first}); "
                      "a re-run of its sweep redoes that point", UnreadableResultWarning, stacklevel=3)
        return None


def load(path: str | os.PathLike, steps: bool = False) -> pd.DataFrame:
    """One DataFrame over every result (or, with ``steps=True``, per-step) file under ``path``
    (a directory tree, one result file, or a ``compact.parquet``).

    Adds a ``job_dir`` column (the directory of each file; a compacted file keeps the one it
    stored). A file that cannot be read is skipped with an ``UnreadableResultWarning`` naming
    it. Raises ``FileNotFoundError`` when there is nothing to load and ``SchemaError`` for a
    file from a newer schema version.
    """
    files = result_files(path)
    if not files:
        raise FileNotFoundError(f"no {RESULT_FILE} under {path}")
    frames = []
    for f in files:
        df = _read_or_warn(f)
        if df is None:
            continue
        _check_schema(df, f)
        if steps:
            sf = f.parent / STEPS_FILE
            if not sf.exists():
                continue
            df = _read_or_warn(sf)
            if df is None:
                continue
        if "job_dir" not in df.columns:
            df.insert(0, "job_dir", str(f.parent))
        frames.append(df)
    if not frames:
        raise FileNotFoundError(f"no readable {STEPS_FILE if steps else RESULT_FILE} under {path}")
    return pd.concat(frames, ignore_index=True)


def compact(sweep_dir: str | os.PathLike, out: Optional[str | os.PathLike] = None) -> Tuple[Path, int]:
    """Merges every readable result row under ``sweep_dir`` into one Parquet file (default
    ``sweep_dir/compact.parquet``, written atomically) with its ``job_dir`` column;
    ``load(that file)`` returns the same frame as ``load(sweep_dir)``. Returns (path, rows)."""
    df = load(sweep_dir)
    path = Path(out) if out is not None else Path(sweep_dir) / COMPACT_FILE
    _atomic_write_parquet(df, path)
    return path, len(df)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m harness.results compact DIR [--out FILE]``."""
    ap = argparse.ArgumentParser(prog="python -m harness.results",
                                 description="Tools for result files (harness.results).")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compact", help="merge a sweep's result rows into one Parquet file")
    c.add_argument("dir", help="a sweep (or any tree of runs)")
    c.add_argument("--out", default=None, help=f"output file (default DIR/{COMPACT_FILE})")
    args = ap.parse_args(argv)
    try:
        path, n = compact(args.dir, args.out)
    except (FileNotFoundError, SchemaError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{path}: {n} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
