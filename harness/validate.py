"""Configuration checks that run before any kernel: one clear message naming the field and
what is allowed."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from backends import BACKENDS
from harness.selection import PATTERNS

KV_DTYPES = ("bf16", "fp8_ds_mla")
SOURCES = ("synthetic", "trace", "indexer")
GRANULARITIES = ("token", "page")
COPY_ENGINES = ("uva_kernel", "memcpy", "staged")
COORDINATORS = ("triton", "sglang")
ATTENTION_KERNELS = ("triton", "flashmla")
DEVICES = ("auto", "cuda", "cpu")
PHASES = ("decode", "extend")


class ConfigError(ValueError):
    """An invalid configuration value."""

    def __init__(self, field: str, value, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"invalid configuration: {field}={value!r}: {allowed}")


def _is_pow2(x: int) -> bool:
    return isinstance(x, (int, np.integer)) and x >= 1 and (x & (x - 1)) == 0


#: fields whose value must be one of a fixed set (the message lists them)
CHOICES = {
    "pattern": PATTERNS,
    "backend": tuple(sorted(BACKENDS)) + ("all",),
    "kv_dtype": KV_DTYPES,
    "device": DEVICES,
    "attention_kernel": ATTENTION_KERNELS,
    "selection.source": SOURCES,
    "hisparse.load_granularity": GRANULARITIES,
    "hisparse.copy_engine": COPY_ENGINES,
    "hisparse.coordinator": COORDINATORS,
    "phase": PHASES,
}
#: fields that must be integers >= 1
POSITIVE_INTS = ("top_k", "batch_size", "context_len", "steps", "num_layers", "extend_len")
#: fields that must be fractions in [0, 1]
FRACTIONS = ("step_overlap", "selection.query_corr")


def check_value(field: str, value) -> None:
    """Checks one top-level axis value on its own (used per value of a sweep, up front)."""
    if field == "page_size" and not _is_pow2(value):
        raise ConfigError(field, value, "must be a power of two (1, 2, 4, ..., 256, ...)")
    if field in POSITIVE_INTS and not (isinstance(value, (int, np.integer)) and value >= 1):
        raise ConfigError(field, value, "must be an integer >= 1")
    if field in FRACTIONS and not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ConfigError(field, value, "must be a fraction in [0, 1]")
    if field in CHOICES and value not in CHOICES[field]:
        name = "selection" if field == "selection.source" else field
        raise ConfigError(name, value, f"allowed: {', '.join(CHOICES[field])}")


CHECKED_FIELDS = ("page_size", *POSITIVE_INTS, *FRACTIONS, *CHOICES)


def backends_of(cfg) -> list:
    return sorted(BACKENDS) if cfg.backend == "all" else [cfg.backend]


def validate(cfg) -> None:
    """Raises ConfigError for the first invalid field of a resolved RunConfig."""
    for f in CHECKED_FIELDS:
        node = cfg
        for part in f.split("."):
            node = node[part]
        check_value(f, node)
    if cfg.timing.warmup_steps < 0 or cfg.timing.warmup_steps >= cfg.steps:
        raise ConfigError("timing.warmup_steps", cfg.timing.warmup_steps,
                          f"must be >= 0 and < steps ({cfg.steps}) so some steps are measured")
    if cfg.timing.cuda_graph and cfg.selection.source == "indexer":
        raise ConfigError("timing.cuda_graph", True, "not supported with selection=indexer yet "
                          "(the select stage is not captured); use selection=synthetic or trace")
    if cfg.timing.cuda_graph and cfg.device == "cpu":
        raise ConfigError("timing.cuda_graph", True, "CUDA-graph replay needs device=cuda (or auto on a GPU machine)")
    m = cfg.model
    if m.d_nope % 128 or m.d_nope < 128:
        raise ConfigError("model.d_nope", m.d_nope, "must be a positive multiple of 128 (fp8 scale tiles)")
    if m.d_v != m.d_nope:
        raise ConfigError("model.d_v", m.d_v, f"must equal model.d_nope ({m.d_nope}): V is the latent part of the row")
    if m.num_heads < 1:
        raise ConfigError("model.num_heads", m.num_heads, "must be >= 1")
    if cfg.phase == "extend":
        _check_extend(cfg)
    if "hisparse" in backends_of(cfg) and cfg.phase == "decode":
        h = cfg.hisparse
        d = h.device_buffer_size if h.device_buffer_size is not None else 2 * cfg.top_k
        if d < cfg.top_k:
            raise ConfigError("hisparse.device_buffer_size", d, f"must be >= top_k ({cfg.top_k})")
        if h.load_granularity == "page" and d % cfg.page_size:
            raise ConfigError("hisparse.device_buffer_size", d,
                              f"must be a multiple of page_size ({cfg.page_size}) when load_granularity=page")


def _check_extend(cfg) -> None:
    """phase=extend: the indexer selects inside the step, so there is no trace to replay."""
    if cfg.selection.source == "trace" or cfg.selection.record:
        raise ConfigError("selection", cfg.selection.source,
                          "phase=extend selects with the lightning indexer: no trace replay or "
                          "record (use selection=synthetic, the default, or selection.source=indexer)")
    e = cfg.extend
    if not 0.0 <= e.shared_prefix <= 1.0:
        raise ConfigError("extend.shared_prefix", e.shared_prefix, "must be a fraction in [0, 1]")
    if e.group_size < 1:
        raise ConfigError("extend.group_size", e.group_size, "must be an integer >= 1")
    if not 0.0 <= e.prefix_spread < 1.0:
        raise ConfigError("extend.prefix_spread", e.prefix_spread, "must be in [0, 1)")


def check_trace(topk: np.ndarray, seq_lens: np.ndarray, cfg, path: Optional[str] = None) -> None:
    """The trace must match the config's steps, num_layers, batch_size and top_k and hold
    valid positions."""
    where = f"selection.path={path!r}" if path else "selection"
    want = (cfg.steps, cfg.num_layers, cfg.batch_size, cfg.top_k)
    if topk.ndim != 4 or tuple(topk.shape) != want:
        raise ConfigError(where, tuple(topk.shape),
                          f"trace topk shape must be [steps, num_layers, batch_size, top_k] = {list(want)}; "
                          "set those keys to match the trace")
    if tuple(seq_lens.shape) != (cfg.steps, cfg.batch_size):
        raise ConfigError(where, tuple(seq_lens.shape),
                          f"trace seq_lens shape must be [steps, batch_size] = {[cfg.steps, cfg.batch_size]}")
    if (seq_lens < 1).any():
        raise ConfigError(where, int(seq_lens.min()), "trace seq_lens must be >= 1")
    over = topk >= seq_lens[:, None, :, None]
    if over.any() or (topk < -1).any():
        s, l, b, k = np.argwhere(over | (topk < -1))[0]
        raise ConfigError(where, int(topk[s, l, b, k]),
                          f"trace position at [step {s}, layer {l}, request {b}, {k}] must be -1 or "
                          f"< seq_len ({int(seq_lens[s, b])})")
