"""The machine's ceilings, measured once per process and carried by every result row.

* ``hbm_gbps``: device-to-device copy of 1 GiB, counting bytes read + written (GB/s).
* ``h2d_gbps``: pinned host -> device copy of 256 MiB through the copy engine (GB/s).
* ``bf16_tflops``: 8192^3 bf16 matrix product on random data (TFLOP/s).

Each is the median of several CUDA-event-timed calls. On the CPU all three are NaN: CPU runs
are correctness runs, not performance figures.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict

import torch

from harness.timing import time_fn


@dataclass(frozen=True)
class Ceilings:
    hbm_gbps: float
    h2d_gbps: float
    bf16_tflops: float

    def as_columns(self) -> Dict[str, float]:
        return {f"ceiling_{k}": v for k, v in asdict(self).items()}


_MEASURED: Dict[str, Ceilings] = {}


def measure(device: torch.device | str) -> Ceilings:
    """Measures (once per process and device) and returns the ceilings of ``device``."""
    device = torch.device(device)
    key = str(device)
    if key in _MEASURED:
        return _MEASURED[key]
    nan = float("nan")
    if device.type != "cuda":
        c = Ceilings(nan, nan, nan)
    else:
        n = 1 << 30
        src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        t = time_fn(lambda: dst.copy_(src), device, warmup=3, repeats=10, cold_l2=False)
        hbm = 2 * n / (t.median_us * 1e-6) / 1e9
        del src, dst
        m = 256 << 20
        host = torch.randint(0, 255, (m,), dtype=torch.uint8).pin_memory()
        dev = torch.empty(m, dtype=torch.uint8, device=device)
        t = time_fn(lambda: dev.copy_(host, non_blocking=True), device, warmup=2, repeats=10, cold_l2=False)
        h2d = m / (t.median_us * 1e-6) / 1e9
        del host, dev
        s = 8192
        a = torch.randn(s, s, device=device, dtype=torch.bfloat16)
        b = torch.randn(s, s, device=device, dtype=torch.bfloat16)
        t = time_fn(lambda: a @ b, device, warmup=3, repeats=10, cold_l2=False)
        mm = 2 * s ** 3 / (t.median_us * 1e-6) / 1e12
        del a, b
        torch.cuda.empty_cache()
        c = Ceilings(hbm, h2d, mm)
    _MEASURED[key] = c
    return c
