"""Configuration checks that run before any kernel: one clear message naming the field and
what is allowed."""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from backends import BACKENDS, backend_class
from backends.attention import ATTENTION_KERNELS
from backends.base import PHASES, SLOT_ALIGN, ConfigError, pool_pages
from backends.kernels.indexer import QUERY_DTYPES
from backends.kernels.kv_format import KV_DTYPES, KV_SCALE_FORMATS
from harness.config import backend_settings
from harness.device import DEVICES
from harness.scenarios import SCENARIOS, scenario_class, scenario_classes
from harness.selection import PATTERNS, SOURCES, Trace, TraceError


def _is_pow2(x: int) -> bool:
    return isinstance(x, (int, np.integer)) and x >= 1 and (x & (x - 1)) == 0


def _declared_choices() -> Dict[str, Tuple]:
    """``<name>.<field>`` -> allowed values, from every backend's and scenario's ``choices``."""
    out: Dict[str, Tuple] = {}
    for name in sorted(BACKENDS):
        out.update({f"{name}.{k}": v for k, v in backend_class(name).choices.items()})
    for cls in scenario_classes():
        out.update({f"{cls.name}.{k}": v for k, v in cls.choices.items()})
    return out


#: fields whose value must be one of a fixed set (the message lists them); each tuple is
#: imported from the module that owns it
CHOICES = {
    "pattern": PATTERNS,
    "backend": tuple(sorted(BACKENDS)) + ("all",),
    "kv_dtype": KV_DTYPES,
    "kv_scale_format": KV_SCALE_FORMATS,
    "device": DEVICES,
    "attention_kernel": ATTENTION_KERNELS,
    "selection.source": SOURCES,
    "selection.query_dtype": QUERY_DTYPES,
    "scenario": tuple(SCENARIOS),
    "phase": PHASES,
    **_declared_choices(),
}
#: fields that must be integers >= 1
POSITIVE_INTS = ("top_k", "batch_size", "context_len", "steps", "num_layers", "extend_len")
#: fields that must be fractions in [0, 1]
FRACTIONS = ("step_overlap", "selection.query_corr", "selection.reuse_overlap",
             "selection.layer_share")
#: fields that must be real numbers >= 0
NON_NEGATIVE = ("selection.reuse_alpha",)


def check_value(field: str, value) -> None:
    """Checks one top-level axis value on its own (used per value of a sweep, up front)."""
    if field == "page_size" and not _is_pow2(value):
        raise ConfigError(field, value, "must be a power of two (1, 2, 4, ..., 256, ...)")
    if field in POSITIVE_INTS and not (isinstance(value, (int, np.integer)) and value >= 1):
        raise ConfigError(field, value, "must be an integer >= 1")
    if field in FRACTIONS and not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ConfigError(field, value, "must be a fraction in [0, 1]")
    if field in NON_NEGATIVE and not (isinstance(value, (int, float)) and 0.0 <= value < float("inf")):
        raise ConfigError(field, value, "must be a number >= 0")
    if field == "phase" and value is None:
        return
    if field in CHOICES and value not in CHOICES[field]:
        name = "selection" if field == "selection.source" else field
        raise ConfigError(name, value, f"allowed: {', '.join(map(str, CHOICES[field]))}")


CHECKED_FIELDS = ("page_size", *POSITIVE_INTS, *FRACTIONS, *NON_NEGATIVE, *CHOICES)


def backends_of(cfg) -> list:
    return sorted(BACKENDS) if cfg.backend == "all" else [cfg.backend]


def resolve_phase_alias(cfg) -> None:
    """``phase=X`` (the old key) means ``scenario=X``; giving both with different values is an error."""
    if cfg.phase is None:
        return
    check_value("phase", cfg.phase)
    if cfg.scenario not in ("decode", cfg.phase):
        raise ConfigError("phase", cfg.phase, f"is the old name of scenario (scenario={cfg.scenario} "
                          "was also given); use scenario= alone")
    cfg.scenario = cfg.phase


#: token positions, slot indices and ragged row offsets are int32 in every kernel
INT32_LIMIT = 2 ** 31


def check_representable(cfg) -> None:
    """Sizes every kernel indexes with int32 must stay below 2**31: token positions
    (``context_len`` + the tokens a point adds), the KV pool's slot indices (``batch_size`` x the
    padded positions per request) and, for extend, the ragged buffer's rows."""
    extend = cfg.scenario == "extend"
    longest = (int(cfg.context_len * (1 + cfg.extend.prefix_spread)) + 1 + cfg.extend_len if extend
               else cfg.context_len + cfg.steps)
    added = "extend_len and extend.prefix_spread" if extend else "steps"
    if longest >= INT32_LIMIT:
        raise ConfigError("context_len", cfg.context_len,
                          f"with {added} a request reaches position {longest:,}; token positions "
                          f"are int32, so it must stay below 2**31 = {INT32_LIMIT:,}")
    if cfg.scenario == "capacity":  # its batch comes from the memory budget (capacity.max_batch caps it)
        return
    slots = max(pool_pages(cfg.batch_size, longest, cfg.page_size) * cfg.page_size, SLOT_ALIGN)
    if slots > INT32_LIMIT:  # the last slot's index is slots - 1
        raise ConfigError("batch_size", cfg.batch_size,
                          f"x {longest:,} positions per request gives {slots:,} KV slots; slot indices "
                          f"are int32, so batch_size x context_len must stay within 2**31 = {INT32_LIMIT:,}")
    if extend and cfg.batch_size * longest >= INT32_LIMIT:  # ragged row offsets end at the total
        raise ConfigError("batch_size", cfg.batch_size,
                          f"x {longest:,} positions per request gives {cfg.batch_size * longest:,} ragged "
                          f"rows; row offsets are int32, so batch_size x (context_len x (1 + "
                          f"extend.prefix_spread) + extend_len) must stay below 2**31 = {INT32_LIMIT:,}")


def check_trace_file(cfg) -> None:
    """``selection=trace`` needs ``selection.path``, a readable trace in the format (int32
    arrays, distinct positions per row: ``harness.selection.Trace.check``)."""
    path = cfg.selection.path
    if path is None or str(path).strip() == "":
        raise ConfigError("selection.path", path, "selection=trace replays a recorded trace: give "
                          "selection.path=FILE.npz (record one with selection.record=FILE.npz)")
    try:
        Trace.load(path)
    except TraceError as e:
        raise ConfigError("selection.path", path, f"cannot read a trace there: {e}") from None


def validate_point(cfg) -> Dict[str, ConfigError]:
    """Checks everything the point's backends share and raises ConfigError for the first invalid
    field (after resolving the ``phase`` alias into ``scenario``). Returns, for each backend of
    the point whose own joint checks fail (e.g. ``hisparse.device_buffer_size`` < ``top_k``),
    its ConfigError: inside a sweep those backends get ``status=invalid`` rows and the others
    run."""
    resolve_phase_alias(cfg)
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
    scn = scenario_class(cfg.scenario)
    scn.check(cfg)
    check_representable(cfg)
    if cfg.selection.source == "trace":
        check_trace_file(cfg)
    errors: Dict[str, ConfigError] = {}
    for name in backends_of(cfg):
        cls, settings = backend_settings(cfg, name)
        try:
            cls.check(settings, top_k=cfg.top_k, page_size=cfg.page_size, phase=scn.phase)
        except ConfigError as e:
            errors[name] = e
    return errors


def validate(cfg) -> None:
    """Raises ConfigError for the first invalid field of a resolved run config (shared fields
    first, then each backend's joint checks): what a single run checks before any kernel."""
    errors = validate_point(cfg)
    if errors:
        raise next(iter(errors.values()))
