"""Throttling is flagged from clock samples; without NVML nothing is claimed."""
import math

import torch

from harness.clocks import ClockMonitor


def test_no_nvml_on_cpu_gives_no_claim():
    c = ClockMonitor(torch.device("cpu"))
    c.sample()
    cols = c.columns()
    assert math.isnan(cols["sm_clock_mhz_min"]) and cols["throttled"] is None


def test_throttle_threshold():
    c = ClockMonitor(torch.device("cpu"))
    c.max_mhz = 1980.0
    c.samples = [1980.0, 1965.0]
    assert c.columns()["throttled"] is False
    c.samples.append(1400.0)  # < 75 % of 1980
    cols = c.columns()
    assert cols["throttled"] is True and cols["sm_clock_mhz_min"] == 1400.0 and cols["sm_clock_mhz_max"] == 1980.0
