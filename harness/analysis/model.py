"""Analytic model: the uniform-random page bound and a per-stage roofline.

Units used throughout this module:

* time in microseconds (µs);
* bytes in bytes; bandwidths in GB/s with 1 GB = 1e9 B;
* compute in FLOP and TFLOP/s with 1 TFLOP = 1e12 FLOP.

**Page amplification** is ``amp_pages`` = pages touched x P / tokens selected (both summed over
a row's measured layer steps and requests; P = page size): the tokens a page-granular loader
without a cache moves per selected token, every touched page counted whole.

*Upper bound* (``page_amplification_bound``), for any selection: in one layer step of one
request, each touched page holds at least one selected token, so pages <= tokens, and no more
pages are touched than the context has, pages <= ceil(n / P) for n tokens in the context. Summed
over the row, pages <= min(tokens, context pages), hence

    amp_pages <= min(P, P * context pages / tokens selected),

where *context pages* = sum over measured steps, layers and requests of ceil(n / P), n counting
the decode tokens added after the prompt (``rows.decode_seq_lens``).

*Uniform-random expectation* (``expected_pages_uniform``, ``expected_amplification_uniform``): if
``k`` of ``N`` token positions are chosen uniformly at random, a page of ``P`` positions is
untouched with probability C(N-P, k)/C(N, k), so the expected number of pages touched is
(N/P) * (1 - C(N-P, k)/C(N, k)). This is what a random selection touches on average, not a bound:
a sample of random selections scatters around it, and a selection more spread out than random
(at most one token per page) lies above it. The
ratio of binomials is the product prod_{i<P} (N-k-i)/(N-i), summed here in log space with
``log1p`` so it stays exact to rounding for N in the millions.

**Roofline.** For one decode layer step of the whole batch, each stage the backend runs is
modelled as

    t_stage = kernels * launch_us + max(hbm_bytes / hbm_bw, h2d_bytes / h2d_bw, flops / compute)

with the bandwidths and compute taken from the ceilings measured in the same process (or from a
hardware YAML, for projections). What each stage moves (``stage_work``):

* ``select`` (lightning indexer + top-k, 2 kernels): reads the index keys of the whole context,
  132 B/token, writes and re-reads fp32 logits (8 B/token); FLOPs 2 * 64 heads * 128 dims per
  context token (fp8 on the GPU, charged here at the bf16 ceiling: an upper bound on its time).
* ``transform`` (1 kernel): flashmla_sparse turns k logical positions into device slots through
  the page table (read 4 B index + 4 B page-table entry, write 4 B per selected token);
  hisparse's coordinator bookkeeping hashes the k positions and scans its device buffer's slot
  table (int32 token + int32 location + int16 LRU entry read, int16 LRU entry written: 12 B per
  slot) and writes 4 B per selected slot.
* ``swap_in`` (hisparse only, 1 kernel): the counted ``bytes_h2d`` over the host link, and the
  same bytes written into the hot buffer in HBM. The harness times the coordinator's
  bookkeeping and copy together as ``swap_in``; when a row has no ``transform`` time of its own,
  its predicted ``swap_in`` is the sum of both kernels (``stage_times_us``).

* ``resolve`` (hisparse_connector only, 1 kernel: resident page -> hot row -> host copy): per
  selected token the page-table lookup of the transform (12 B), per request with a hot region
  (``hot_requests``) the scan of its ``device_buffer_size`` slots (12 B per slot, as hisparse's
  bookkeeping), and the counted ``bytes_h2d`` over the host link, written into hot rows in HBM.

* ``attention`` (1 kernel): reads the counted ``bytes_selected`` (selected KV rows) plus the bf16
  query (d_qk = 576 values) and writes the bf16 output (d_v = 512 values) per head; FLOPs
  2 * 128 heads * (576 + 512) per selected token (QK^T and PV).

Only the stages a row measured are modelled (e.g. ``select`` only with ``selection=indexer``),
so predicted and measured totals cover the same work. The shapes (heads, dims, indexer; the
numbers above are dsv32's) are the ``harness.config.ModelConfig`` of the preset the row's
``model`` column names, ``conf/model/<model>.yaml`` (``model_preset``).

The fixed launch cost per kernel defaults to 5 µs (anchors.md B4: 4-6 µs through the driver; a
tiny torch op from Python costs about 6 µs on the H200 we measured).

The counts in a results row are summed over measured steps x layers x requests (``steps`` is
the number of measured steps, warmup excluded); the latency is for one decode layer step of the
whole batch, so per-step work is count / (steps * num_layers). The ``flops`` and
``bytes_hbm_read`` columns are not used: attention FLOPs are recomputed from ``tokens_selected``
so that every stage is modelled from the same counted quantities.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from harness.config import CONF_DIR, ModelConfig, load_model_preset

from .rows import family, measured_layer_steps, number

STAGES = ("select", "transform", "swap_in", "resolve", "attention")

#: the stages each backend family runs, in order
BACKEND_STAGES = {
    "flashmla_sparse": ("select", "transform", "attention"),
    "hisparse": ("select", "transform", "swap_in", "attention"),
    "hisparse_connector": ("select", "resolve", "attention"),
}

#: kernels launched per stage (launch cost is paid once per kernel)
STAGE_KERNELS = {"select": 2, "transform": 1, "swap_in": 1, "resolve": 1, "attention": 1}

DEFAULT_LAUNCH_US = 5.0


#: bytes of a token's lightning-indexer key per layer besides its index_dim fp8 values: one
#: float32 scale (the fp8 layout of backends/kernels/index_cache.py)
INDEX_KEY_SCALE_BYTES = 4


def model_preset(name: object) -> ModelConfig:
    """The ``ModelConfig`` of the model preset ``conf/model/<name>.yaml`` (a results row's
    ``model`` column: dsv32, tiny). ValueError naming the presets when there is none."""
    presets = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
    if not isinstance(name, str) or name not in presets:
        raise ValueError(f"model={name!r}: no preset conf/model/<model>.yaml; allowed {presets}")
    return replace(_preset(name))


@lru_cache(maxsize=None)
def _preset(name: str) -> ModelConfig:
    return ModelConfig(**load_model_preset(name))


def index_key_bytes(model: ModelConfig) -> int:
    """Bytes of one token's fp8 lightning-indexer key in one layer: index_dim + a float32 scale
    (132 B at dsv32)."""
    return model.index_dim + INDEX_KEY_SCALE_BYTES


# --------------------------------------------------------------------------- page bound

def _log_untouched(N: float, k: float, size: float) -> float:
    """log(C(N-size, k) / C(N, k)): log-probability that a block of ``size`` positions holds
    none of ``k`` uniformly chosen positions out of ``N``. -inf when k > N - size."""
    if k <= 0 or size <= 0:
        return 0.0
    if k > N - size:
        return -math.inf
    i = np.arange(int(size), dtype=np.float64)
    return float(np.sum(np.log1p(-float(k) / (float(N) - i))))


def _touched(N: int, k: int, P: int) -> tuple:
    """(expected touched full pages, probability the partial last page is touched)."""
    k = min(k, N)
    full, rest = divmod(N, P)
    e_full = full * -math.expm1(_log_untouched(N, k, P)) if full else 0.0
    e_rest = -math.expm1(_log_untouched(N, k, rest)) if rest else 0.0
    return e_full, e_rest


def expected_pages_uniform(N: int, k: int, P: int) -> float:
    """Expected number of distinct pages touched when ``k`` of ``N`` positions are chosen
    uniformly without replacement and pages hold ``P`` positions (pages).

    Equals (N/P) * (1 - C(N-P, k)/C(N, k)) when P divides N; a partial last page of N mod P
    positions is handled exactly. ``k`` is clipped to ``N``.
    """
    N, k, P = int(N), int(k), int(P)
    if P <= 0:
        raise ValueError("page size must be positive")
    if N <= 0 or k <= 0:
        return 0.0
    e_full, e_rest = _touched(N, k, P)
    return e_full + e_rest


def expected_amplification_uniform(N: Union[int, Sequence[int]], k: int, P: int) -> float:
    """Expected page amplification of a uniform-random top-``k`` (dimensionless): P x expected
    pages touched / tokens selected, every touched page counted whole, as ``amp_pages`` counts
    it. ``N``: the context length, or one per measured step of a row (``rows.decode_seq_lens``),
    giving P * sum_n E[pages(n)] / sum_n min(k, n). NaN when nothing is selected."""
    lens = [int(n) for n in (N if isinstance(N, (Sequence, np.ndarray)) else [N])]
    k, P = int(k), int(P)
    if P <= 0:
        raise ValueError("page size must be positive")
    selected = sum(min(k, n) for n in lens if n > 0)
    if selected <= 0:
        return float("nan")
    return P * sum(expected_pages_uniform(n, k, P) for n in lens) / selected


def page_amplification_bound(context_pages: float, tokens_selected: float, P: float) -> float:
    """The largest ``amp_pages`` any selection can have (dimensionless): min(P, P *
    context_pages / tokens_selected) (module doc); ``context_pages`` and ``tokens_selected``
    summed over the same layer steps and requests. P alone when ``context_pages`` is unknown
    (NaN); NaN when nothing is selected."""
    if not tokens_selected > 0:
        return float("nan")
    if math.isnan(context_pages):
        return float(P)
    return float(min(P, P * context_pages / tokens_selected))


# --------------------------------------------------------------------------- ceilings

@dataclass(frozen=True)
class Ceilings:
    """Hardware ceilings. ``None`` means "take the ceiling measured in the run" (hbm_gbps and
    h2d_gbps in GB/s, bf16_tflops in TFLOP/s, launch_us in µs, hbm_capacity_gb in GB)."""

    name: str = "measured"
    hbm_gbps: Optional[float] = None
    h2d_gbps: Optional[float] = None
    bf16_tflops: Optional[float] = None
    launch_us: float = DEFAULT_LAUNCH_US
    hbm_capacity_gb: Optional[float] = None
    label: str = ""

    @property
    def is_placeholder(self) -> bool:
        return self.hbm_gbps is None and self.h2d_gbps is None and self.bf16_tflops is None

    def filled_from(self, hbm_gbps: float, h2d_gbps: float, bf16_tflops: float) -> "Ceilings":
        """These ceilings with every ``None`` replaced by the given (measured) value."""
        return replace(self,
                       hbm_gbps=hbm_gbps if self.hbm_gbps is None else self.hbm_gbps,
                       h2d_gbps=h2d_gbps if self.h2d_gbps is None else self.h2d_gbps,
                       bf16_tflops=bf16_tflops if self.bf16_tflops is None else self.bf16_tflops)


def load_hardware(path: str | Path) -> Ceilings:
    """Reads a ``conf/hardware/*.yaml`` ceiling set (keys as in ``Ceilings``)."""
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    known = {f for f in Ceilings.__dataclass_fields__}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown hardware keys {unknown}; allowed {sorted(known)}")
    kw = dict(data)
    kw.setdefault("name", Path(path).stem)
    for key in ("hbm_gbps", "h2d_gbps", "bf16_tflops", "launch_us", "hbm_capacity_gb"):
        if kw.get(key) is not None:
            kw[key] = float(kw[key])
    if kw.get("launch_us") is None:
        kw["launch_us"] = DEFAULT_LAUNCH_US
    kw["name"] = str(kw["name"])
    kw["label"] = str(kw.get("label") or kw["name"])
    return Ceilings(**kw)


# --------------------------------------------------------------------------- stage work

@dataclass(frozen=True)
class StageWork:
    """What one stage moves and computes in one decode layer step of the whole batch."""

    hbm_bytes: float = 0.0
    h2d_bytes: float = 0.0
    flops: float = 0.0
    kernels: int = 1


def stage_work(row: Mapping, model: Optional[ModelConfig] = None) -> Dict[str, StageWork]:
    """Bytes and FLOPs per stage for one results row, per decode layer step of the batch.

    Uses the counted ``tokens_selected``, ``bytes_selected`` and ``bytes_h2d`` (divided by the
    measured layer steps) and the axes ``batch_size``, ``context_len``, ``top_k``,
    ``device_buffer_size``, ``kv_row_bytes``; ``model`` defaults to the preset the row's
    ``model`` column names. See the module docstring for each stage.
    """
    m = model or model_preset(row.get("model"))
    fam = family(row.get("backend"))
    B = number(row, "batch_size")
    N = number(row, "context_len")
    k = number(row, "top_k")
    R = number(row, "kv_row_bytes")
    per = measured_layer_steps(row)
    tok = number(row, "tokens_selected") / per
    if not np.isfinite(tok):
        tok = B * min(k, N)
    sel_bytes = number(row, "bytes_selected") / per
    if not np.isfinite(sel_bytes):
        sel_bytes = tok * R
    work = {
        "select": StageWork(hbm_bytes=B * N * (index_key_bytes(m) + 8),
                            flops=B * N * (2.0 * m.index_heads * m.index_dim),
                            kernels=STAGE_KERNELS["select"]),
        "attention": StageWork(hbm_bytes=sel_bytes + B * m.num_heads * 2 * (m.d_qk + m.d_v),
                               flops=tok * (2.0 * m.num_heads * (m.d_qk + m.d_v)),
                               kernels=STAGE_KERNELS["attention"]),
    }
    h2d = number(row, "bytes_h2d") / per
    h2d = 0.0 if not np.isfinite(h2d) else h2d
    if fam == "hisparse_connector":
        D = number(row, "device_buffer_size")
        hot = number(row, "hot_requests")
        scan = 12 * D * hot if np.isfinite(D) and np.isfinite(hot) else 0.0
        work["resolve"] = StageWork(hbm_bytes=B * k * 12 + scan + h2d, h2d_bytes=h2d,
                                    kernels=STAGE_KERNELS["resolve"])
    elif fam == "hisparse":
        D = number(row, "device_buffer_size")
        work["transform"] = StageWork(hbm_bytes=B * (8 * k + 12 * D), kernels=STAGE_KERNELS["transform"])
        work["swap_in"] = StageWork(hbm_bytes=h2d, h2d_bytes=h2d, kernels=STAGE_KERNELS["swap_in"])
    else:
        work["transform"] = StageWork(hbm_bytes=B * k * 12, kernels=STAGE_KERNELS["transform"])
    return {s: work[s] for s in STAGES if s in work}


def stage_time_us(work: StageWork, ceil: Ceilings) -> float:
    """Roofline time of one stage in µs: kernels*launch + max(bytes/bandwidth, flops/compute).

    A term whose ceiling is missing (None/NaN) makes the result NaN unless that term is zero.
    """
    def term(amount: float, rate: Optional[float], scale: float) -> float:
        if amount == 0:
            return 0.0
        if rate is None or not np.isfinite(rate) or rate <= 0:
            return float("nan")
        return amount / (rate * scale)

    # GB/s -> B/µs is *1e3; TFLOP/s -> FLOP/µs is *1e6
    t = max(term(work.hbm_bytes, ceil.hbm_gbps, 1e3),
            term(work.h2d_bytes, ceil.h2d_gbps, 1e3),
            term(work.flops, ceil.bf16_tflops, 1e6))
    return work.kernels * ceil.launch_us + t


def row_ceilings(row: Mapping, base: Ceilings = Ceilings()) -> Ceilings:
    """``base`` with its placeholders filled from the row's measured ceiling_* columns."""
    return base.filled_from(number(row, "ceiling_hbm_gbps"), number(row, "ceiling_h2d_gbps"),
                            number(row, "ceiling_bf16_tflops"))


def modelled_stages(row: Mapping) -> tuple:
    """The stages to model for a row: the backend's stages, restricted to those the row measured
    when it measured any (so predicted and measured totals cover the same work)."""
    stages = BACKEND_STAGES.get(family(row.get("backend")), STAGES)
    measured = [s for s in stages if np.isfinite(measured_stage_us(row, s))]
    return tuple(measured) if measured else tuple(stages)


def measured_stage_us(row: Mapping, stage: str) -> float:
    """Measured median of a stage in µs; ``select`` falls back to indexer + top-k."""
    v = number(row, f"stage_{stage}_us")
    if stage == "select" and not np.isfinite(v):
        v = number(row, "stage_indexer_us") + number(row, "stage_topk_us")
    return v


def stage_times_us(row: Mapping, ceil: Ceilings, stages: Sequence[str],
                   model: Optional[ModelConfig] = None) -> Dict[str, float]:
    """Roofline µs of each of ``stages`` for a row. When hisparse's ``transform`` (coordinator
    bookkeeping) is not among the stages but ``swap_in`` is, the row timed them together (the
    harness's ``swap_in`` = hit/miss resolution + copy), so ``swap_in`` gets both kernels' time."""
    work = stage_work(row, model)
    t = {s: stage_time_us(work[s], ceil) for s in stages if s in work}
    if "swap_in" in t and "transform" not in stages and "transform" in work:
        t["swap_in"] += stage_time_us(work["transform"], ceil)
    return t


def predict(df: pd.DataFrame, hardware: Ceilings = Ceilings(),
            model: Optional[ModelConfig] = None) -> pd.DataFrame:
    """Per row: predicted µs per stage (``pred_<stage>_us``), their sum ``pred_total_us``, the
    measured stage and total times, and measured / predicted ratios (``ratio_<stage>``,
    ``ratio_total``). Placeholders in ``hardware`` are filled from each row's own ceilings."""
    out = []
    for _, r in df.iterrows():
        row = r.to_dict()
        ceil = row_ceilings(row, hardware)
        stages = modelled_stages(row)
        pt = stage_times_us(row, ceil, stages, model)
        rec = {}
        total = 0.0
        meas_sum = 0.0
        for s in STAGES:
            p = pt.get(s, float("nan")) if s in stages else float("nan")
            m = measured_stage_us(row, s) if s in stages else float("nan")
            rec[f"pred_{s}_us"] = p
            rec[f"meas_{s}_us"] = m
            rec[f"ratio_{s}"] = m / p if np.isfinite(m) and np.isfinite(p) and p > 0 else float("nan")
            if s in stages:
                total += p
                meas_sum += m if np.isfinite(m) else 0.0
        rec["pred_total_us"] = total
        rec["meas_total_us"] = number(row, "latency_us_median")
        rec["meas_stage_sum_us"] = meas_sum
        rec["ratio_total"] = (rec["meas_total_us"] / total
                              if np.isfinite(total) and total > 0 else float("nan"))
        rec["ceiling_set"] = ceil.name
        out.append(rec)
    return pd.DataFrame(out, index=df.index)


def project(df: pd.DataFrame, target: Ceilings, source: Ceilings = Ceilings(),
            model: Optional[ModelConfig] = None) -> pd.DataFrame:
    """Projects each row's latency onto ``target`` hardware (µs). PROJECTIONS, not measurements.

    Where the source ceilings are known (measured in the run, or given), each measured stage is
    scaled by predicted(target) / predicted(source), keeping the measured efficiency, and the
    unmodelled remainder (measured total minus the sum of measured stages: launch gaps, host
    overhead) is carried over unchanged: ``projection_basis = 'scaled-measured'``. Otherwise the
    projection is the target's pure roofline total: ``'roofline-only'``.
    Rows whose status is not 'ok' get NaN. Returns ``proj_<stage>_us``, ``proj_latency_us``,
    ``projection_basis``.
    """
    out = []
    for _, r in df.iterrows():
        row = r.to_dict()
        src = row_ceilings(row, source)
        tgt = row_ceilings(row, target)
        stages = modelled_stages(row)
        t_tgt = stage_times_us(row, tgt, stages, model)
        t_src = stage_times_us(row, src, stages, model)
        rec: Dict[str, object] = {}
        scaled_ok = True
        proj_sum = meas_sum = roof = 0.0
        for s in STAGES:
            if s not in stages:
                rec[f"proj_{s}_us"] = float("nan")
                continue
            pt = t_tgt[s]
            ps = t_src[s]
            m = measured_stage_us(row, s)
            roof += pt
            if np.isfinite(m) and np.isfinite(ps) and ps > 0 and np.isfinite(pt):
                v = m * pt / ps
                meas_sum += m
            else:
                v = pt
                scaled_ok = False
            rec[f"proj_{s}_us"] = v
            proj_sum += v
        total = number(row, "latency_us_median")
        if row.get("status", "ok") != "ok":
            rec["proj_latency_us"] = float("nan")
            rec["projection_basis"] = f"not projected ({row.get('status')})"
        elif scaled_ok and np.isfinite(total):
            rec["proj_latency_us"] = proj_sum + max(0.0, total - meas_sum)
            rec["projection_basis"] = "scaled-measured"
        else:
            rec["proj_latency_us"] = roof
            rec["projection_basis"] = "roofline-only"
        rec["target"] = target.name
        out.append(rec)
    return pd.DataFrame(out, index=df.index)
