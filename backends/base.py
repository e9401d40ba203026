"""The adapter interface every backend implements.

Set-up (pools, block tables, pinned host memory, hot buffers) happens in ``__init__`` /
``prefill`` / ``begin_step``, outside the timed region. ``decode_layer`` is the measured part:
it runs the backend's stages for one layer of one decode step through ``timer.run(stage, fn)``
so each stage is timed on its own. Counts that need a device read-back are collected by
``layer_counts`` after the timed region.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Dict, Optional, Tuple

import numpy as np
import torch

from harness.timing import StageTimer
from harness.workload import Workload


class BackendInvalid(Exception):
    """The point cannot run on this backend (recorded as ``status=invalid`` with the reason)."""


class BackendUnavailable(Exception):
    """An optional dependency or hardware feature is missing (``status=unavailable``)."""


class Backend(ABC):
    """One way of serving a DSA top-k selection."""

    name: ClassVar[str]
    stages: ClassVar[Tuple[str, ...]]
    #: takes global slots straight from a fused top-k + PAGED transform (skipping its own)
    accepts_slots: ClassVar[bool] = False

    def __init__(self, workload: Workload, options: Dict[str, object]):
        self.wl = workload
        self.options = options

    def prefill(self) -> None:
        """State after the prompt (before the first decode step). Untimed."""

    def begin_step(self, step: int) -> None:
        """Per-step bookkeeping before the layers run (e.g. placing the new token). Untimed."""

    @abstractmethod
    def decode_layer(self, step: int, layer: int, q: torch.Tensor, positions: Optional[torch.Tensor],
                     seq_lens: torch.Tensor, timer: StageTimer,
                     slots: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Serves one layer: q bf16 [B, H, d_qk], positions int32 [B, top_k] request-local
        (-1 padded), seq_lens int32 [B] (current token included); or, for a backend with
        ``accepts_slots``, ``slots`` int32 [B, top_k] global slots already transformed (then
        ``positions`` is None). Returns (out bf16 [B, H, d_v], lse float32 [B, H])."""

    def layer_counts(self, layer: int) -> Dict[str, np.ndarray]:
        """Per-request int64 [B] counts of the last ``decode_layer`` of ``layer`` (hits, misses,
        tokens_loaded, pages_loaded, bytes_h2d). Read after the timed region."""
        z = np.zeros(self.wl.batch_size, dtype=np.int64)
        return {"tokens_loaded": z, "pages_loaded": z, "bytes_h2d": z}

    def working_set_bytes(self) -> int:
        """GPU bytes this design holds for the simulated layers."""
        raise NotImplementedError

    def host_bytes(self) -> int:
        """Host bytes this design holds (pinned pools, staging)."""
        return 0

    def graph_capturable(self) -> str:
        """'' when ``decode_layer`` can be captured in a CUDA graph, else the reason."""
        return ""

    def row_extras(self) -> Dict[str, object]:
        """Backend-specific result columns (e.g. device_buffer_size)."""
        return {}

    def close(self) -> None:
        """Frees device/host memory."""
