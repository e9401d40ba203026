"""Values read from results rows (``harness.results`` columns), NA-safe, for the analysis modules.

A *row* is one results row as a mapping column -> value (a dict, or a pandas Series from
``iterrows``); a *frame* is a DataFrame of rows. Missing values (None, NaN, pd.NA) read as NaN.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Union

import numpy as np
import pandas as pd


#: ``scenario`` of the rows the capacity section reads (harness/scenarios/capacity.py); every other
#: row (decode, extend, or older rows without a scenario) belongs to the trade-off analysis
CAPACITY = "capacity"


def is_capacity(df: pd.DataFrame) -> pd.Series:
    """Boolean Series on ``df``'s index: True for ``scenario=capacity`` rows (False where the
    column is absent or missing)."""
    if "scenario" not in df:
        return pd.Series(False, index=df.index)
    return (df["scenario"].astype("string") == CAPACITY).fillna(False).astype(bool)


def family(backend: object) -> str:
    """The backend family: the part of the backend name before any '+'."""
    return str(backend).split("+", 1)[0]


def num(s: pd.Series) -> pd.Series:
    """A column as float64 with NaN for missing values (works for nullable Int64/boolean)."""
    return pd.Series(pd.to_numeric(s, errors="coerce"), index=s.index).astype("float64")


def is_missing(v: object) -> bool:
    """True for None, NaN, NaT and pd.NA; False for any other value (also for non-scalars)."""
    try:
        return v is None or bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def number(row: Mapping, column: str) -> float:
    """``row[column]`` as a float; NaN when the column is absent or its value missing."""
    v = row.get(column)
    return float("nan") if is_missing(v) else float(v)


def measured_layer_steps(rows: Union[Mapping, pd.DataFrame]) -> Union[float, pd.Series]:
    """The measured layer steps a row's counts are summed over (and over requests):
    (steps - warmup_steps) * num_layers, a missing warmup_steps counting as 0; where that is not
    a positive number, ``n_samples``; NaN where neither is.

    ``rows``: one row -> a float; a frame -> a float64 Series on the frame's index.
    """
    frame = isinstance(rows, pd.DataFrame)

    def column(name: str):
        if frame:
            return num(rows[name]).to_numpy() if name in rows else np.full(len(rows), np.nan)
        return number(rows, name)

    steps, warm, layers, n_samples = (column(c) for c in ("steps", "warmup_steps", "num_layers", "n_samples"))
    per = (steps - np.where(np.isfinite(warm), warm, 0.0)) * layers
    per = np.where(np.isfinite(per) & (per > 0), per, n_samples)
    per = np.where(np.isfinite(per) & (per > 0), per, np.nan)
    return pd.Series(per, index=rows.index, dtype="float64") if frame else float(per)


def decode_seq_lens(row: Mapping) -> Optional[np.ndarray]:
    """int64 ``[measured steps]``: the tokens every request holds at each measured decode step of
    a synthetic decode row, ``context_len + s + 1`` for ``s`` in ``[warmup_steps, steps)`` (the
    prompt plus the decode tokens added after it, ``harness.workload``). ``None`` where the row
    does not fix them: extend rows (each query row sees its own seeded prefix), replayed traces
    (lengths from the trace file), or rows missing ``context_len`` / ``steps``."""
    phase, sel = row.get("phase"), row.get("selection")
    if (not is_missing(phase) and phase != "decode") or (not is_missing(sel) and sel == "trace"):
        return None
    ctx, steps, warm = number(row, "context_len"), number(row, "steps"), number(row, "warmup_steps")
    warm = 0.0 if math.isnan(warm) else warm
    if math.isnan(ctx) or math.isnan(steps) or steps <= warm:
        return None
    return int(ctx) + 1 + np.arange(int(warm), int(steps), dtype=np.int64)
