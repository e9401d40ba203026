"""The adapter interface every backend implements, and what each backend declares about itself.

A serving design lives in one module under ``backends/``: its settings dataclass (``settings``,
composed by Hydra under the design's own config group, e.g. ``hisparse.*``), the values those
settings may take (``choices``), the timed stages of its layer step (``stages``), its result
columns (``columns``) and the columns that make report variants of it (``variant_axes``). The
harness reads these declarations for validation, result schema and report: adding a backend is
one module plus one line in ``backends/__init__.py``.

Set-up (pools, block tables, pinned host memory, hot buffers) happens in ``__init__`` /
``prefill`` / ``begin_step``, outside the timed region. ``decode_layer`` (and ``extend_layer``
for a design that serves the extend phase) is the measured part: it runs the backend's stages
for one layer through ``timer.run(stage, fn)`` so each stage is timed on its own. Counts that
need a device read-back are collected by ``layer_counts`` after the timed region.

Nothing here imports the harness: a workload is any object with the attributes the backends
read (``harness.scenarios`` builds them), a timer any object with ``run(stage, fn)``.
"""
from __future__ import annotations

import dataclasses
from abc import ABC
from typing import Any, ClassVar, Dict, Optional, Protocol, Tuple

import numpy as np
import torch


class BackendInvalid(Exception):
    """The point cannot run on this backend (recorded as ``status=invalid`` with the reason)."""


class BackendUnavailable(Exception):
    """An optional dependency or hardware feature is missing (``status=unavailable``)."""


class ConfigError(ValueError):
    """An invalid configuration value: names the field, the value and what is allowed."""

    def __init__(self, field: str, value, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"invalid configuration: {field}={value!r}: {allowed}")


class StageRunner(Protocol):
    """What a backend needs of a timer: runs ``fn`` as the stage ``stage`` and returns its result."""

    def run(self, stage: str, fn) -> Any: ...


#: per query row counts a backend may report for each layer step (``Backend.layer_counts``)
COUNT_KEYS = ("hits", "misses", "resident_hits", "tokens_loaded", "pages_loaded", "bytes_h2d")
#: the phases a layer step can belong to (``decode_layer`` / ``extend_layer``)
PHASES = ("decode", "extend")
#: paged pools hold a multiple of this many rows (FlashMLA's kernels view a pool in 64-row blocks)
SLOT_ALIGN = 64


def pool_pages(batch_size: int, max_positions: int, page_size: int) -> int:
    """Pages of a paged pool holding ``batch_size`` requests of ``max_positions`` tokens: the block
    tables' pages, rounded up to a multiple of ``SLOT_ALIGN`` rows; extra pages stay unused."""
    used = batch_size * -(-max_positions // page_size)
    if page_size >= SLOT_ALIGN:
        return used
    per = SLOT_ALIGN // page_size
    return -(-used // per) * per


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """The sizes a design's memory footprint depends on (``Backend.capacity_bytes``).

    Attributes: ``num_layers`` simulated layers; ``max_positions`` tokens a request reaches;
    ``page_size`` tokens per page; ``row_bytes`` bytes of one token's KV row per layer;
    ``top_k`` selection width."""

    num_layers: int
    max_positions: int
    page_size: int
    row_bytes: int
    top_k: int

    @property
    def pages_per_request(self) -> int:
        return -(-self.max_positions // self.page_size)

    def pool_bytes(self, batch_size: int) -> int:
        """Bytes of the paged KV pools of every simulated layer for ``batch_size`` requests."""
        return self.num_layers * pool_pages(batch_size, self.max_positions, self.page_size) \
            * self.page_size * self.row_bytes


class Backend(ABC):
    """One way of serving a DSA top-k selection."""

    name: ClassVar[str]
    #: settings dataclass (Hydra group ``<name>``); None: the design has no settings
    settings: ClassVar[Optional[type]] = None
    #: settings field -> allowed values (validated before any kernel runs)
    choices: ClassVar[Dict[str, Tuple]] = {}
    #: timed stages of the decode layer step, in order (each has a ``stage_<s>_us`` column)
    stages: ClassVar[Tuple[str, ...]] = ()
    #: timed stages of the extend layer step (designs that serve ``phases`` "extend")
    extend_stages: ClassVar[Tuple[str, ...]] = ()
    #: phases this design serves; others give a row ``status=invalid`` with ``unsupported(phase)``
    phases: ClassVar[Tuple[str, ...]] = ("decode",)
    #: extra result columns -> pandas dtype (values: ``settings_columns`` and ``row_extras``)
    columns: ClassVar[Dict[str, str]] = {}
    #: columns whose values make report variants of this backend (e.g. ``device_buffer_size``)
    variant_axes: ClassVar[Tuple[str, ...]] = ()
    #: takes global slots straight from a fused top-k + PAGED transform (skipping its own)
    accepts_slots: ClassVar[bool] = False

    def __init__(self, workload, settings=None, *, attention_kernel: str = "triton"):
        self.wl = workload
        self.cfg = settings
        self.attention_kernel = attention_kernel

    # ---- declarations read before a backend is built --------------------------------------

    @classmethod
    def make_settings(cls, values: Dict[str, object], top_k: int):
        """The settings dataclass from the config node's ``values`` with defaults resolved for
        ``top_k`` (e.g. a buffer size that follows top_k); None without settings."""
        if cls.settings is None:
            return None
        s = cls.settings(**values)
        return s.resolved(top_k) if hasattr(s, "resolved") else s

    @classmethod
    def check(cls, settings, *, top_k: int, page_size: int, phase: str) -> None:
        """Joint checks of ``settings`` with the point (raise ConfigError). Single values are
        checked against ``choices`` by the harness."""

    @classmethod
    def settings_columns(cls, settings) -> Dict[str, object]:
        """Result-column values of ``settings`` (recorded on every row, also failed ones)."""
        if settings is None:
            return {}
        return {k: v for k, v in dataclasses.asdict(settings).items() if k in cls.columns}

    @classmethod
    def unsupported(cls, phase: str) -> str:
        """Why this design has no ``phase`` step (the reason of its ``invalid`` row)."""
        return f"backend {cls.name} has no {phase} path"

    @classmethod
    def host_bytes_needed(cls, workload, settings) -> int:
        """Host bytes the design will pin for ``workload`` (checked before it is built)."""
        try:
            return cls.capacity_bytes(workload.layout, settings, workload.batch_size)[1]
        except NotImplementedError:
            return 0

    #: keeps the KV it serves from in device memory (else the workload needs no device KV pool)
    device_kv: ClassVar[bool] = True

    @classmethod
    def fit_to_budget(cls, layout: KVLayout, settings, batch_size: int, device_budget: int):
        """Settings adapted to ``device_budget`` bytes at ``batch_size`` (a design whose residency
        follows the memory left); a design with a fixed footprint returns them unchanged."""
        return settings

    @classmethod
    def capacity_bytes(cls, layout: KVLayout, settings, batch_size: int) -> Tuple[int, int]:
        """``(device bytes, host bytes)`` the design allocates for its KV-related buffers (pools,
        hot buffers, its own tables) at ``batch_size`` requests: the allocations it makes, so a
        memory budget can be turned into a maximum batch before anything is allocated."""
        raise NotImplementedError(f"{cls.name} declares no capacity footprint")

    # ---- the run --------------------------------------------------------------------------

    def prefill(self) -> None:
        """State after the prompt (before the first decode step). Untimed."""

    def begin_step(self, step: int) -> None:
        """Per-step bookkeeping before the layers run (e.g. placing the new token). Untimed."""

    def decode_layer(self, step: int, layer: int, q: torch.Tensor, positions: Optional[torch.Tensor],
                     seq_lens: torch.Tensor, timer: StageRunner,
                     slots: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Serves one layer: q bf16 [B, H, d_qk], positions int32 [B, top_k] request-local
        (-1 padded), seq_lens int32 [B] (current token included); or, for a backend with
        ``accepts_slots``, ``slots`` int32 [B, top_k] global slots already transformed (then
        ``positions`` is None). Returns (out bf16 [B, H, d_v], lse float32 [B, H])."""
        raise NotImplementedError(f"{self.name} has no decode step")

    def layer_counts(self, layer: int) -> Dict[str, np.ndarray]:
        """Per query row int64 [rows] counts of the last layer step of ``layer`` (hits, misses,
        tokens_loaded, pages_loaded, bytes_h2d). Read after the timed region. Default: a design
        that loads nothing from host (no hits or misses)."""
        z = np.zeros(self.wl.num_rows, dtype=np.int64)
        return {"tokens_loaded": z, "pages_loaded": z, "bytes_h2d": z}

    def working_set_bytes(self) -> int:
        """GPU bytes this design holds for the simulated layers."""
        raise NotImplementedError

    def host_bytes(self) -> int:
        """Host bytes this design holds (pinned pools, staging)."""
        return 0

    def graph_capture_blocker(self) -> str:
        """Why a layer step cannot be captured in a CUDA graph; '' when it can."""
        return ""

    def row_extras(self) -> Dict[str, object]:
        """Result-column values known once the backend is built (default: its settings)."""
        return self.settings_columns(self.cfg)

    def close(self) -> None:
        """Frees device/host memory."""
