"""KV-cache row formats for DeepSeek-V3.2-style MLA (one latent KV head per token).

A KV cache here is a flat table of rows, one row per token slot: ``[num_slots, row]``. A paged
cache ``[num_pages, page_size, row]`` is the same memory seen with one more dimension
(``cache.view(-1, row)``), and a slot id is ``page * page_size + offset``.

Each row holds the ``d_nope`` "no-position" latent values (which double as V) followed by the
``d_rope`` rotary-key values; ``d_qk = d_nope + d_rope`` (576 = 512 + 64 for DeepSeek-V3.2).

Two row formats (``KV_DTYPES``):

``"bf16"``
    ``d_qk`` bfloat16 values; a row is ``2 * d_qk`` bytes (1152 B for 576). Stored as a
    ``torch.bfloat16`` tensor ``[num_slots, d_qk]``.

``"fp8_ds_mla"``
    vLLM's ``fp8_ds_mla`` layout, generalised over ``d_nope`` / ``d_rope``. Stored as a
    ``torch.uint8`` tensor ``[num_slots, row_bytes]``; per row, little-endian:

    ====================  ==============================  =====================================
    bytes                 content                         notes
    ====================  ==============================  =====================================
    ``[0, d_nope)``       ``d_nope`` float8_e4m3fn         ``round(x / scale_g)``, saturated
    ``+ 4 * d_nope/128``  ``d_nope / 128`` float32 scales  one per 128-value tile ``g``
    ``+ 2 * d_rope``      ``d_rope`` bfloat16 values       copied bit-exactly from the input
    ====================  ==============================  =====================================

    ``scale_g`` is a float32 multiplier (dequantised value = ``fp8 * scale_g``) computed from
    ``amax_g``, the largest magnitude in tile ``g``, in one of two forms (``KV_SCALE_FORMATS``;
    every kernel reads the stored float32 as a plain multiplier, so either works everywhere):

    ``"pow2"``
        ``2 ** ceil(log2(max(amax_g / 448, 1e-4)))``: a power of two, as FlashMLA's reference
        quantizer writes it (``tests/quant.py`` of deepseek-ai/FlashMLA, ``quantize_k_cache`` with
        ``_cast_scale_inv_to_ue8m0``). The exponent is taken exactly (``frexp``), not through a
        float ``log2``. An all-zero tile gets ``2 ** -13``.
    ``"raw"`` (default)
        ``max(amax_g / 448, FP8_SCALE_FLOOR)`` unrounded, as vLLM's cache writer stores it
        (``concat_and_cache_ds_mla_kernel`` in vllm ``csrc/cache_kernels.cu``: ``fmaxf(max_abs /
        kFp8ScaleDivisor, FLT_MIN)``); the tile maximum maps to exactly +-448.
 DeepSeek-V3.2 (512, 64) gives 512 + 16 + 128 = 656 B; a tiny
    model (256, 64) gives 256 + 8 + 128 = 392 B. ``d_nope`` must be a positive multiple of 128
    and ``d_rope`` even, so that every row (and therefore every scale) is 4-byte aligned.
"""
from __future__ import annotations

from typing import Tuple

import torch

KV_DTYPES = ("bf16", "fp8_ds_mla")
#: how ``fp8_ds_mla`` tile scales are formed (module doc)
KV_SCALE_FORMATS = ("pow2", "raw")

#: values per fp32 scale in ``fp8_ds_mla``
FP8_TILE = 128
#: largest finite float8_e4m3fn magnitude
FP8_MAX = 448.0
#: floor of a tile scale (vLLM uses FLT_MIN): an all-zero tile gets this scale, not 0
FP8_SCALE_FLOOR = float(torch.finfo(torch.float32).tiny)
#: floor of ``amax / 448`` before rounding up to a power of two (FlashMLA's ``clamp_min(1e-4)``)
FP8_POW2_FLOOR = 1e-4


def _check_scale_format(scale_format: str) -> None:
    if scale_format not in KV_SCALE_FORMATS:
        raise ValueError(f"scale_format must be one of {KV_SCALE_FORMATS}, got {scale_format!r}")


def tile_scales(amax: torch.Tensor, scale_format: str = "raw") -> torch.Tensor:
    """float32 tile scales from tile maxima ``amax`` (float32, any shape, >= 0), in
    ``scale_format`` (module doc): ``"pow2"`` ``2 ** ceil(log2(max(amax / 448, 1e-4)))``,
    ``"raw"`` ``max(amax / 448, FP8_SCALE_FLOOR)``."""
    _check_scale_format(scale_format)
    s = amax.float() / FP8_MAX
    if scale_format == "raw":
        return torch.clamp(s, min=FP8_SCALE_FLOOR)
    s = torch.clamp(s, min=FP8_POW2_FLOOR)
    mant, exp = torch.frexp(s)                       # s = mant * 2**exp, mant in [0.5, 1)
    exp = torch.where(mant == 0.5, exp - 1, exp)     # an exact power of two stays itself
    return torch.ldexp(torch.ones_like(s), exp)


def _check_dims(kv_dtype: str, d_nope: int, d_rope: int) -> None:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
    if not isinstance(d_nope, int) or isinstance(d_nope, bool) or d_nope <= 0:
        raise ValueError(f"d_nope must be a positive int, got {d_nope!r}")
    if not isinstance(d_rope, int) or isinstance(d_rope, bool) or d_rope < 0:
        raise ValueError(f"d_rope must be an int >= 0, got {d_rope!r}")
    if kv_dtype == "fp8_ds_mla":
        if d_nope % FP8_TILE != 0:
            raise ValueError(f"fp8_ds_mla needs d_nope to be a multiple of {FP8_TILE}, got {d_nope}")
        if d_rope % 2 != 0:
            raise ValueError(f"fp8_ds_mla needs an even d_rope (4-byte aligned rows), got {d_rope}")


def row_bytes(kv_dtype: str, d_nope: int, d_rope: int) -> int:
    """Bytes of one KV row (one token slot) in ``kv_dtype``.

    ``"bf16"``: ``2 * (d_nope + d_rope)`` (1152 for 512 + 64).
    ``"fp8_ds_mla"``: ``d_nope + 4 * d_nope / 128 + 2 * d_rope`` (656 for 512 + 64).
    """
    _check_dims(kv_dtype, d_nope, d_rope)
    if kv_dtype == "bf16":
        return 2 * (d_nope + d_rope)
    return d_nope + 4 * (d_nope // FP8_TILE) + 2 * d_rope


def row_alignment(*terms: int, cap: int = 16) -> int:
    """The largest power of two <= ``cap`` dividing every one of ``terms`` (a row stride and
    offsets into the row, in elements of a view): what ``slot * stride + offset`` is a multiple
    of for any slot (``cap`` for all zeros). Kernels state it (``tl.multiple_of``) or size
    their vectors by it rather than leave it to the compiler (Triton 3.6 over-assumed it for
    the gather's 392-byte rows: BENCHMARKS.md 6u)."""
    align = cap
    for t in terms:
        while t % align:
            align //= 2
    return align


def fp8_ds_mla_offsets(d_nope: int, d_rope: int) -> Tuple[int, int, int]:
    """Byte offsets inside an ``fp8_ds_mla`` row: ``(scales_start, rope_start, row_bytes)``."""
    rb = row_bytes("fp8_ds_mla", d_nope, d_rope)
    scales_start = d_nope
    rope_start = d_nope + 4 * (d_nope // FP8_TILE)
    return scales_start, rope_start, rb


def _check_rows(rows: torch.Tensor, d_nope: int, d_rope: int, name: str = "rows") -> None:
    if not isinstance(rows, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(rows).__name__}")
    if rows.dtype != torch.uint8:
        raise ValueError(f"{name} must be torch.uint8 (fp8_ds_mla rows), got {rows.dtype}")
    if rows.dim() != 2:
        raise ValueError(f"{name} must be 2-D [num_slots, row_bytes], got shape {tuple(rows.shape)}")
    rb = row_bytes("fp8_ds_mla", d_nope, d_rope)
    if rows.shape[1] != rb:
        raise ValueError(f"{name} rows must be {rb} bytes for fp8_ds_mla with d_nope={d_nope}, "
                         f"d_rope={d_rope}, got {rows.shape[1]}")
    if rows.stride(1) != 1 or rows.stride(0) % 4 != 0:
        raise ValueError(f"{name} must have unit last-dim stride and a row stride that is a "
                         f"multiple of 4 bytes, got strides {tuple(rows.stride())}")


def fp8_ds_mla_views(rows: torch.Tensor, d_nope: int, d_rope: int
                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three typed views of the same ``fp8_ds_mla`` rows (no copy).

    Returns ``(nope_u8 [N, row_bytes] uint8, scales_f32 [N, row_bytes/4] float32,
    rope_bf16 [N, row_bytes/2] bfloat16)``, all sharing ``rows``' storage. Inside a row, the
    fp8 values are ``nope_u8[:, :d_nope]``, the scales ``scales_f32[:, d_nope/4 :
    d_nope/4 + d_nope/128]`` and the rope values ``rope_bf16[:, rope_start/2 :]``.
    """
    _check_rows(rows, d_nope, d_rope)
    return rows, rows.view(torch.float32), rows.view(torch.bfloat16)


def quantize_fp8_ds_mla(kv: torch.Tensor, d_nope: int = 512, *,
                        scale_format: str = "raw") -> torch.Tensor:
    """Quantizes bf16 KV rows into ``fp8_ds_mla`` rows.

    Args:
        kv: ``[N, d_nope + d_rope]`` torch.bfloat16, any device.
        d_nope: NoPE width (positive multiple of 128); the remaining ``d_rope`` columns are
            the rope part (even, may be 0).
        scale_format: ``"pow2"`` or ``"raw"`` tile scales (module doc, ``tile_scales``).

    Returns:
        ``[N, row_bytes("fp8_ds_mla", d_nope, d_rope)]`` torch.uint8 on ``kv``'s device.
        Per 128-value tile: ``scale = tile_scales(amax, scale_format)`` (fp32),
        values ``clamp(x / scale, -448, 448)`` rounded to nearest-even float8_e4m3fn;
        rope bytes are the bf16 input bytes unchanged.
    """
    if not isinstance(kv, torch.Tensor):
        raise ValueError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
    if kv.dtype != torch.bfloat16:
        raise ValueError(f"kv must be torch.bfloat16, got {kv.dtype}")
    if kv.dim() != 2:
        raise ValueError(f"kv must be 2-D [N, d_nope + d_rope], got shape {tuple(kv.shape)}")
    d_rope = kv.shape[1] - d_nope if isinstance(d_nope, int) else -1
    if isinstance(d_nope, int) and d_rope < 0:
        raise ValueError(f"kv has {kv.shape[1]} columns, fewer than d_nope={d_nope}")
    _check_dims("fp8_ds_mla", d_nope, d_rope)
    _check_scale_format(scale_format)
    n = kv.shape[0]
    g = d_nope // FP8_TILE
    scales_start, rope_start, rb = fp8_ds_mla_offsets(d_nope, d_rope)

    nope = kv[:, :d_nope].float().reshape(n, g, FP8_TILE)
    amax = nope.abs().amax(dim=-1)                                   # [N, G]
    scale = tile_scales(amax, scale_format)                          # [N, G] fp32
    vals = torch.clamp(nope / scale.unsqueeze(-1), -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)

    rows = torch.empty((n, rb), dtype=torch.uint8, device=kv.device)
    rows[:, :d_nope] = vals.reshape(n, d_nope).view(torch.uint8)
    rows[:, scales_start:rope_start] = scale.contiguous().view(torch.uint8)
    if d_rope > 0:
        rows[:, rope_start:] = kv[:, d_nope:].contiguous().view(torch.uint8)
    return rows


def dequantize_fp8_ds_mla(rows: torch.Tensor, d_nope: int = 512, d_rope: int = 64) -> torch.Tensor:
    """Decodes ``fp8_ds_mla`` rows to float32.

    Args:
        rows: ``[N, row_bytes]`` torch.uint8 (unit last-dim stride).
        d_nope, d_rope: the row's widths (see module doc).

    Returns:
        ``[N, d_nope + d_rope]`` torch.float32: ``fp8 * scale`` per 128-value tile for the
        NoPE part, the bf16 rope values widened exactly.
    """
    _check_rows(rows, d_nope, d_rope)
    n = rows.shape[0]
    g = d_nope // FP8_TILE
    scales_start, rope_start, rb = fp8_ds_mla_offsets(d_nope, d_rope)
    vals = rows[:, :d_nope].contiguous().view(torch.float8_e4m3fn).float().reshape(n, g, FP8_TILE)
    scale = rows[:, scales_start:rope_start].contiguous().view(torch.float32)      # [N, G]
    nope = (vals * scale.unsqueeze(-1)).reshape(n, d_nope)
    rope = rows[:, rope_start:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=1)


def kv_dtype_of(kv_cache: torch.Tensor) -> str:
    """``"bf16"`` for a bfloat16 cache, ``"fp8_ds_mla"`` for a uint8 one; else ValueError."""
    if not isinstance(kv_cache, torch.Tensor):
        raise ValueError(f"kv_cache must be a torch.Tensor, got {type(kv_cache).__name__}")
    if kv_cache.dtype == torch.bfloat16:
        return "bf16"
    if kv_cache.dtype == torch.uint8:
        return "fp8_ds_mla"
    raise ValueError(f"kv_cache must be torch.bfloat16 (bf16 rows) or torch.uint8 (fp8_ds_mla "
                     f"rows), got {kv_cache.dtype}")


def make_kv_cache(kv: torch.Tensor, kv_dtype: str, d_nope: int = 512, *,
                  scale_format: str = "raw") -> torch.Tensor:
    """Stores bf16 KV rows ``[N, d_nope + d_rope]`` in ``kv_dtype``.

    ``"bf16"``: a contiguous copy, ``[N, d_qk]`` bfloat16 (``scale_format`` is still checked
    but unused). ``"fp8_ds_mla"``: :func:`quantize_fp8_ds_mla` with ``scale_format``,
    ``[N, row_bytes]`` uint8.
    """
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
    _check_scale_format(scale_format)
    if kv_dtype == "fp8_ds_mla":
        return quantize_fp8_ds_mla(kv, d_nope, scale_format=scale_format)
    if not isinstance(kv, torch.Tensor) or kv.dtype != torch.bfloat16 or kv.dim() != 2:
        raise ValueError("kv must be a 2-D torch.bfloat16 tensor [N, d_nope + d_rope]")
    return kv.contiguous().clone()


def kv_cache_to_float(kv_cache: torch.Tensor, d_qk: int, d_v: int = 512) -> torch.Tensor:
    """Any supported cache ``[num_slots, row]`` as float32 ``[num_slots, d_qk]``.

    bf16 rows are widened; uint8 rows are ``fp8_ds_mla`` with ``d_nope = d_v`` and
    ``d_rope = d_qk - d_v`` and are dequantized.
    """
    kind = kv_dtype_of(kv_cache)
    if kind == "bf16":
        if kv_cache.dim() != 2 or kv_cache.shape[1] != d_qk:
            raise ValueError(f"bf16 kv_cache must be [num_slots, {d_qk}], got {tuple(kv_cache.shape)}")
        return kv_cache.float()
    return dequantize_fp8_ds_mla(kv_cache, d_v, d_qk - d_v)
