"""The mapping between our coordinator's hot-buffer state and upstream's buffers (token mode;
the table in the package docstring), and the selection upstream's kernel handles exactly like
ours: ``canonical_selection`` makes one, ``selection_contract_error`` says whether a selection
already is one. Pure torch/numpy: runs on any device."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from backends.kernels.flashmla_peer import PeerUnsupported

INT16_MAX = 32767                 # upstream's LRU slots and top-k indices are int16


def device_buffer_locs(max_requests: int, device_buffer_size: int, page_size: int,
                       device=None) -> torch.Tensor:
    """int32 ``[R, D + P]``: global device row of each request's buffer slot (ours: request
    ``r`` owns rows ``r * (D + P) ..``; slot ``D`` is the reserved newest-token row)."""
    w = device_buffer_size + page_size
    r = torch.arange(max_requests, dtype=torch.int64, device=device)[:, None]
    return (r * w + torch.arange(w, dtype=torch.int64, device=device)).to(torch.int32)


def host_cache_locs(host_page_table: torch.Tensor, page_size: int) -> torch.Tensor:
    """int64 ``[R, max_pages * P]``: host row of each position (-1 where no page is allocated)."""
    t = host_page_table.to(torch.int64)
    R, pages = t.shape
    off = torch.arange(page_size, dtype=torch.int64, device=t.device)
    rows = t[:, :, None] * page_size + off
    return torch.where(t[:, :, None] >= 0, rows, -1).reshape(R, pages * page_size).contiguous()


def to_upstream_state(slot_unit: torch.Tensor, lru: torch.Tensor, page_size: int
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Ours (token mode) -> upstream: ``slot_unit`` int32 ``[..., R, D]`` becomes
    ``device_buffer_tokens`` int32 ``[..., R, D + P]`` (reserved columns -1), ``lru`` int32
    ``[..., R, D]`` becomes ``lru_slots`` int16 (same order, least recent first)."""
    D = slot_unit.shape[-1]
    if lru.shape != slot_unit.shape:
        raise ValueError(f"slot map {tuple(slot_unit.shape)} and LRU {tuple(lru.shape)} differ")
    if D > INT16_MAX:
        raise PeerUnsupported(f"upstream LRU slots are int16: {D} slots do not fit")
    tokens = torch.full((*slot_unit.shape[:-1], D + page_size), -1, dtype=torch.int32,
                        device=slot_unit.device)
    tokens[..., :D] = slot_unit
    return tokens, lru.to(torch.int16)


def from_upstream_state(tokens: torch.Tensor, lru_slots: torch.Tensor
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Upstream -> ours: ``(slot_unit int32 [..., R, D], lru int32 [..., R, D])``."""
    D = lru_slots.shape[-1]
    return tokens[..., :D].to(torch.int32).clone(), lru_slots.to(torch.int32)


def canonical_selection(topk: torch.Tensor, seq_lens: torch.Tensor
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(canon, where)``: the selection as upstream's kernel handles it exactly like ours --
    each row's valid (``0 <= p < seq_len``) distinct positions ascending, then -1 -- and, for
    every original entry, its column in ``canon`` (-1 for invalid entries)."""
    big = torch.iinfo(torch.int64).max
    t = topk.to(torch.int64)
    valid = (t >= 0) & (t < seq_lens.to(torch.int64)[:, None])
    v = torch.where(valid, t, big)
    s = torch.sort(v, dim=1).values
    dup = torch.zeros_like(s, dtype=torch.bool)
    dup[:, 1:] = s[:, 1:] == s[:, :-1]
    s = torch.sort(torch.where(dup, big, s), dim=1).values
    where = torch.searchsorted(s, v.contiguous())
    canon = torch.where(s == big, -1, s).to(torch.int32)
    return canon.contiguous(), torch.where(valid, where, -1)


def selection_contract_error(topk: np.ndarray, seq_lens: np.ndarray,
                             device_buffer_size: int) -> Optional[str]:
    """None when a selection (int ``[B, K]`` request-local positions, -1 padded; ``seq_lens``
    ``[B]``) is one upstream's kernel handles exactly: positions in ``[-1, seq_len)``, no
    position twice in a row; for short requests (``seq_len <= device_buffer_size``) no -1
    before a valid entry; for long requests no -1 at all (the kernel's empty-hash key and its
    hit marker are both -1, ``HASH_EMPTY == TOKEN_HIT``: a -1 entry is inserted as if empty and
    its slot index can overwrite a real position's, a race; an indexer's top-k of a request
    longer than ``top_k`` has no -1). Otherwise the first violation, in words."""
    t = np.asarray(topk, dtype=np.int64)
    n = np.asarray(seq_lens, dtype=np.int64)[:, None]
    bad = (t < -1) | (t >= n)
    if bad.any():
        b = int(np.argwhere(bad)[0, 0])
        return f"batch row {b} selects a position outside [-1, seq_len={int(n[b, 0])})"
    s = np.sort(t, axis=1)
    dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    if dup.any():
        b = int(np.argwhere(dup)[0, 0])
        return f"batch row {b} selects a position twice (upstream's kernel would race)"
    valid = t >= 0
    gap = (~valid[:, :-1] & valid[:, 1:]) & (n <= device_buffer_size)
    if gap.any():
        b = int(np.argwhere(gap)[0, 0])
        return (f"batch row {b} (a short request, seq_len <= {device_buffer_size}) has -1 before "
                "a valid entry")
    hole = ~valid & (n > device_buffer_size)
    if hole.any():
        b = int(np.argwhere(hole)[0, 0])
        return (f"batch row {b} (a long request, seq_len > {device_buffer_size}) has a -1 entry "
                "(upstream's kernel uses -1 as its empty-hash key and hit marker: it would race)")
    return None


def uncanonical(out: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Output slots of a canonical selection back in the caller's entry order (-1 kept)."""
    g = torch.gather(out, 1, where.clamp(min=0))
    return torch.where(where >= 0, g, -1).to(torch.int32)
