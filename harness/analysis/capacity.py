"""Capacity view: how many requests each backend holds in an HBM budget, and the decode
throughput at that batch. This is the trade-off HiSparse exists for.

Units: bytes (GB = 1e9 B) for memory, µs for the per-layer step time, tokens/s for throughput.

KV bytes on the GPU per request, for a model of L layers (61 for DeepSeek-V3.2), row bytes R
(656 fp8 / 1152 bf16 per token per layer) and index keys I = 132 B per token per layer (L is
the ``layers`` of the model's ``harness.config.ModelConfig``, I its ``model.index_key_bytes``):

* flashmla_sparse: the whole KV is resident: context * L * (R + I).
* hisparse: the hot buffer of ``device_buffer_size`` slots plus one page for the newest token,
  and the index keys of the whole context: (min(D, page-aligned context) + P) * L * R +
  context * L * I. (SGLang keeps min(page_align(len), D) slots for a short request.)
  The full KV, context * L * R, lives in pinned host memory.
* hisparse_connector: not modelled here (its residency is decided by the budget itself); the
  measured capacity section (``capacity_measured``, ``scenario=capacity`` rows) covers it.

This view is a *projection* from decode rows measured at one batch; ``capacity_measured`` holds
the measured counterpart (each design run at its own maximum batch) and draws this one beside it.

Throughput: tokens/s = batch / (L * t(batch)), t the per-layer step time (µs) of the whole
batch. t is measured at the run's batch sizes; at other batches it is *extrapolated*: with two
or more measured batch sizes, by a least-squares line t = a + b * batch (a fixed cost plus a
per-request cost); with one, proportionally (t = t_measured * batch / batch_measured, which keeps
tokens/s at its measured value). The ``scaling`` column says which was used.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from harness.config import ModelConfig

from .model import index_key_bytes, model_preset
from .rows import num
from .tables import BASE, COORD, AxisRoles, _py, _sort_key

DEFAULT_HBM_GB = 141.0
#: weights + activations kept out of the KV budget by default (GB): DeepSeek-V3.2's ~671 B
#: parameters in fp8 are ~690 GB, i.e. ~86 GB per GPU over 8 GPUs, plus a few GB of activations.
DEFAULT_RESERVE_GB = 90.0


def kv_bytes_per_request(model: ModelConfig, fam: str, context_len: int, kv_row_bytes: int,
                         device_buffer_size: Optional[int] = None,
                         page_size: Optional[int] = None) -> Tuple[float, float]:
    """(GPU bytes, host bytes) one request needs across the ``model.layers`` layers."""
    L, I, N, R = model.layers, index_key_bytes(model), int(context_len), int(kv_row_bytes)
    if fam == BASE:
        return float(N * L * (R + I)), 0.0
    if fam == COORD:
        if device_buffer_size is None:
            return float("nan"), float(N * L * R)
        P = int(page_size) if page_size else 1
        slots = min(int(device_buffer_size), math.ceil(N / P) * P) + P
        return float(slots * L * R + N * L * I), float(N * L * R)
    return float("nan"), float("nan")


def max_batch(budget_bytes: float, per_request_bytes: float) -> int:
    """Whole requests that fit in ``budget_bytes`` (0 when none does or the size is unknown)."""
    if not np.isfinite(per_request_bytes) or per_request_bytes <= 0 or budget_bytes <= 0:
        return 0
    return int(budget_bytes // per_request_bytes)


def fit_step_time(batches: List[float], times_us: List[float]) -> Tuple[float, float, str]:
    """(a, b, how) such that t(batch) = a + b * batch in µs, from measured (batch, time) pairs."""
    b_arr, t_arr = np.asarray(batches, float), np.asarray(times_us, float)
    uniq = np.unique(b_arr)
    if len(uniq) >= 2:
        slope, icpt = np.polyfit(b_arr, t_arr, 1)
        if slope > 0 and icpt >= 0:
            return float(icpt), float(slope), (
                "affine fit over batch sizes " + ",".join(str(int(v)) for v in uniq))
    i = int(np.argmax(b_arr))
    return 0.0, float(t_arr[i] / b_arr[i]), f"proportional from batch {int(b_arr[i])}"


def throughput_tokens_per_s(model: ModelConfig, batch: int, step_us: float) -> float:
    """Decode tokens/s for ``batch`` requests at ``step_us`` per layer step: batch / (L * t), L the
    ``model.layers``."""
    if batch <= 0 or not np.isfinite(step_us) or step_us <= 0:
        return 0.0
    return batch / (model.layers * step_us * 1e-6)


def capacity_table(pb: pd.DataFrame, roles: AxisRoles, hbm_gb: float = DEFAULT_HBM_GB,
                   reserve_gb: float = DEFAULT_RESERVE_GB, latency_col: str = "latency_us_median",
                   model: Optional[ModelConfig] = None) -> pd.DataFrame:
    """One row per (cell without batch_size, backend variant) over the ok rows of
    ``per_backend_table``: GPU and host GB per request, the batch that fits in
    ``hbm_gb - reserve_gb``, the step time there and the decode throughput (families whose
    footprint ``kv_bytes_per_request`` does not model are left out). ``model`` (layers,
    index key bytes) defaults to the preset each row's ``model`` column names."""
    budget = (hbm_gb - reserve_gb) * 1e9
    ok = pb[(pb["status"] == "ok") & np.isfinite(num(pb[latency_col]))] if not pb.empty else pb
    keys = [c for c in roles.cell if c != "batch_size"] + ["family"] + roles.variant_columns()
    groups: Dict[tuple, list] = {}
    for rec in ok.to_dict("records"):
        groups.setdefault(tuple(_py(rec.get(k)) for k in keys), []).append(rec)
    rows = []
    for key in sorted(groups, key=_sort_key):
        recs = groups[key]
        r0 = recs[0]
        fam = r0["family"]
        ctx, row_b = _py(r0.get("context_len")), _py(r0.get("kv_row_bytes"))
        if ctx is None or row_b is None:
            continue
        m = model or model_preset(r0.get("model"))
        gpu, host = kv_bytes_per_request(m, fam, ctx, row_b, _py(r0.get("device_buffer_size")),
                                         _py(r0.get("page_size")))
        if not np.isfinite(gpu):   # a design this view does not model
            continue
        nb = max_batch(budget, gpu)
        batches = [float(r.get("batch_size") or 1) for r in recs]
        times = [float(r[latency_col]) for r in recs]
        a, b, how = fit_step_time(batches, times)
        t_at = a + b * nb if nb else float("nan")
        i = int(np.argmax(batches))
        row = dict(zip(keys, key))
        row.update({
            "context_len": ctx, "kv_row_bytes": row_b,
            "gpu_GB_per_request": gpu / 1e9, "host_GB_per_request": host / 1e9,
            "kv_budget_GB": budget / 1e9, "max_batch": nb,
            "measured_batch": int(batches[i]), "measured_step_us": times[i],
            "measured_tokens_per_s": throughput_tokens_per_s(m, int(batches[i]), times[i]),
            "step_us_at_max_batch": t_at,
            "tokens_per_s_at_max_batch": throughput_tokens_per_s(m, nb, t_at),
            "scaling": how,
        })
        rows.append(row)
    return pd.DataFrame(rows)
