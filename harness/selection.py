"""Synthetic top-k selections and trace record/replay.

A selection is ``topk [steps, layers, batch, top_k] int32`` of request-local token positions
(0 <= p < seq_len), -1 where a request has fewer than ``top_k`` tokens, with the per-step
sequence lengths ``seq_lens [steps, batch] int32`` (the current token included). Everything is
deterministic from the seed: each (layer, request) has its own random stream that evolves
across decode steps.

Patterns (``pattern``):
  random          uniform distinct positions over the whole context
  sliding_window  the most recent ``top_k`` positions
  prefix          the first ``top_k`` positions (attention sinks)
  clustered       runs of ``selection.cluster_len`` consecutive positions at random starts
  mixed           ``selection.num_sinks`` sinks + the last ``selection.window`` positions +
                  clustered runs for the rest
  calibrated      uniform positions whose reuse across decode steps has a heavy-tailed reuse
                  distance (``selection.reuse_overlap``, ``.reuse_alpha``) and whose adjacent
                  layers share ``selection.layer_share`` of their positions, calibrated to
                  published exact-LRU miss rates (``harness/calibrated_selection.py``)

``step_overlap`` is the fraction of a (layer, request)'s previous selection kept at the next
decode step (upstream reports 80-90 % between adjacent steps); the rest is drawn fresh from the
pattern, excluding what was kept. ``sliding_window`` and ``prefix`` are fixed functions of the
sequence length, and ``calibrated`` has its own reuse model, so the knob does not apply to
them. The order of positions within a row is shuffled, as a top-k kernel's output order
carries no meaning.
"""
from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

from harness.calibrated_selection import calibrated_selections

#: where a decode point's selections come from (``selection.source``)
SOURCES = ("synthetic", "trace", "indexer")
PATTERNS = ("random", "sliding_window", "prefix", "clustered", "mixed", "calibrated")
DETERMINISTIC_PATTERNS = ("sliding_window", "prefix")


@dataclass(frozen=True)
class PatternParams:
    pattern: str
    cluster_len: int = 16
    num_sinks: int = 64
    window: int = 512
    reuse_overlap: float = 0.70   # calibrated: P(a selected token is selected at the next step)
    reuse_alpha: float = 0.45     # calibrated: reuse-distance survival ~ d ** -reuse_alpha
    layer_share: float = 0.85     # calibrated: positions a layer inherits from the layer below


def _first_free(free: np.ndarray, n: int, from_end: bool) -> np.ndarray:
    idx = np.flatnonzero(free)
    if n <= 0:
        return idx[:0]
    return idx[-n:][::-1] if from_end else idx[:n]


def _random_free(rng: np.random.Generator, free: np.ndarray, n: int) -> np.ndarray:
    idx = np.flatnonzero(free)
    return rng.choice(idx, size=min(n, idx.size), replace=False)


def _clustered_free(rng: np.random.Generator, free: np.ndarray, n: int, run: int) -> np.ndarray:
    """Up to n free positions made of runs of ``run`` consecutive positions at random starts."""
    seq_len = free.size
    free = free.copy()
    picked = []
    have = 0
    for _ in range(8):
        if have >= n:
            break
        starts = rng.integers(0, max(seq_len - run + 1, 1), size=max(1, 2 * (n - have) // run + 1))
        runs = (starts[:, None] + np.arange(run)[None, :]).reshape(-1)
        runs = runs[runs < seq_len]
        _, first = np.unique(runs, return_index=True)
        runs = runs[np.sort(first)]  # keep the draw order, drop repeats
        runs = runs[free[runs]][: n - have]
        free[runs] = False
        picked.append(runs)
        have += runs.size
    if have < n:  # a nearly full context: top up uniformly
        extra = _random_free(rng, free, n - have)
        picked.append(extra)
    return np.concatenate(picked) if picked else np.empty(0, np.int64)


def draw(rng: np.random.Generator, params: PatternParams, seq_len: int, n: int,
         taken: Optional[np.ndarray] = None) -> np.ndarray:
    """``n`` distinct positions in [0, seq_len) not in ``taken``, following ``params.pattern``."""
    free = np.ones(seq_len, dtype=bool)
    if taken is not None and taken.size:
        free[taken] = False
    n = min(n, int(free.sum()))
    p = params.pattern
    if n == 0:
        return np.empty(0, np.int64)
    if p == "random":
        return _random_free(rng, free, n)
    if p == "sliding_window":
        return _first_free(free, n, from_end=True)
    if p == "prefix":
        return _first_free(free, n, from_end=False)
    if p == "clustered":
        return _clustered_free(rng, free, n, params.cluster_len)
    if p == "mixed":
        sinks = _first_free(free, min(params.num_sinks, n), from_end=False)
        free[sinks] = False
        window = _first_free(free, min(params.window, n - sinks.size), from_end=True)
        free[window] = False
        rest = _clustered_free(rng, free, n - sinks.size - window.size, params.cluster_len)
        return np.concatenate([sinks, window, rest])
    raise ValueError(f"pattern={p!r}: allowed {PATTERNS}")


def synthesize(params: PatternParams, seq_lens: np.ndarray, num_layers: int, top_k: int,
               step_overlap: float, seed: int) -> np.ndarray:
    """Selections for every (step, layer, request): int32 [steps, layers, batch, top_k].

    ``seq_lens`` int [steps, batch]. Row (s, l, b) holds min(top_k, seq_len) distinct positions
    < seq_lens[s, b], shuffled, then -1 padding.
    """
    if params.pattern == "calibrated":
        return calibrated_selections(seq_lens, num_layers, top_k, params.reuse_overlap,
                                     params.reuse_alpha, params.layer_share, seed)
    steps, batch = seq_lens.shape
    out = np.full((steps, num_layers, batch, top_k), -1, dtype=np.int32)
    fixed = params.pattern in DETERMINISTIC_PATTERNS
    for layer in range(num_layers):
        for req in range(batch):
            rng = np.random.default_rng([seed, layer, req])
            prev: Optional[np.ndarray] = None
            for s in range(steps):
                seq_len = int(seq_lens[s, req])
                n = min(top_k, seq_len)
                if prev is None or fixed:
                    sel = draw(rng, params, seq_len, n)
                else:
                    prev = prev[prev < seq_len]
                    keep = rng.choice(prev, size=min(int(round(step_overlap * n)), prev.size),
                                      replace=False)
                    sel = np.concatenate([keep, draw(rng, params, seq_len, n - keep.size, keep)])
                sel = rng.permutation(sel)
                out[s, layer, req, : sel.size] = sel
                prev = sel
    return out


def distinct_counts(topk: np.ndarray, page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(distinct valid positions, distinct pages holding them) per row of ``topk [..., K]``."""
    s = np.sort(topk, axis=-1)
    valid = s >= 0
    new_tok = valid.copy()
    new_tok[..., 1:] &= s[..., 1:] != s[..., :-1]
    pages = np.where(valid, s // page_size, -1)
    new_page = valid.copy()
    new_page[..., 1:] &= pages[..., 1:] != pages[..., :-1]
    return new_tok.sum(-1), new_page.sum(-1)


# ----------------------------------------------------------------------------- traces

class TraceError(ValueError):
    """A trace file that cannot be replayed: unreadable, or not in the trace format."""


def duplicate_position(topk: np.ndarray) -> Optional[Tuple[Tuple[int, ...], int]]:
    """``(row index, position)`` of the first row of ``topk [..., top_k]`` that selects a
    position twice, or None when every row's valid positions are distinct (-1 pads may repeat)."""
    s = np.sort(topk, axis=-1)
    dup = (s[..., 1:] == s[..., :-1]) & (s[..., 1:] >= 0)
    if not dup.any():
        return None
    *row, k = (int(i) for i in np.argwhere(dup)[0])
    return tuple(row), int(s[tuple(row)][k])


@dataclass
class Trace:
    """A recorded selection sequence: ``topk [steps, layers, batch, top_k]`` int32 (request-local
    positions, -1 padded, distinct within a row) and ``seq_lens [steps, batch]`` int32."""

    topk: np.ndarray
    seq_lens: np.ndarray

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp.npz")
        np.savez_compressed(tmp, topk=self.topk.astype(np.int32), seq_lens=self.seq_lens.astype(np.int32))
        os.replace(tmp, path)
        return path

    def check(self) -> None:
        """Raises TraceError unless the arrays are in the trace format: int32, ``topk`` 4-D and
        ``seq_lens`` 2-D, and no row selecting a position twice. Other dtypes are rejected, not
        converted: a float or int64 trace was written by something other than ``Trace.save``
        (convert it with ``.astype(np.int32)`` once you know its values are positions)."""
        for name, arr, dims in (("topk", self.topk, "[steps, layers, batch, top_k]"),
                                ("seq_lens", self.seq_lens, "[steps, batch]")):
            if arr.dtype != np.int32:
                raise TraceError(f"trace {name} has dtype {arr.dtype}; it must be int32 {dims} "
                                 f"(convert with {name}.astype(np.int32) and save again)")
        if self.topk.ndim != 4:
            raise TraceError(f"trace topk has shape {list(self.topk.shape)}; it must be 4-D "
                             "[steps, layers, batch, top_k]")
        if self.seq_lens.ndim != 2:
            raise TraceError(f"trace seq_lens has shape {list(self.seq_lens.shape)}; it must be 2-D "
                             "[steps, batch]")
        dup = duplicate_position(self.topk)
        if dup is not None:
            (step, layer, req), pos = dup
            raise TraceError(f"trace topk selects position {pos} twice in row [step {step}, layer "
                             f"{layer}, request {req}]; a row's positions must be distinct (-1 pads)")

    @staticmethod
    def load(path: str | os.PathLike) -> "Trace":
        """Reads and checks (``check``) the trace at ``path``. Raises TraceError naming what is
        wrong: not an .npz archive (random bytes, truncated), missing arrays, wrong dtype, ..."""
        if not zipfile.is_zipfile(path):
            what = "does not exist" if not Path(path).exists() else \
                "is not an .npz archive (truncated, or not written by numpy.savez / Trace.save)"
            raise TraceError(f"{path} {what}")
        try:
            with np.load(path, allow_pickle=False) as z:
                missing = {"topk", "seq_lens"} - set(z.files)
                if missing:
                    raise TraceError(f"trace lacks arrays {sorted(missing)} (needs topk "
                                     "[steps, layers, batch, top_k] and seq_lens [steps, batch])")
                tr = Trace(topk=z["topk"], seq_lens=z["seq_lens"])
        except TraceError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
            raise TraceError(f"{path}: cannot read its arrays ({type(e).__name__}: {e}); "
                             "the archive is damaged") from e
        tr.check()
        return tr
