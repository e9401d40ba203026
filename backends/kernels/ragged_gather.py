"""The prefill gather: a request's paged KV (fp8_ds_mla or bf16) and paged fp8 index keys ->
contiguous ragged buffers (all requests concatenated), as vLLM and SGLang build before sparse
prefill attention over a RAGGED index table. One Triton launch per layer."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from backends.kernels import kv_format


@triton.jit
def _ragged_gather_kernel(
        nope_ptr, stride_nope,                  # fp8: uint8 rows [S, RB]; bf16: bf16 rows [S, d_qk]
        scale_ptr, stride_scale, scale_off,     # fp8: float32 view of the rows, scales at scale_off
        rope_ptr, stride_rope, rope_off,        # bf16 view of the rows; rope values at rope_off
        ik_ptr, iks_ptr, stride_ik_page, stride_iks_page,  # index-key pages: uint8 / float32 views
        bt_ptr, stride_bt, len_ptr, cu_ptr,
        out_ptr, stride_out, out_k_ptr, out_ks_ptr,
        PAGE: tl.constexpr, D_V: tl.constexpr, D_V_PAD: tl.constexpr, G: tl.constexpr,
        D_ROPE: tl.constexpr, D_ROPE_PAD: tl.constexpr, D_IDX: tl.constexpr,
        IS_FP8: tl.constexpr, BLOCK_T: tl.constexpr, NOPE_ALIGN: tl.constexpr,
        SCALE_ALIGN: tl.constexpr, ROPE_ALIGN: tl.constexpr):
    """One program = one request x one tile of ``BLOCK_T`` of its tokens.

    Token ``t`` of request ``r`` (``t < len[r]``) lives in slot ``bt[r, t // PAGE] * PAGE +
    t % PAGE`` and goes to ragged row ``cu[r] + t``: its KV row dequantized to bf16
    (``out[:, :D_V]`` NoPE/V, ``out[:, D_V:]`` rope) and its index key bytes + scale.
    ``*_ALIGN``: what each row's first element offset is known to be a multiple of (elements
    of its view, a power of two <= 16), from the strides and offsets: the vector width of the
    row loads. Stated, not left to the compiler: Triton 3.6 takes a row offset computed from
    the consecutive slots of a page as 16-byte aligned whatever the stride, and loaded the
    ``tiny`` model's 392-byte fp8_ds_mla rows (8-byte aligned) as 16-byte vectors: a
    misaligned address on the H200 (BENCHMARKS.md 6u).
    """
    r = tl.program_id(0)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    n = tl.load(len_ptr + r)
    valid = t < n
    page = tl.load(bt_ptr + r.to(tl.int64) * stride_bt + t // PAGE, mask=valid, other=0).to(tl.int64)
    in_page = (t % PAGE).to(tl.int64)
    slot = page * PAGE + in_page
    dst = tl.load(cu_ptr + r).to(tl.int64) + t.to(tl.int64)

    # ---- attention KV row -> bf16 ----
    offs_v = tl.arange(0, D_V_PAD)
    vmask = valid[:, None] & (offs_v[None, :] < D_V)
    nope_row = tl.multiple_of(slot * stride_nope, NOPE_ALIGN)
    nope = tl.load(nope_ptr + nope_row[:, None] + offs_v[None, :], mask=vmask, other=0)
    if IS_FP8:
        offs_g = tl.arange(0, G)
        scale_row = tl.multiple_of(slot * stride_scale + scale_off, SCALE_ALIGN)
        sc = tl.load(scale_ptr + scale_row[:, None] + offs_g[None, :],
                     mask=valid[:, None] & (offs_g[None, :] < D_V // 128), other=0.0)
        vals = nope.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        vals = tl.reshape(vals, [BLOCK_T, G, D_V_PAD // G]) * sc[:, :, None]
        v = tl.reshape(vals, [BLOCK_T, D_V_PAD]).to(tl.bfloat16)
    else:
        v = nope
    out_row = out_ptr + dst[:, None] * stride_out
    tl.store(out_row + offs_v[None, :], v, mask=vmask)
    offs_r = tl.arange(0, D_ROPE_PAD)
    rmask = valid[:, None] & (offs_r[None, :] < D_ROPE)
    rope_row = tl.multiple_of(slot * stride_rope + rope_off, ROPE_ALIGN)
    rope = tl.load(rope_ptr + rope_row[:, None] + offs_r[None, :], mask=rmask,
                   other=0.0)
    tl.store(out_row + D_V + offs_r[None, :], rope, mask=rmask)

    # ---- index key: D_IDX fp8 bytes + one float32 scale per token ----
    offs_d = tl.arange(0, D_IDX)
    key = tl.load(ik_ptr + page[:, None] * stride_ik_page + in_page[:, None] * D_IDX + offs_d[None, :],
                  mask=valid[:, None], other=0)
    tl.store(out_k_ptr + dst[:, None] * D_IDX + offs_d[None, :], key, mask=valid[:, None])
    ks = tl.load(iks_ptr + page * stride_iks_page + (PAGE * D_IDX) // 4 + in_page, mask=valid,
                 other=0.0)
    tl.store(out_ks_ptr + dst, ks, mask=valid)


#: tokens per gather program
GATHER_BLOCK_T = 16


def ragged_gather(kv_rows: torch.Tensor, index_cache: torch.Tensor, block_table: torch.Tensor,
                  lens: torch.Tensor, cu: torch.Tensor, out: torch.Tensor, out_keys: torch.Tensor,
                  out_key_scales: torch.Tensor, *, page_size: int, d_nope: int, d_rope: int,
                  max_len: int) -> torch.Tensor:
    """Gathers requests' paged KV and index keys into contiguous ragged buffers (one Triton launch).

    Args:
        kv_rows: the layer's paged KV as flat rows: uint8 ``[S, row_bytes]`` ``fp8_ds_mla``
            (dequantized here) or bf16 ``[S, d_nope + d_rope]``; ``S = num_pages * page_size``.
        index_cache: fp8 index-key pages uint8 ``[num_pages, page_size * (D + 4)]``
            (``IndexKeyCache.data``).
        block_table: int32 ``[B, max_pages]``.
        lens: int32 ``[B]`` tokens to gather per request; cu: int32 ``[B]`` first ragged row of
            each request.
        out: bf16 ``[N, d_nope + d_rope]``; out_keys: uint8 ``[N, D]``; out_key_scales: float32
            ``[N]`` (all contiguous).
        page_size, d_nope, d_rope: geometry; max_len: ``max(lens)`` (sizes the grid, no sync).
    Returns:
        ``out`` (row ``cu[r] + t`` = token ``t`` of request ``r`` as bf16; fp8 values are
        ``fp8 * scale`` rounded to bf16); ``out_keys`` / ``out_key_scales`` filled alongside.
    """
    B = block_table.shape[0]
    D = out_keys.shape[1]
    if kv_rows.dtype == torch.uint8:
        rb = kv_format.fp8_ds_mla_offsets(d_nope, d_rope)[2]
        if kv_rows.shape[1] != rb:
            raise ValueError(f"fp8_ds_mla rows must be {rb} bytes, got {kv_rows.shape[1]}")
        kind = "fp8_ds_mla"
        nope_t, scale_t, rope_t = kv_rows, kv_rows.view(torch.float32), kv_rows.view(torch.bfloat16)
    elif kv_rows.dtype == torch.bfloat16 and kv_rows.shape[1] == d_nope + d_rope:
        kind = "bf16"
        nope_t, scale_t, rope_t = kv_rows, kv_rows, kv_rows
    else:
        raise ValueError(f"kv_rows must be fp8_ds_mla uint8 or bf16 [S, {d_nope + d_rope}] rows")
    if index_cache.dtype != torch.uint8 or index_cache.shape[1] != page_size * (D + 4):
        raise ValueError(f"index_cache must be fp8 pages uint8 [pages, {page_size * (D + 4)}]")
    if D < 16 or D & (D - 1):
        raise ValueError(f"index_dim must be a power of two >= 16, got {D}")
    if not (out.is_contiguous() and out_keys.is_contiguous() and out_key_scales.is_contiguous()):
        raise ValueError("out buffers must be contiguous")
    if B == 0 or max_len == 0:
        return out
    rows = _row_views(kind, kv_rows.stride(0), d_nope, d_rope)
    _ragged_gather_kernel[(B, triton.cdiv(max_len, GATHER_BLOCK_T))](
        nope_t, rows["stride_nope"], scale_t, rows["stride_scale"], rows["scale_off"],
        rope_t, rows["stride_rope"], rows["rope_off"],
        index_cache, index_cache.view(torch.float32), index_cache.stride(0), index_cache.stride(0) // 4,
        block_table, block_table.stride(0), lens, cu,
        out, out.stride(0), out_keys, out_key_scales,
        **_constexprs(kind, rows, page_size, d_nope, d_rope, D), num_warps=4)
    return out


def _row_views(kind: str, row_stride: int, d_nope: int, d_rope: int) -> dict:
    """Row strides and offsets, in elements of each view, of ``kind`` rows of ``row_stride``
    elements (bytes for fp8_ds_mla): the NoPE part (the rows themselves), the fp8 scales (a
    float32 view; 0 for bf16 rows) and the rope part (a bf16 view)."""
    if kind == "fp8_ds_mla":
        scales_start, rope_start, _ = kv_format.fp8_ds_mla_offsets(d_nope, d_rope)
        return dict(stride_nope=row_stride, stride_scale=row_stride // 4,
                    scale_off=scales_start // 4, stride_rope=row_stride // 2,
                    rope_off=rope_start // 2)
    return dict(stride_nope=row_stride, stride_scale=0, scale_off=0, stride_rope=row_stride,
                rope_off=d_nope)


def _constexprs(kind: str, rows: dict, page_size: int, d_nope: int, d_rope: int,
                index_dim: int) -> dict:
    """The kernel's compile-time arguments for ``kind`` rows with the views ``rows``
    (:func:`_row_views`), the alignments included."""
    d_v_pad = triton.next_power_of_2(d_nope)
    return dict(PAGE=page_size, D_V=d_nope, D_V_PAD=d_v_pad, G=max(1, d_v_pad // 128),
                D_ROPE=d_rope, D_ROPE_PAD=max(16, triton.next_power_of_2(max(d_rope, 1))),
                D_IDX=index_dim, IS_FP8=kind == "fp8_ds_mla", BLOCK_T=GATHER_BLOCK_T,
                NOPE_ALIGN=kv_format.row_alignment(rows["stride_nope"]),
                SCALE_ALIGN=kv_format.row_alignment(rows["stride_scale"], rows["scale_off"]),
                ROPE_ALIGN=kv_format.row_alignment(rows["stride_rope"], rows["rope_off"]))


def compile_for_sm90(kv_dtype: str = "fp8_ds_mla", *, d_nope: int = 512, d_rope: int = 64,
                     index_dim: int = 128, page_size: int = 64):
    """The gather kernel compiled by the installed Triton for sm_90a without a GPU (a
    ``triton.compiler.CompiledKernel``: ``asm["ptx"]``, ...) for ``kv_dtype`` rows
    (``"fp8_ds_mla"`` or ``"bf16"``) of ``d_nope + d_rope`` dims, with the strides, offsets
    and divisibility a launch on a contiguous cache of such rows has. For inspecting the row
    loads' vector widths, not for running it."""
    from backends.kernels.compile_target import compile_for_target
    if kv_dtype not in ("fp8_ds_mla", "bf16"):
        raise ValueError(f"kv_dtype must be 'fp8_ds_mla' or 'bf16', got {kv_dtype!r}")
    fp8 = kv_dtype == "fp8_ds_mla"
    row_stride = kv_format.fp8_ds_mla_offsets(d_nope, d_rope)[2] if fp8 else d_nope + d_rope
    rows = _row_views(kv_dtype, row_stride, d_nope, d_rope)
    ints = dict(rows, stride_ik_page=page_size * (index_dim + 4),
                stride_iks_page=page_size * (index_dim + 4) // 4, stride_bt=64,
                stride_out=d_nope + d_rope)
    ptrs = dict(nope_ptr="*u8" if fp8 else "*bf16", scale_ptr="*fp32" if fp8 else "*bf16",
                rope_ptr="*bf16", ik_ptr="*u8", iks_ptr="*fp32", bt_ptr="*i32", len_ptr="*i32",
                cu_ptr="*i32", out_ptr="*bf16", out_k_ptr="*u8", out_ks_ptr="*fp32")
    return compile_for_target(_ragged_gather_kernel,
                              _constexprs(kv_dtype, rows, page_size, d_nope, d_rope, index_dim),
                              ptrs, [n for n, v in ints.items() if v % 16 == 0], num_warps=4)
