"""Memory available to a point before anything is allocated (so a point that cannot fit is
recorded as ``status=oom`` instead of failing mid-way or swapping the machine)."""
from __future__ import annotations

from typing import Optional

import torch


def meminfo_bytes(field: str) -> Optional[int]:
    """A ``/proc/meminfo`` field of this Linux host (e.g. ``MemTotal``) in bytes; None where it
    cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def host_available_bytes() -> int:
    """MemAvailable of this Linux host (bytes); a very large number where it cannot be read."""
    avail = meminfo_bytes("MemAvailable")
    return 1 << 62 if avail is None else avail


def free_bytes(device: torch.device) -> int:
    """Free bytes where ``device``'s tensors live: GPU memory, or host memory for the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return host_available_bytes()


def fits(need_bytes: int, device: torch.device, headroom: float = 0.9) -> bool:
    """Whether ``need_bytes`` fit in ``headroom`` of the free memory of ``device``."""
    return need_bytes <= headroom * free_bytes(device)
