"""Paged cache of the lightning indexer's keys ("index keys"), one per token.

The index-key cache is paged with the same block tables as the attention KV cache: logical
position ``p`` of request ``r`` lives in physical page ``block_table[r, p // P]`` at in-page
slot ``p % P`` (``P`` = ``page_size``, any power of two). A *slot* is the flat physical token
index ``page * P + p % P``.

Two formats:

``fp8`` (DeepSeek-V3.2 / DeepGEMM layout)
    ``uint8 [num_pages, P * (D + 4)]``. Inside each page the ``P * D`` float8_e4m3fn key bytes of
    all its tokens come first (token-major, ``D`` bytes per token), followed by ``P`` float32
    scales (little-endian, 4 bytes each): ``D + 4`` bytes per token (132 B for ``D = 128``).
    A key ``k`` (float32 ``[D]``) is stored as ``fp8(k / s)`` with
    ``s = max(amax(|k|), 1e-4) / 448`` and dequantizes to ``fp8 * s``.
``bf16``
    ``bfloat16 [num_pages, P, D]``, the key rounded to bf16.

Everything here is plain torch (it runs on any device) and is the layout the Triton indexer
kernels in ``backends/kernels/indexer.py`` read.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import List, Tuple, Union

import torch

FP8_MAX = 448.0
"""Largest finite float8_e4m3fn value."""
SCALE_FLOOR = 1e-4
"""Per-token amax floor: ``scale = max(amax, SCALE_FLOOR) / FP8_MAX``."""
SCALE_BYTES = 4


class IndexKeyFormat(str, Enum):
    """Storage format of the index-key cache."""

    FP8 = "fp8"
    BF16 = "bf16"


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def fp8_bytes_per_token(head_dim: int) -> int:
    """Bytes one token occupies in the ``fp8`` format: ``head_dim`` key bytes + a float32 scale."""
    return head_dim + SCALE_BYTES


def quantize_index_keys(k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token fp8 quantization of index keys.

    Args:
        k: ``[T, D]`` float32 / bfloat16 / float16 keys.
    Returns:
        ``(values, scales)``: ``values`` uint8 ``[T, D]`` (float8_e4m3fn bit patterns),
        ``scales`` float32 ``[T]`` with ``scales = max(amax(|k|, dim=-1), 1e-4) / 448``.
    """
    if k.dim() != 2 or not k.is_floating_point():
        raise ValueError(f"k must be a floating [T, D] tensor, got {tuple(k.shape)} {k.dtype}")
    kf = k.float()
    scales = kf.abs().amax(dim=-1).clamp_min(SCALE_FLOOR) / FP8_MAX
    q = (kf / scales[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(torch.uint8), scales


def dequantize_fp8_keys(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``values`` uint8/float8_e4m3fn ``[..., D]``, ``scales`` float32 ``[...]`` -> float32 ``[..., D]``."""
    if values.dtype == torch.uint8:
        values = values.view(torch.float8_e4m3fn)
    return values.float() * scales.float().unsqueeze(-1)


def slots_for_positions(block_table: torch.Tensor, req_idx: torch.Tensor, positions: torch.Tensor,
                        page_size: int) -> torch.Tensor:
    """Physical token slots of logical positions.

    Args:
        block_table: int32 ``[R, max_pages]`` physical page of each (request, logical page).
        req_idx: integer ``[T]`` request (row of ``block_table``) of each token.
        positions: integer ``[T]`` logical position of each token in its request.
        page_size: tokens per page ``P`` (power of two).
    Returns:
        int64 ``[T]`` slots ``block_table[req, pos // P] * P + pos % P``.
    """
    if not _is_pow2(page_size):
        raise ValueError(f"page_size must be a power of two, got {page_size}")
    if req_idx.shape != positions.shape or req_idx.dim() != 1:
        raise ValueError("req_idx and positions must be 1-D tensors of the same length")
    pos = positions.long()
    if bool((pos < 0).any()):
        raise ValueError("positions must be >= 0")
    pages = block_table[req_idx.long(), pos // page_size].long()
    return pages * page_size + pos % page_size


@dataclass
class IndexKeyCache:
    """One layer's index-key cache (see the module docstring for the byte layout).

    Attributes:
        data: uint8 ``[num_pages, page_size * (head_dim + 4)]`` (fp8) or
            bfloat16 ``[num_pages, page_size, head_dim]`` (bf16). This tensor is what the
            indexer kernels take as ``k_cache``.
        fmt: the storage format.
        page_size: tokens per page (power of two).
        head_dim: index-key dimension ``D`` (a multiple of 4).
    """

    data: torch.Tensor
    fmt: IndexKeyFormat
    page_size: int
    head_dim: int

    @classmethod
    def allocate(cls, num_pages: int, page_size: int, head_dim: int,
                 fmt: Union[IndexKeyFormat, str] = IndexKeyFormat.FP8,
                 device: Union[torch.device, str] = "cpu") -> "IndexKeyCache":
        """Zero-filled cache of ``num_pages`` pages."""
        fmt = IndexKeyFormat(fmt)
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        if not _is_pow2(page_size):
            raise ValueError(f"page_size must be a power of two, got {page_size}")
        if head_dim < 4 or head_dim % 4:
            raise ValueError(f"head_dim must be a positive multiple of 4, got {head_dim}")
        if fmt is IndexKeyFormat.FP8:
            data = torch.zeros(num_pages, page_size * fp8_bytes_per_token(head_dim),
                               dtype=torch.uint8, device=device)
        else:
            data = torch.zeros(num_pages, page_size, head_dim, dtype=torch.bfloat16, device=device)
        return cls(data, fmt, page_size, head_dim)

    @classmethod
    def wrap(cls, data: torch.Tensor, head_dim: int) -> "IndexKeyCache":
        """View an existing cache tensor (format and page size inferred from dtype and shape)."""
        if data.dtype == torch.uint8 and data.dim() == 2:
            row = data.shape[1]
            bpt = fp8_bytes_per_token(head_dim)
            if row % bpt or not _is_pow2(row // bpt):
                raise ValueError(f"fp8 cache row of {row} bytes is not page_size * {bpt} "
                                 f"with a power-of-two page_size")
            return cls(data, IndexKeyFormat.FP8, row // bpt, head_dim)
        if data.dtype == torch.bfloat16 and data.dim() == 3 and data.shape[2] == head_dim:
            return cls(data, IndexKeyFormat.BF16, data.shape[1], head_dim)
        raise ValueError(f"k_cache must be uint8 [pages, P*(D+4)] or bf16 [pages, P, D]; got "
                         f"{data.dtype} {tuple(data.shape)} with D={head_dim}")

    @property
    def num_pages(self) -> int:
        return self.data.shape[0]

    @property
    def bytes_per_token(self) -> int:
        """Bytes of cache read per token by the indexer (132 for fp8 with D=128, 256 for bf16)."""
        if self.fmt is IndexKeyFormat.FP8:
            return fp8_bytes_per_token(self.head_dim)
        return 2 * self.head_dim

    def values_view(self) -> torch.Tensor:
        """fp8: uint8 ``[num_pages, P, D]`` view of the key bytes; bf16: the data itself."""
        if self.fmt is IndexKeyFormat.BF16:
            return self.data
        P, D = self.page_size, self.head_dim
        return self.data[:, : P * D].view(self.num_pages, P, D)

    def scales_view(self) -> torch.Tensor:
        """fp8 only: float32 ``[num_pages, P]`` view of the per-token scales."""
        if self.fmt is not IndexKeyFormat.FP8:
            raise ValueError("scales_view() is only defined for the fp8 format")
        P, D = self.page_size, self.head_dim
        return self.data[:, P * D:].view(torch.float32)

    def write_slots(self, slots: torch.Tensor, k: torch.Tensor) -> None:
        """Store keys ``k`` (floating ``[T, D]``) at physical slots ``slots`` (integer ``[T]``)."""
        if k.dim() != 2 or k.shape[1] != self.head_dim:
            raise ValueError(f"k must be [T, {self.head_dim}], got {tuple(k.shape)}")
        if slots.dim() != 1 or slots.shape[0] != k.shape[0]:
            raise ValueError(f"slots must be [T={k.shape[0]}], got {tuple(slots.shape)}")
        if not bool(torch.isfinite(k).all()):
            raise ValueError("k contains non-finite values")
        s = slots.long().to(self.data.device)
        if bool(((s < 0) | (s >= self.num_pages * self.page_size)).any()):
            raise ValueError("slots out of range of the cache")
        page, off = s // self.page_size, s % self.page_size
        k = k.to(self.data.device)
        if self.fmt is IndexKeyFormat.FP8:
            vals, scales = quantize_index_keys(k)
            self.values_view()[page, off] = vals
            self.scales_view()[page, off] = scales
        else:
            self.data[page, off] = k.to(torch.bfloat16)

    def write_positions(self, block_table: torch.Tensor, req_idx: torch.Tensor,
                        positions: torch.Tensor, k: torch.Tensor) -> None:
        """Store keys of logical ``positions`` of requests ``req_idx`` (see ``slots_for_positions``)."""
        self.write_slots(slots_for_positions(block_table, req_idx, positions, self.page_size), k)

    def dequantize(self) -> torch.Tensor:
        """float32 ``[num_pages, P, D]``: every stored key as the indexer sees it."""
        if self.fmt is IndexKeyFormat.FP8:
            return dequantize_fp8_keys(self.values_view(), self.scales_view())
        return self.data.float()

    def gather(self, block_table: torch.Tensor, seq_lens: torch.Tensor) -> List[torch.Tensor]:
        """Per request ``b``: float32 ``[seq_lens[b], D]`` dequantized keys in logical order."""
        flat = self.dequantize().reshape(-1, self.head_dim)
        out = []
        for b, n in enumerate(seq_lens.tolist()):
            pos = torch.arange(n, device=self.data.device)
            slots = slots_for_positions(block_table, torch.full_like(pos, b), pos, self.page_size)
            out.append(flat[slots])
        return out
