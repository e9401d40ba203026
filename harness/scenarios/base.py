"""What a scenario supplies to the one point loop (``harness.runner``).

A scenario (``scenario=decode|extend|capacity``, a Hydra group) owns the workload of a point, the
per-step inputs, how one layer step is driven through a backend, and the reference every layer
step is checked against. It has no loop of its own: ``harness.runner.run_point`` calls, per
backend,

    for each run (runs: one per backend, or several at different batches):
        open_backend -> prefill -> for each step: begin_step -> for each layer:
            layer_inputs (untimed) -> run_layer (timed, stage by stage) -> check_layer (untimed)
        -> final_check -> backend_columns -> close_backend -> derived_columns

and summarises every backend's samples the same way.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Type

import numpy as np
import torch


@dataclass
class LayerResult:
    """What the untimed check of one layer step found.

    Attributes:
        positions: int32 ``[rows, top_k]`` the request-local positions served (-1 = none).
        seq_lens: int64 ``[rows]`` tokens each query row sees (its ``seq_len`` column).
        max_rel_err, max_lse_err: the output's errors against the reference.
    """

    positions: np.ndarray
    seq_lens: np.ndarray
    max_rel_err: float
    max_lse_err: float


@dataclass
class LayerInputs:
    """The untimed inputs of one layer step; tensor fields are what a CUDA graph captures as
    static inputs (``harness.runner.LayerGraphs`` copies them in before each replay)."""

    step: int
    layer: int
    tensors: Dict[str, Optional[torch.Tensor]] = field(default_factory=dict)
    #: untimed values the check needs besides the tensors (e.g. unpadded index queries)
    extra: Dict[str, Any] = field(default_factory=dict)


class Scenario(ABC):
    """One kind of point: its workload, its step inputs and its reference."""

    name: ClassVar[str]
    #: the phase of the layer step it drives (a backend must list it in ``phases``)
    phase: ClassVar[str] = "decode"
    #: settings dataclass composed under the config node ``<name>`` (e.g. ``extend.*``), or None
    settings: ClassVar[Optional[Type]] = None
    #: settings field -> allowed values
    choices: ClassVar[Dict[str, Tuple]] = {}
    #: result columns this scenario adds -> pandas dtype
    columns: ClassVar[Dict[str, str]] = {}
    #: timed stages this scenario adds to a backend's layer step
    stages: ClassVar[Tuple[str, ...]] = ()

    def __init__(self, cfg, model, device: torch.device):
        self.cfg, self.model, self.device = cfg, model, device

    @classmethod
    def check(cls, cfg) -> None:
        """Scenario-specific validation of a resolved config (raise ConfigError)."""

    @classmethod
    def graphs_supported(cls) -> str:
        """'' when ``timing.cuda_graph`` can replay this scenario's layer steps, else why not."""
        return ""

    # ---- the point ------------------------------------------------------------------------

    @abstractmethod
    def prepare(self) -> Optional[str]:
        """Builds what every backend of the point shares (untimed). Returns the reason when the
        point does not fit in memory (every backend then records ``status=oom``), else None."""

    def base_columns(self) -> Dict[str, object]:
        """Columns every row of the point carries that the scenario decides (phase, pattern...)."""
        return {"phase": self.phase, "scenario": self.name}

    def record_shape(self) -> Tuple[int, int]:
        """``(rows, top_k)`` of one layer's served selection in the record."""
        return self.rows, self.cfg.top_k

    # ---- one backend ----------------------------------------------------------------------

    def runs(self, names) -> List[Tuple[str, Dict[str, object]]]:
        """``(backend name, run)`` of every run of the point: one per backend by default. A run
        holding ``status`` and ``error`` is recorded as such without building anything; its
        other keys are row columns."""
        return [(n, {}) for n in names]

    @abstractmethod
    def open_backend(self, cls, settings, run: Dict[str, object]):
        """Builds the backend for ``run`` (raises BackendInvalid / BackendUnavailable / MemoryError)."""

    def close_backend(self, be) -> None:
        be.close()

    @property
    @abstractmethod
    def steps(self) -> int: ...

    @property
    @abstractmethod
    def num_layers(self) -> int: ...

    @property
    @abstractmethod
    def rows(self) -> int:
        """Query rows of one layer step (decode: the batch; extend: every new token)."""

    @property
    @abstractmethod
    def attention_row_bytes(self) -> int:
        """Bytes attention reads per selected KV row."""

    def begin_step(self, be, step: int) -> None:
        """Untimed per-step bookkeeping before the layers run."""
        be.begin_step(step)

    @abstractmethod
    def layer_inputs(self, be, step: int, layer: int) -> LayerInputs:
        """The untimed inputs of one layer step."""

    @abstractmethod
    def run_layer(self, be, x: LayerInputs, timer) -> Tuple[torch.Tensor, torch.Tensor]:
        """The measured layer step: every stage through ``timer.run``. Returns (out, lse)."""

    def stage_times(self, t: Dict[str, float]) -> Dict[str, float]:
        """Derived stage times (e.g. ``select`` = indexer + topk) added to a sample."""
        return t

    @abstractmethod
    def check_layer(self, be, x: LayerInputs, out: torch.Tensor, lse: torch.Tensor) -> LayerResult:
        """Checks the layer step against the reference (untimed)."""

    def final_check(self, be) -> Optional[Tuple[float, float]]:
        """Checks deferred to after the timed steps: ``(max_rel_err, max_lse_err)``, or None when
        ``check_layer`` checked every layer step itself."""
        return None

    def check_error(self) -> Optional[str]:
        """Why the run's checks failed besides the output's error (wrong selections, memory
        beyond the budget...), or None."""
        return None

    def derived_columns(self, row: Dict[str, object]) -> Dict[str, object]:
        """Columns computed from the summarised row (e.g. time per output token)."""
        return {}

    def backend_columns(self, be) -> Dict[str, object]:
        """Row values known after the backend ran (memory, per-step plan times...)."""
        return {"working_set_bytes": be.working_set_bytes(), "host_bytes": be.host_bytes()}

    def selections(self) -> Optional[np.ndarray]:
        """The seq_lens ``int32 [steps, rows]`` a recorded trace stores beside the selection."""
        return None


def settings_values(node) -> Dict[str, object]:
    """A config node (OmegaConf or dataclass) as a plain dict."""
    if is_dataclass(node):
        return {f.name: getattr(node, f.name) for f in fields(node)}
    from omegaconf import OmegaConf
    return OmegaConf.to_container(node, resolve=True)
