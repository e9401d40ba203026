"""One run of one bench: the timer of every bench, and its rows in the sweep's schema.

``BenchRun.measure(fn, check=..., setup=..., graph=..., **columns)`` makes one result row:

1. set-up, untimed: ``setup()`` (when given), one call of ``fn`` (with ``graph``: a CUDA graph
   captured from ``fn`` and replayed once) and ``check(output)``, a ``Check`` of that output
   against the bench's reference;
2. timing, ``harness.timing.time_fn``: ``warmup`` calls, then ``repeats`` calls each bracketed
   by CUDA events with the L2 flushed before it and the host's launches queued behind a GPU
   spin (wall-clock on the CPU); ``setup`` runs before each call, outside the events ->
   ``latency_us_median`` / ``_p10`` / ``_p90`` (microseconds per call), ``n_samples``;
3. ``status``: ``ok``; ``incorrect`` (the check failed: ``error`` says how; the timing is kept);
   ``unavailable`` / ``invalid`` (a peer raised ``PeerUnavailable`` / ``PeerUnsupported``);
   ``error`` (any other exception, e.g. a launch variant that does not compile; traceback
   printed).

Counts given by a bench are per call (``bytes_hbm_read``, ``bytes_h2d``, ``flops``, ``hits``,
``misses``, ...); the rates follow from them and the median (``hbm_gbps``, ``h2d_gbps``,
``tflops``, ``hit_rate``). Every row also carries the bench's name, the device, the machine's
ceilings (``harness.ceilings``), provenance (``harness.env``), ``repro_command`` and
``timestamp``.
"""
from __future__ import annotations

import argparse
import math
import traceback
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported
from harness import ceilings, env, results
from harness.timing import HostTranslationFlusher, capture_graph, time_fn

NAN = float("nan")


@dataclass(frozen=True)
class Check:
    """A kernel's output against its reference.

    ``max_rel_err``: the bench's error measure (its docstring says which; a fraction of wrong
    entries for exact outputs) and ``tolerance`` its bound; ``max_lse_err`` / ``lse_tolerance``:
    max |lse - lse_ref| of attention and its bound (NaN: not checked); ``mismatch``: a failed
    exact check (counts, slots, sets), in words ('' when none).
    """

    max_rel_err: float
    tolerance: float
    max_lse_err: float = NAN
    lse_tolerance: float = NAN
    mismatch: str = ""

    def failure(self) -> str:
        """'' when the output passes, else what failed."""
        if self.mismatch:
            return self.mismatch
        if not self.max_rel_err <= self.tolerance:            # NaN fails too
            return f"max_rel_err {self.max_rel_err:.3g} > tolerance {self.tolerance:.3g}"
        if not math.isnan(self.lse_tolerance) and not self.max_lse_err <= self.lse_tolerance:
            return f"max_lse_err {self.max_lse_err:.3g} > {self.lse_tolerance:.3g}"
        return ""


def exact(wrong_fraction: float, mismatch: str = "") -> Check:
    """A check of an exact output: ``wrong_fraction`` of its entries differ (tolerance 0)."""
    return Check(float(wrong_fraction), 0.0, mismatch=mismatch)


def label(row: Dict) -> str:
    """``kernel [variant]`` of a row (what ``peer`` names)."""
    return " ".join(str(row[c]) for c in ("kernel", "variant") if row.get(c))


class BenchRun:
    """One bench's run: its options (``args``), the device, sizes (``quick``) and its rows.

    ``args`` holds the common options resolved (``quick``, ``repeats``, ``warmup``) and the
    bench's own. ``shared`` columns go into every row.
    """

    def __init__(self, bench: str, args: argparse.Namespace, device: torch.device,
                 repro_command: str):
        self.bench = bench
        self.args = args
        self.device = device
        self.quick: bool = args.quick
        self.warmup: int = args.warmup
        self.repeats: int = args.repeats
        self.rows: List[Dict] = []
        self.shared: Dict[str, object] = {
            "schema_version": results.SCHEMA_VERSION, "bench": bench, "device": device.type,
            "cold_l2": True, "repro_command": repro_command, "timestamp": env.timestamp(),
            **ceilings.measure(device).as_columns(), **env.provenance(str(device))}

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def graph_modes(self, enabled: bool = True) -> Tuple[bool, ...]:
        """``cuda_graph`` values to measure: the Python call, and a CUDA-graph replay of it
        where there is a GPU and ``enabled``."""
        return (False, True) if (self.cuda and enabled) else (False,)

    def measure(self, fn: Callable[[], object], *, check: Optional[Callable[[object], Check]],
                setup: Optional[Callable[[], object]] = None, graph: bool = False,
                host_flush: Optional[HostTranslationFlusher] = None, **columns) -> Dict:
        """Times ``fn`` (module doc) and appends its row; returns the row.

        ``check=None`` only for a reference (``torch.topk``) or a plan whose result the next
        row's check covers: the row is then ``ok`` without error columns. ``graph``: time a CUDA
        graph replay of ``fn`` (GPU only; no ``setup``: a graph replays fixed inputs).
        ``host_flush``: evict the GPU's host-address translations before each timed call
        (column ``cold_host_translations``).
        """
        row = self._row(columns, cuda_graph=graph)
        row["cold_host_translations"] = host_flush is not None
        if graph and (setup is not None or not self.cuda):
            raise ValueError("graph timing needs CUDA and takes no per-call setup")
        try:
            if graph:
                cuda_graph, out = capture_graph(fn)
                cuda_graph.replay()
                torch.cuda.synchronize(self.device)
                timed = cuda_graph.replay
            else:
                if setup is not None:
                    setup()
                out, timed = fn(), fn
            failure = ""
            if check is not None:
                verdict = check(out)
                failure = verdict.failure()
                row.update(max_rel_err=verdict.max_rel_err, tolerance=verdict.tolerance,
                           max_lse_err=verdict.max_lse_err)
            stats = time_fn(timed, self.device, warmup=self.warmup, repeats=self.repeats,
                            setup=setup, host_flush=host_flush)
            row.update(latency_us_median=stats.median_us, latency_us_p10=stats.p10_us,
                       latency_us_p90=stats.p90_us, n_samples=stats.n,
                       status="incorrect" if failure else "ok", error=failure or None)
            row.update(_rates(row))
        except PeerUnavailable as e:
            row.update(status="unavailable", error=str(e))
        except PeerUnsupported as e:
            row.update(status="invalid", error=str(e))
        except Exception as e:  # one failing case must not hide the others' numbers
            traceback.print_exc()
            row.update(status="error", error=f"{type(e).__name__}: {e}")
        finally:
            if self.cuda:
                torch.cuda.synchronize(self.device)
        return self._add(row)

    def skip(self, status: str, error: str, **columns) -> Dict:
        """Appends a row that could not be measured (``unavailable`` / ``invalid``)."""
        if status not in ("unavailable", "invalid"):
            raise ValueError(f"skip status must be unavailable or invalid, got {status!r}")
        row = self._row(columns, cuda_graph=False)
        row.update(status=status, error=error)
        return self._add(row)

    @staticmethod
    def compare(row: Dict, peer: Dict) -> None:
        """Marks ``row`` as compared with ``peer`` (another row): ``peer`` names it,
        ``ratio_to_peer`` = row median / peer median (NaN unless both are ``ok``)."""
        row["peer"] = label(peer)
        ok = row["status"] == peer["status"] == "ok"
        row["ratio_to_peer"] = (row["latency_us_median"] / peer["latency_us_median"]
                                if ok else NAN)

    def _row(self, columns: Dict, cuda_graph: bool) -> Dict:
        unknown = sorted(set(columns) - set(results.COLUMNS))
        if unknown:
            raise ValueError(f"bench {self.bench}: unknown result columns {unknown} "
                             "(harness.results.COLUMNS)")
        return {**self.shared, "cuda_graph": cuda_graph, **columns}

    def _add(self, row: Dict) -> Dict:
        self.rows.append(row)
        lat = row.get("latency_us_median")
        timing = f"{lat:.1f} us" if lat is not None else ""
        print(f"[{self.bench}] {label(row)} {row.get('case') or ''} "
              f"{'graph ' if row['cuda_graph'] else ''}{row['status']} {timing} "
              f"{row.get('error') or ''}".rstrip(), flush=True)
        return row


def _rates(row: Dict) -> Dict[str, float]:
    """Rates from the per-call counts the row has and its median latency; the hit rate."""
    sec = row["latency_us_median"] * 1e-6
    out: Dict[str, float] = {}
    for rate, count, unit in (("hbm_gbps", "bytes_hbm_read", 1e9), ("h2d_gbps", "bytes_h2d", 1e9),
                              ("tflops", "flops", 1e12)):
        if row.get(count) is not None:
            out[rate] = row[count] / sec / unit if sec > 0 else NAN
    if row.get("hits") is not None and row.get("misses") is not None:
        total = row["hits"] + row["misses"]
        out["hit_rate"] = row["hits"] / total if total else NAN
    return out
