"""GPU clock samples taken right after timed work (NVML), so throttling is noticed, not ignored.

A sample below ``THROTTLE_FRACTION`` of the GPU's maximum SM clock marks the row ``throttled``
(the harness never changes clocks: it measures the card as it finds it). Without NVML (the CPU
path, or no ``pynvml``) every figure is NaN and ``throttled`` is null.
"""
from __future__ import annotations

from typing import List, Optional

import torch

#: NVBench's default threshold: a sample under 75 % of the maximum clock counts as throttled
THROTTLE_FRACTION = 0.75


class ClockMonitor:
    def __init__(self, device: torch.device):
        self.samples: List[float] = []
        self.max_mhz: Optional[float] = None
        self._nvml = self._handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.max_mhz = float(pynvml.nvmlDeviceGetMaxClockInfo(self._handle, pynvml.NVML_CLOCK_SM))
            self._nvml = pynvml
        except Exception:  # noqa: BLE001  (no NVML: clocks are simply not recorded)
            self._nvml = None

    def sample(self) -> None:
        """Records the current SM clock (call right after a timed sample)."""
        if self._nvml is None:
            return
        try:
            self.samples.append(float(self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM)))
        except Exception:  # noqa: BLE001
            pass

    def columns(self) -> dict:
        if not self.samples or not self.max_mhz:
            return {"sm_clock_mhz_min": float("nan"), "sm_clock_mhz_max": float("nan"), "throttled": None}
        lo = min(self.samples)
        return {"sm_clock_mhz_min": lo, "sm_clock_mhz_max": max(self.samples),
                "throttled": bool(lo < THROTTLE_FRACTION * self.max_mhz)}
