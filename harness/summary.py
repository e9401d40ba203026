"""A backend's measured samples and counts -> the statistics, rates and status of its row."""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from backends.base import COUNT_KEYS
from harness.config import ModelConfig
from harness.timing import TimingStats

#: counts of the served selection itself
SELECTION_KEYS = ("tokens_selected", "pages_touched")
LSE_TOLERANCE = 0.05


def empty_sums() -> Dict[str, Optional[int]]:
    """Running sums over the measured samples; a count the backend never reports becomes None."""
    return {k: 0 for k in (*SELECTION_KEYS, *COUNT_KEYS)}


def add_counts(sums: Dict, counts: Dict[str, np.ndarray]) -> None:
    """Adds one layer step's per-request ``counts`` (``COUNT_KEYS``) to ``sums`` in place."""
    for k in COUNT_KEYS:
        sums[k] = sums[k] + int(counts[k].sum()) if (k in counts and sums[k] is not None) else None


def correctness(max_err: float, max_lse: float, tolerance: float, selection_error: Optional[str]) -> Dict:
    """``max_rel_err``, ``max_lse_err``, and ``status`` ok / incorrect with the reasons in ``error``."""
    bad = [selection_error] if selection_error else []
    if not max_err <= tolerance:
        bad.append(f"max_rel_err={max_err:.3g} > tolerance {tolerance}")
    if not max_lse <= LSE_TOLERANCE:
        bad.append(f"max_lse_err={max_lse:.3g} > {LSE_TOLERANCE}")
    return {"max_rel_err": max_err, "max_lse_err": max_lse,
            "status": "incorrect" if bad else "ok", "error": "; ".join(bad) if bad else None}


def summarize(samples: List[Dict[str, float]], sums: Dict, *, model: ModelConfig, rows: int,
              top_k: int, row_bytes: int, record: np.ndarray, warmup_steps: int,
              stages: tuple) -> Dict:
    """Latency statistics, per-stage medians, counts and derived rates of the measured steps.

    ``rows``: query rows per sample (decode: the batch; extend: the query tokens); ``row_bytes``:
    bytes attention reads per selected KV row; ``record`` int32 ``[steps, layers, rows, top_k]``
    the positions served (-1 = none); ``stages``: every stage name with a ``stage_<s>_us``
    column (NaN where this backend has none)."""
    lat = TimingStats.of([t["total"] for t in samples])
    row = {"latency_us_median": lat.median_us, "latency_us_p10": lat.p10_us,
           "latency_us_p90": lat.p90_us, "n_samples": lat.n,
           "launch_gap_us": TimingStats.of([t.get("launch_gap", float("nan")) for t in samples]).median_us}
    for st in stages:
        vals = [t[st] for t in samples if st in t]
        row[f"stage_{st}_us"] = TimingStats.of(vals).median_us if vals else float("nan")
    row.update(sums)
    m, rb = model, row_bytes
    n = max(lat.n, 1)
    row["bytes_selected"] = sums["tokens_selected"] * rb
    # attention's minimum HBM reads: the queries, the index table and each selected row once
    q_bytes = rows * m.num_heads * m.d_qk * 2
    idx_bytes = rows * top_k * 4
    row["bytes_hbm_read"] = lat.n * (q_bytes + idx_bytes) + sums["tokens_selected"] * rb
    valid_entries = int((record[warmup_steps:] >= 0).sum())
    row["flops"] = 2.0 * m.num_heads * valid_entries * (m.d_qk + m.d_v)
    sec = lat.median_us * 1e-6
    row["hbm_gbps"] = row["bytes_hbm_read"] / n / sec / 1e9 if sec > 0 else float("nan")
    row["tflops"] = row["flops"] / n / sec / 1e12 if sec > 0 else float("nan")
    if sums.get("bytes_h2d") is not None:
        row["h2d_gbps"] = sums["bytes_h2d"] / n / sec / 1e9 if sec > 0 else float("nan")
    if sums.get("hits") is not None and sums.get("misses") is not None:
        tot = sums["hits"] + sums["misses"]
        row["hit_rate"] = sums["hits"] / tot if tot else float("nan")
    return row
