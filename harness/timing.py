"""Timing primitives: CUDA-event stage timing with a cold L2, and wall-clock on the CPU.

Every figure the harness reports comes from here. On the GPU each timed call is bracketed by
CUDA events; by default the L2 cache is flushed (a write over a buffer twice its size) before
the call and outside the events, so a figure is a cold-cache figure (NVBench's "cold" mode).
On the CPU the clock is ``time.perf_counter`` and the figures are not performance figures.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from backends.host_memory import HostRows
from backends.kernels.host_copy import touch_pages_kernel


@dataclass(frozen=True)
class TimingStats:
    """Summary of a list of samples, in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    n: int

    @staticmethod
    def of(samples_us: Sequence[float]) -> "TimingStats":
        a = np.asarray([s for s in samples_us if s == s], dtype=np.float64)
        if a.size == 0:
            return TimingStats(float("nan"), float("nan"), float("nan"), 0)
        return TimingStats(float(np.median(a)), float(np.percentile(a, 10)),
                           float(np.percentile(a, 90)), int(a.size))


def is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


class L2Flusher:
    """Evicts the GPU's L2 by writing a buffer of twice its size (no-op on the CPU)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.buf: Optional[torch.Tensor] = None
        if is_cuda(self.device):
            props = torch.cuda.get_device_properties(self.device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0) or (64 << 20)
            self.buf = torch.empty(2 * l2 // 4, dtype=torch.int32, device=self.device)

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf.random_(0, 1 << 30)


class HostTranslationFlusher:
    """Evicts the GPU's cached translations of host addresses (its TLBs for system memory and,
    under a hypervisor, the IOMMU's) by reading one word of every 4 KiB page of a page-locked
    host buffer of ``nbytes`` (``touch_pages_kernel``); no-op on the CPU. The host KV of a
    served model spans every layer's pool, far beyond what those caches reach, so each layer's
    swap-in translates its rows afresh; a one-layer benchmark whose pool fits the reach does
    not, unless this runs before each timed call (BENCHMARKS 6v). The buffer is filled with
    random words once; ``last_sum`` is the sum of the words read by the last call."""

    PAGE_BYTES = 4096
    BLOCK = 1024

    def __init__(self, device: torch.device | str, nbytes: int = 4 << 30):
        self.device = torch.device(device)
        self.n_pages = max(1, int(nbytes) // self.PAGE_BYTES)
        self.host = self.sums = None
        if is_cuda(self.device):
            self.host = HostRows((self.n_pages * self.PAGE_BYTES,), "registered")
            g = torch.Generator().manual_seed(0)
            words = self.host.tensor.view(torch.int32).view(self.n_pages, -1)
            words[:, 0] = torch.randint(-(1 << 20), 1 << 20, (self.n_pages,), generator=g,
                                        dtype=torch.int32)
            self.sums = torch.empty(-(-self.n_pages // self.BLOCK), dtype=torch.int32,
                                    device=self.device)

    def __call__(self) -> None:
        if self.host is None:
            return
        with torch.cuda.device(self.device):
            touch_pages_kernel[(self.sums.numel(),)](
                self.host.tensor.view(torch.int32), self.n_pages, self.sums,
                PAGE_WORDS=self.PAGE_BYTES // 4, BLOCK=self.BLOCK, num_warps=8)

    @staticmethod
    @lru_cache(maxsize=None)
    def shared(device: str) -> "HostTranslationFlusher":
        """One 4 GiB flusher per device and process (its buffer is registered once)."""
        return HostTranslationFlusher(device)

    @property
    def last_sum(self) -> int:
        return int(self.sums.sum()) if self.sums is not None else 0


#: GPU cycles per microsecond assumed when sizing the launch shield (H200 boost ~1.98 GHz)
CYCLES_PER_US = 2000


class WallClock:
    """Host wall time of the phases of a backend's run, in seconds: ``lap(name)`` adds the time
    since the previous lap (or since construction) to ``laps[name]`` (a name given again, e.g.
    once per step, accumulates). On the GPU a lap first waits for the device, so work enqueued
    in a phase is counted in it."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = is_cuda(device)
        self.laps: Dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + now - self._last
        self._last = now


class StageTimer:
    """Times the stages of one decode layer step.

    A backend calls ``timer.run(stage_name, fn)`` for each stage, in order; ``begin()`` evicts
    the GPU's host-address translations (``host_flush``, when given), flushes the L2 (when
    ``cold_l2``) and opens the step, ``end()`` closes it and returns the
    per-stage and total times in microseconds. On the GPU each stage is bracketed by CUDA
    events and the total spans the first stage's start to the last stage's end.

    Launch shield (NVBench's "blocking kernel"): ``begin()`` enqueues a GPU spin of
    ``launch_shield_us`` before the first event, so the host enqueues every stage while the GPU
    is still busy and the events measure GPU execution, not Python/Triton launch overhead
    (which CUDA graphs hide in a serving engine). ``end()`` also reports ``launch_gap`` (us the
    GPU sat idle between the shield and the first stage: ~0 when the shield was long enough;
    a host sync inside a stage, e.g. a copy engine that reads the miss list on the host, still
    shows up in that stage's time as it should). Reading the events synchronises, in ``end()``.
    """

    def __init__(self, device: torch.device | str, cold_l2: bool = True,
                 launch_shield_us: float = 1000.0,
                 host_flush: Optional[HostTranslationFlusher] = None):
        self.device = torch.device(device)
        self.cuda = is_cuda(self.device)
        self.cold_l2 = cold_l2
        self.flush = L2Flusher(self.device) if (self.cuda and cold_l2) else None
        self.host_flush = host_flush
        self.shield_cycles = int(launch_shield_us * CYCLES_PER_US)
        self._marks: List[tuple] = []
        self._shield_end = None

    def begin(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        if self.host_flush is not None:
            self.host_flush()
        if self.flush is not None:
            self.flush()
        self._marks = []
        self._shield_end = None
        if self.cuda and self.shield_cycles > 0:
            torch.cuda._sleep(self.shield_cycles)
            self._shield_end = torch.cuda.Event(enable_timing=True)
            self._shield_end.record()

    def run(self, stage: str, fn: Callable[[], object]) -> object:
        if self.cuda:
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn()
            b.record()
        else:
            a = time.perf_counter()
            out = fn()
            b = time.perf_counter()
        self._marks.append((stage, a, b))
        return out

    def end(self) -> Dict[str, float]:
        """Returns ``{stage: us, ..., "total": us}``; repeated stage names are summed."""
        if not self._marks:
            return {"total": 0.0}
        if self.cuda:
            self._marks[-1][2].synchronize()
            el = lambda a, b: a.elapsed_time(b) * 1e3  # noqa: E731  (ms -> us)
        else:
            el = lambda a, b: (b - a) * 1e6  # noqa: E731
        out: Dict[str, float] = {}
        for stage, a, b in self._marks:
            out[stage] = out.get(stage, 0.0) + el(a, b)
        out["total"] = el(self._marks[0][1], self._marks[-1][2])
        if self._shield_end is not None:
            out["launch_gap"] = el(self._shield_end, self._marks[0][1])
        return out


def capture_graph(fn: Callable[[], object]):
    """Warms ``fn`` up on a side stream, then captures one call in a CUDA graph.

    Returns ``(graph, outputs)``: ``graph.replay()`` re-runs the call, writing into ``outputs``
    (the tensors the captured call returned). ``fn`` runs once during the warm-up, so it must not
    mutate state that later calls depend on.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


class UntimedStages:
    """A ``StageTimer`` stand-in that just runs each stage (used while capturing a CUDA graph,
    where events cannot bracket the stages)."""

    def run(self, stage: str, fn: Callable[[], object]) -> object:
        return fn()


def time_fn(fn: Callable[[], object], device: torch.device | str, *, warmup: int = 3,
            repeats: int = 20, cold_l2: bool = True,
            setup: Optional[Callable[[], object]] = None,
            launch_shield_us: float = 1000.0,
            host_flush: Optional[HostTranslationFlusher] = None) -> TimingStats:
    """Times ``fn`` ``repeats`` times after ``warmup`` calls; ``setup`` (untimed) runs before each.

    GPU: CUDA events around each call, the host-address translations evicted before each call
    when ``host_flush`` is given, L2 flushed before each call when ``cold_l2``, launch
    overhead hidden behind a GPU spin (see ``StageTimer``; 0 disables it). CPU: wall-clock.
    Returns median / p10 / p90 in microseconds.
    """
    timer = StageTimer(device, cold_l2=cold_l2, launch_shield_us=launch_shield_us,
                       host_flush=host_flush)
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    samples = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        timer.begin()
        timer.run("call", fn)
        samples.append(timer.end()["total"])
    return TimingStats.of(samples)
