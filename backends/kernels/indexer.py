"""Lightning-indexer logits (Triton): ``logits[r, t] = sum_h w[r, h] * relu(q[r, h] . k_t)``.

Two entry points share one kernel:

* ``indexer_logits_paged`` (decode): keys from the paged index-key cache
  (``harness/index_cache.py``: fp8 pages ``uint8 [pages, P*(D+4)]`` or bf16 ``[pages, P, D]``)
  through a block table; output ``[B, max_len]``.
* ``indexer_logits_ragged`` (extend): keys from a concatenated buffer ``[N, D]`` (bf16, or fp8
  values + float32 scales), row ``r`` over keys ``[ks[r], ke[r])``; output ``[M, max_len]`` with
  column ``j`` = key ``ks[r] + j``.

Columns past a row's length are ``-inf``.

Kernel: one program = one query row x a run of tokens; per tile of ``BLOCK_N`` tokens it loads
the keys ``[BLOCK_N, D]``, computes ``S = K @ Q^T`` (``[BLOCK_N, H]``, tensor cores, float32
accumulation), applies ReLU, the head weights and the per-token scale, and sums over heads.
Keys come by per-thread pointer loads (Triton's pipeliner turns them into async copies) or,
``IndexerLaunch(tma=True)``, by bulk tensor copies through a host ``TensorDescriptor`` (no
allocator needed); a paged tile is one block-table read when it lies in one page, one per page
when it is 2 or 4 whole pages, else one per token.

fp8 handling: the key bytes are read through a float8_e4m3fn view (Triton float8e4nv) and
converted to float16 in registers (exact: every e4m3 value is a float16), so the kernel reads
132 B per token (D=128) and never materialises a dequantized copy. bf16 keys are brought to
float16 exactly the same way as the query below (a per-token power of two, undone after the
head sum). The bf16 query is brought to float16 exactly by scaling each head by a power
of two (so its largest element is in [2^14, 2^15)); the inverse power of two goes into that
head's weight. Since ``relu(c*x) = c*relu(x)`` for ``c > 0``, the per-token key scale is applied
once per token after the head sum. The same code runs on the GPU and in the Triton interpreter.

Query precision (``query_dtype``, a semantic option: it changes the logits slightly):

* ``"bf16"`` (default): the exact bf16 query as above; the fp8 keys are converted in registers
  and the MMA is float16 x float16.
* ``"fp8"``: what upstream serves DeepSeek-V3.2 with (vLLM's indexer quantizes the query per
  token and head, group 128 = the head dim, with power-of-two "ue8m0" scales, folds the scale
  into the head weights, and DeepGEMM's ``fp8_paged_mqa_logits`` runs an fp8 x fp8 wgmma): each
  program quantizes its row's query by ``quantize_index_query``'s rule in registers (no extra
  launch), folds the scale into the head weight, and the MMA is float8e4nv x float8e4nv with
  float32 accumulation on the fp8 keys as read (no conversion; with TMA straight from shared
  memory). With bf16 keys the fp8 query is widened to float16 (exact) and the bf16 key path
  is unchanged. On sm_90 Triton's default for fp8 dots (``max_num_imprecise_acc`` 2^30) keeps
  the tensor core's fp8 accumulation over the 128-wide dot, as DeepGEMM does. The GPU's float8
  cast rounds to nearest even; the interpreter's truncates, so on CPU launches the kernel
  rounds first (``ROUND_FP8``): the one place the two runs take different code.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

_SCALE_BYTES = 4
#: largest finite float8_e4m3fn value
_FP8_MAX = 448.0
#: smallest query-head amax a scale is taken from (upstream's eps): all-zero heads stay finite
_Q_AMAX_EPS = 1e-10
#: the query precisions of ``query_dtype``
QUERY_DTYPES = ("bf16", "fp8")


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@functools.lru_cache(maxsize=None)
def _num_sms_cached(device_type: str, index: Optional[int]) -> int:
    if device_type == "cuda":
        return torch.cuda.get_device_properties(index or 0).multi_processor_count
    return 132


def _num_sms(device: torch.device) -> int:
    return _num_sms_cached(device.type, device.index)


@triton.jit
def _pow2_to_f16(x, axis: tl.constexpr):
    """float32 ``x`` -> ``(x * 2^m_i as float16, 2^-m_i)`` per slice ``i`` along ``axis``.

    ``m_i`` puts the slice's largest magnitude into [2^14, 2^15), so bf16-representable values
    convert exactly (only values below 2^-29 of the slice maximum lose bits) and nothing
    overflows. Multiplying a dot product by ``2^-m_i`` undoes the scaling exactly.
    """
    amax = tl.max(tl.abs(x), axis=axis)
    e_amax = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    e_mul = tl.minimum(tl.maximum(268 - e_amax, 1), 253)
    mul = (e_mul << 23).to(tl.float32, bitcast=True)
    inv = ((254 - e_mul) << 23).to(tl.float32, bitcast=True)
    return (x * tl.expand_dims(mul, axis)).to(tl.float16), inv


@triton.jit
def _fp8_ue8m0(x, axis: tl.constexpr, ROUND: tl.constexpr):
    """float32 ``x`` -> ``(x / s_i as float8e4nv, s_i)`` per slice ``i`` along ``axis``.

    ``s_i = 2^ceil(log2(max(amax_i, 1e-10) / 448))`` (``quantize_index_query``'s rule), taken
    exactly from amax's exponent and mantissa: ``amax = m 2^E`` with ``m`` in [1, 2) gives
    ``amax / 448 = (m / 7) 2^(E - 6)``, so ``s = 2^(E - 8)`` for ``m <= 1.75``, else ``2^(E - 7)``.
    ``x / s_i`` is then exact (a power of two) and at most 448 in magnitude; the GPU's float8
    cast rounds it to nearest even. ROUND (for the Triton interpreter, whose float8 casts
    truncate): round to the e4m3 grid (3 mantissa bits; steps of 2^-9 below 2^-6) to nearest
    even first, in float32 arithmetic: adding and subtracting a power of two whose float32
    spacing is that grid's step, so the cast is exact.
    """
    amax = tl.maximum(tl.max(tl.abs(x), axis=axis), 1e-10)
    bits = amax.to(tl.int32, bitcast=True)
    e_s = (bits >> 23) - 8 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)  # biased exponent of s
    scale = (e_s << 23).to(tl.float32, bitcast=True)
    inv = ((254 - e_s) << 23).to(tl.float32, bitcast=True)
    xs = x * tl.expand_dims(inv, axis)
    if ROUND:
        a = tl.abs(xs)
        # 2^max(floor(log2 a), -6), then 2^20 times it: its float32 step is e4m3's at a
        e = tl.maximum(a.to(tl.int32, bitcast=True) & 0x7F800000, 121 << 23)
        c = (e + (20 << 23)).to(tl.float32, bitcast=True)
        r = (a + c) - c
        xs = tl.where(xs < 0, -r, r)
    return xs.to(tl.float8e4nv), scale


@triton.jit
def _tile_pages(bt_row, t0, t, length, PAGE: tl.constexpr, PAGES_PER_TILE: tl.constexpr):
    """int64 physical page of a tile's tokens ``t = t0 + arange(BLOCK_N)``; 0 for tokens at or
    past ``length`` (never read). PAGES_PER_TILE 1: a scalar (the tile lies in one page, one
    block-table read); n >= 2: one per token from n scalar reads (the tile is n whole pages);
    0: one block-table read per token."""
    if PAGES_PER_TILE == 1:
        page = tl.load(bt_row + t0 // PAGE, mask=t0 < length, other=0).to(tl.int64)
    elif PAGES_PER_TILE > 1:
        page = tl.zeros(t.shape, tl.int64)
        for j in tl.static_range(PAGES_PER_TILE):
            pj = tl.load(bt_row + t0 // PAGE + j, mask=t0 + j * PAGE < length, other=0)
            page = tl.where((t - t0) // PAGE == j, pj.to(tl.int64), page)
    else:
        page = tl.load(bt_row + t // PAGE, mask=t < length, other=0).to(tl.int64)
    return page


@triton.jit
def _tma_page(k_desc, bt_row, t0, j, length, PAGE: tl.constexpr, D: tl.constexpr):
    """Keys ``[PAGE, D]`` of logical page ``t0 // PAGE + j`` (page 0 when it starts at or past
    ``length``: read, never used) through the ``[1, PAGE, D]`` box of ``k_desc``."""
    page = tl.load(bt_row + t0 // PAGE + j, mask=t0 + j * PAGE < length, other=0)
    return k_desc.load([page, 0, 0]).reshape(PAGE, D)


@triton.jit
def _tma_tile(k_desc, bt_row, t0, length, PAGE: tl.constexpr, PAGES_PER_TILE: tl.constexpr,
              BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Keys ``[BLOCK_N, D]`` of the paged tile at token ``t0`` by bulk tensor copies: one
    ``[1, BLOCK_N, D]`` box at ``(page, t0 % PAGE, 0)`` (PAGES_PER_TILE 1), else one
    ``[1, PAGE, D]`` box per page (2 or 4), stacked in token order."""
    if PAGES_PER_TILE == 1:
        page = tl.load(bt_row + t0 // PAGE, mask=t0 < length, other=0)
        k = k_desc.load([page, t0 % PAGE, 0]).reshape(BLOCK_N, D)
    elif PAGES_PER_TILE == 2:
        k01 = tl.join(_tma_page(k_desc, bt_row, t0, 0, length, PAGE, D),
                      _tma_page(k_desc, bt_row, t0, 1, length, PAGE, D))  # [PAGE, D, 2]
        k = tl.permute(k01, (2, 0, 1)).reshape(BLOCK_N, D)
    else:
        tl.static_assert(PAGES_PER_TILE == 4, "TMA tiles are 1, 2 or 4 pages")
        k01 = tl.join(_tma_page(k_desc, bt_row, t0, 0, length, PAGE, D),
                      _tma_page(k_desc, bt_row, t0, 1, length, PAGE, D))
        k23 = tl.join(_tma_page(k_desc, bt_row, t0, 2, length, PAGE, D),
                      _tma_page(k_desc, bt_row, t0, 3, length, PAGE, D))
        # [PAGE, D, j, i] holds page 2 i + j
        k = tl.permute(tl.join(k01, k23), (3, 2, 0, 1)).reshape(BLOCK_N, D)
    return k


@triton.jit
def _tile_scales(s_ptr, page, t, start, length, stride_spage, PAGE: tl.constexpr,
                 D: tl.constexpr, PAGED: tl.constexpr):
    """float32 fp8 scales of the tokens ``t`` (1.0 past ``length``: those logits become -inf)."""
    if PAGED:
        s_off = page * stride_spage + (PAGE * D) // 4 + t % PAGE
    else:
        s_off = (start + t).to(tl.int64)
    return tl.load(s_ptr + s_off, mask=t < length, other=1.0)


@triton.jit
def _indexer_logits_kernel(
        q_ptr, w_ptr, k_ptr, k_desc, s_ptr, bt_ptr, start_ptr, len_ptr, out_ptr,
        stride_qm, stride_qh, stride_wm, stride_bt, stride_kpage, stride_spage, stride_kn,
        stride_om, max_len, tiles_per_prog,
        H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
        KV_FP8: tl.constexpr, PAGED: tl.constexpr, PAGES_PER_TILE: tl.constexpr,
        PREFETCH: tl.constexpr, TMA: tl.constexpr, Q_FP8: tl.constexpr,
        ROUND_FP8: tl.constexpr):
    """Logits of one query row for ``tiles_per_prog`` tiles of ``BLOCK_N`` tokens.

    PAGED: key of token t at page ``bt[row, t // PAGE]``, in-page slot ``t % PAGE``; fp8 values at
    byte ``page * stride_kpage + slot * D``, scale at float ``page * stride_spage + PAGE*D/4 + slot``;
    bf16 at element ``page * stride_kpage + slot * D``. Ragged: key row ``start[row] + t`` at
    ``(start + t) * stride_kn``, scale at ``start + t``. Row length: ``len[row]`` (paged) or
    ``len[row] - start[row]`` (ragged: ``len_ptr`` holds ``ke``). PAGES_PER_TILE: see
    ``_tile_pages``.

    TMA: the keys come through the host tensor descriptor ``k_desc`` (a bulk tensor copy of
    the tile instead of per-thread loads; ``k_ptr`` unused): paged, ``_tma_tile`` over the
    ``[pages, PAGE, D]`` key view (PAGES_PER_TILE 1, 2 or 4); ragged, a ``[BLOCK_N, D]`` box
    at row ``start + t0`` of ``[N, D]`` (rows past N read as zero). Rows past the length are read too; their logits are replaced by -inf.

    Q_FP8: the query ``[H, D]`` is quantized to float8e4nv per head (``_fp8_ue8m0``), its scale
    folded into the head weight; with fp8 keys the dot is fp8 x fp8 (float32 accumulation) on
    the keys as loaded, with bf16 keys the fp8 query is widened to float16. Else the bf16 query
    is brought to float16 exactly (``_pow2_to_f16``). ROUND_FP8: ``_fp8_ue8m0``'s ROUND (CPU
    launches, the interpreter; the GPU's cast rounds by itself).

    PREFETCH (fp8 keys; no effect on bf16): the fp8 scales are read one tile ahead (their
    block-table entries, read separately, two tiles ahead) and carried in registers, so their
    latency does not sit between two tiles: Triton's pipeliner stages only the key and
    block-table loads (they feed the dot), and without this the scale load waits in every
    iteration.
    """
    row = tl.program_id(0)
    t_begin = tl.program_id(1) * tiles_per_prog * BLOCK_N
    if PAGED:
        start = 0
        length = tl.load(len_ptr + row)
    else:
        start = tl.load(start_ptr + row)
        length = tl.load(len_ptr + row) - start
    length = tl.minimum(tl.maximum(length, 0), max_len)
    out_row = out_ptr + row.to(tl.int64) * stride_om
    bt_row = bt_ptr + row.to(tl.int64) * stride_bt
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    offs_h = tl.arange(0, H)

    n_valid_tiles = tl.minimum(tl.cdiv(tl.maximum(length - t_begin, 0), BLOCK_N), tiles_per_prog)
    if n_valid_tiles > 0:
        q = tl.load(q_ptr + row.to(tl.int64) * stride_qm + offs_h[:, None] * stride_qh
                    + offs_d[None, :]).to(tl.float32)
        w = tl.load(w_ptr + row.to(tl.int64) * stride_wm + offs_h)
        if Q_FP8:
            q8, q_scale = _fp8_ue8m0(q, 1, ROUND_FP8)
            w = w * q_scale
            if KV_FP8:
                qt = tl.trans(q8)  # [D, H] float8e4nv
            else:
                qt = tl.trans(q8.to(tl.float16))  # [D, H] float16, exact
        else:
            qt, q_inv = _pow2_to_f16(q, 1)
            qt = tl.trans(qt)  # [D, H] float16
            w = w * q_inv
        if PREFETCH and KV_FP8:
            # fp8 scales one tile ahead, their block-table entries two tiles ahead (own reads)
            page0 = 0
            page_s = 0
            if PAGED:
                page0 = _tile_pages(bt_row, t_begin, t_begin + offs_n, length, PAGE, PAGES_PER_TILE)
                page_s = _tile_pages(bt_row, t_begin + BLOCK_N, t_begin + BLOCK_N + offs_n,
                                     length, PAGE, PAGES_PER_TILE)
            scale_nxt = _tile_scales(s_ptr, page0, t_begin + offs_n, start, length,
                                     stride_spage, PAGE, D, PAGED)
        for i in range(0, n_valid_tiles):
            t0 = t_begin + i * BLOCK_N
            t = t0 + offs_n
            valid = t < length
            page = 0
            if PAGED and (not TMA or (KV_FP8 and not PREFETCH)):  # key or scale addresses
                page = _tile_pages(bt_row, t0, t, length, PAGE, PAGES_PER_TILE)
            if PREFETCH and KV_FP8:
                scale = scale_nxt
                scale_nxt = _tile_scales(s_ptr, page_s, t + BLOCK_N, start, length,
                                         stride_spage, PAGE, D, PAGED)
                if PAGED:
                    page_s = _tile_pages(bt_row, t0 + 2 * BLOCK_N, t + 2 * BLOCK_N, length,
                                         PAGE, PAGES_PER_TILE)
            # rows past the length are left unfilled (or read anyway, TMA): each output row
            # depends only on its own key row, and those rows are replaced by -inf below
            if TMA:
                if PAGED:
                    k = _tma_tile(k_desc, bt_row, t0, length, PAGE, PAGES_PER_TILE, BLOCK_N, D)
                else:
                    k = k_desc.load([start + t0, 0])
            else:
                if PAGED:
                    if PAGES_PER_TILE == 1:
                        # the whole tile lies in one page: one block-table read, contiguous keys
                        k_off = page * stride_kpage + (t0 % PAGE + offs_n) * D
                    else:
                        k_off = page * stride_kpage + (t % PAGE) * D
                else:
                    k_off = (start + t).to(tl.int64) * stride_kn
                k = tl.load(k_ptr + k_off[:, None] + offs_d[None, :], mask=valid[:, None])
            if not KV_FP8:
                k, k_inv = _pow2_to_f16(k.to(tl.float32), 1)
            elif not Q_FP8:
                k = k.to(tl.float16)  # float8e4nv -> float16, exact
            s = tl.dot(k, qt)  # [BLOCK_N, H] float32
            logit = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)
            if KV_FP8:
                if not PREFETCH:
                    scale = _tile_scales(s_ptr, page, t, start, length, stride_spage, PAGE, D,
                                         PAGED)
                logit = logit * scale
            else:
                logit = logit * k_inv
            tl.store(out_row + t, tl.where(valid, logit, float("-inf")), mask=t < max_len)
    # tiles of this program entirely past the row's length
    neg = tl.full([BLOCK_N], float("-inf"), tl.float32)
    for i in range(n_valid_tiles, tiles_per_prog):
        t = t_begin + i * BLOCK_N + offs_n
        tl.store(out_row + t, neg, mask=t < max_len)


# ----------------------------------------------------------------------------------------------
# Query quantization (query_dtype="fp8")
# ----------------------------------------------------------------------------------------------


def quantize_index_query(q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """fp8 index queries, one scale per (row, head): the rule of ``query_dtype="fp8"``.

    Upstream's (vLLM's DeepSeek-V3.2 indexer: ``per_token_group_quant_fp8`` over groups of the
    whole head dim with ``use_ue8m0``): ``s = 2^ceil(log2(max(amax, 1e-10) / 448))`` with
    ``amax`` the head's largest magnitude (a power of two, so ``q / s`` is exact and at most 448
    in magnitude), ``q_fp8 = float8_e4m3fn(clamp(q / s, -448, 448))`` rounded to nearest even.
    The kernel computes the same in registers (``_fp8_ue8m0``); this is its specification, used
    by the reference and the tests. Runs on any device.

    Args:
        q: float ``[..., D]`` (bfloat16 ``[rows, H, D]`` for the kernels).
    Returns:
        ``(q_fp8, scale)``: float8_e4m3fn ``[..., D]`` and float32 ``[...]``;
        ``q_fp8.float() * scale[..., None]`` is the quantized query.
    """
    x = q.float()
    amax = x.abs().amax(dim=-1).clamp_min(_Q_AMAX_EPS)
    m, e = torch.frexp(amax.double() / _FP8_MAX)  # amax / 448 = m 2^e, m in [0.5, 1), exact
    scale = torch.ldexp(torch.ones_like(m), e - (m == 0.5).to(e.dtype)).float()
    q_fp8 = (x / scale[..., None]).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    return q_fp8, scale


def _check_query_dtype(query_dtype: str) -> bool:
    """Whether ``query_dtype`` asks for the fp8 query; ValueError unless one of QUERY_DTYPES."""
    if not isinstance(query_dtype, str) or query_dtype not in QUERY_DTYPES:
        raise ValueError(f"query_dtype must be one of {', '.join(map(repr, QUERY_DTYPES))}, "
                         f"got {query_dtype!r}")
    return query_dtype == "fp8"


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------


def _check_q_w(q: torch.Tensor, weights: torch.Tensor) -> Tuple[int, int, int]:
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.dtype != torch.bfloat16:
        raise ValueError("q must be a bfloat16 [rows, H, D] tensor")
    R, H, D = q.shape
    if not _is_pow2(H) or H < 16 or not _is_pow2(D) or D < 16:
        raise ValueError(f"q heads H and dim D must be powers of two >= 16, got H={H}, D={D}")
    if D > 1 and q.stride(2) != 1:
        raise ValueError("q must be contiguous along its last dimension")
    if (not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32
            or weights.shape != (R, H)):
        raise ValueError(f"weights must be a float32 [{R}, {H}] tensor")
    if weights.stride(1) != 1:
        raise ValueError("weights must be contiguous along its last dimension")
    if weights.device != q.device:
        raise ValueError(f"weights is on {weights.device}, q on {q.device}")
    return R, H, D


def _check_int_vec(name: str, x: torch.Tensor, n: int, device: torch.device) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int32 or x.shape != (n,):
        raise ValueError(f"{name} must be an int32 tensor of shape [{n}]")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device}, q on {device}")


def paged_cache_geometry(k_cache: torch.Tensor, head_dim: int) -> Tuple[bool, int]:
    """``(is_fp8, page_size)`` of an index-key cache tensor; ValueError if it is neither layout."""
    if k_cache.dtype == torch.uint8 and k_cache.dim() == 2:
        bpt = head_dim + _SCALE_BYTES
        row = k_cache.shape[1]
        if row % bpt or not _is_pow2(row // bpt):
            raise ValueError(f"fp8 k_cache rows must be page_size * {bpt} bytes with a "
                             f"power-of-two page_size; got {row}")
        if not k_cache.is_contiguous():
            raise ValueError("k_cache must be contiguous")
        return True, row // bpt
    if k_cache.dtype == torch.bfloat16 and k_cache.dim() == 3 and k_cache.shape[2] == head_dim:
        if not _is_pow2(k_cache.shape[1]):
            raise ValueError(f"bf16 k_cache page size must be a power of two, got {k_cache.shape[1]}")
        if not k_cache.is_contiguous():
            raise ValueError("k_cache must be contiguous")
        return False, k_cache.shape[1]
    raise ValueError(f"k_cache must be uint8 [pages, P*({head_dim}+4)] (fp8) or bfloat16 "
                     f"[pages, P, {head_dim}]; got {k_cache.dtype} {tuple(k_cache.shape)}")


def _check_finite(name: str, x: torch.Tensor) -> None:
    if not bool(torch.isfinite(x.float()).all()):
        raise ValueError(f"{name} contains non-finite values")


def validate_indexer_paged_inputs(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor,
                                  block_table: torch.Tensor, seq_lens: torch.Tensor,
                                  max_len: Optional[int] = None) -> None:
    """Data checks for ``indexer_logits_paged`` (device sync; call outside timed regions).

    Raises ValueError for non-finite q / weights, non-finite or non-positive fp8 scales or
    non-finite keys in the pages the rows use, lengths < 0 or > ``max_len``, block tables too
    short for a row, or pages out of range.
    """
    R, H, D = _check_q_w(q, weights)
    is_fp8, P = paged_cache_geometry(k_cache, D)
    _check_finite("q", q)
    _check_finite("weights", weights)
    if bool((seq_lens < 0).any()):
        raise ValueError("seq_lens must be >= 0")
    if max_len is not None and R and int(seq_lens.max()) > max_len:
        raise ValueError(f"seq_lens exceed max_len={max_len}")
    need = (seq_lens.long() + P - 1) // P
    if bool((need > block_table.shape[1]).any()):
        raise ValueError("block_table has fewer pages than some row's seq_len needs")
    used = torch.arange(block_table.shape[1], device=q.device)[None, :] < need[:, None]
    pages = block_table.long()[used]
    if bool(((pages < 0) | (pages >= k_cache.shape[0])).any()):
        raise ValueError(f"block_table pages out of range [0, {k_cache.shape[0]})")
    used_pages = torch.unique(pages)
    if is_fp8:
        data = k_cache[used_pages]
        vals = data[:, : P * D].reshape(-1, D).view(torch.float8_e4m3fn)
        scales = data[:, P * D:].contiguous().view(torch.float32)
        _check_finite("k_cache values", vals)
        if not bool((torch.isfinite(scales) & (scales > 0)).all()):
            raise ValueError("k_cache scales must be finite and > 0")
    else:
        _check_finite("k_cache", k_cache[used_pages])


def validate_indexer_ragged_inputs(q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor,
                                   ks: torch.Tensor, ke: torch.Tensor,
                                   k_scales: Optional[torch.Tensor] = None,
                                   max_len: Optional[int] = None) -> None:
    """Data checks for ``indexer_logits_ragged`` (device sync; outside timed regions).

    Raises ValueError for non-finite q / weights / keys / scales, scales <= 0, or ranges with
    ``ks < 0``, ``ke < ks``, ``ke > N`` or ``ke - ks > max_len``.
    """
    _check_q_w(q, weights)
    _check_finite("q", q)
    _check_finite("weights", weights)
    if k.dtype in (torch.uint8, torch.float8_e4m3fn):
        _check_finite("k", k.view(torch.float8_e4m3fn))
        if not bool((torch.isfinite(k_scales) & (k_scales > 0)).all()):
            raise ValueError("k_scales must be finite and > 0")
    else:
        _check_finite("k", k)
    if bool(((ks < 0) | (ke < ks) | (ke > k.shape[0])).any()):
        raise ValueError(f"need 0 <= ks <= ke <= N={k.shape[0]}")
    if max_len is not None and ks.numel() and int((ke - ks).max()) > max_len:
        raise ValueError(f"ke - ks exceeds max_len={max_len}")


# ----------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------


def _launch_shape(rows: int, max_len: int, launch: "IndexerLaunch",
                  device: torch.device) -> Tuple[int, int]:
    """(tiles per program, programs per row): about ``launch.programs_per_sm`` programs per SM,
    each at most ``launch.max_tokens_per_program`` tokens (a power-of-two number of tiles)."""
    block_n = launch.block_n
    tiles = triton.cdiv(max(max_len, 1), block_n)
    if launch.tokens_per_program is not None:
        per_prog = max(1, launch.tokens_per_program // block_n)
        return per_prog, triton.cdiv(tiles, per_prog)
    max_tiles = max(1, launch.max_tokens_per_program // block_n)
    target = launch.programs_per_sm * _num_sms(device)
    per_prog = min(max_tiles, triton.next_power_of_2(max(1, triton.cdiv(rows * tiles, target))))
    return per_prog, triton.cdiv(tiles, per_prog)


def _alloc_out(out: Optional[torch.Tensor], rows: int, max_len: int,
               device: torch.device) -> torch.Tensor:
    if out is None:
        return torch.empty((rows, max_len), dtype=torch.float32, device=device)
    if out.dtype != torch.float32 or out.shape != (rows, max_len) or out.device != device \
            or (max_len > 1 and out.stride(1) != 1):
        raise ValueError(f"out must be a float32 [{rows}, {max_len}] tensor on {device}, "
                         f"contiguous along its last dimension")
    return out


#: most block-table reads of one tile in the whole-pages addressing (``_tile_pages``)
_MAX_PAGES_PER_TILE = 4


@dataclass(frozen=True)
class IndexerLaunch:
    """Launch configuration of the indexer kernel; the defaults were measured on an H200
    (``python -m harness.bench run indexer --variants`` times ``INDEXER_VARIANTS``; B=64, fp8
    keys, page 64: num_stages 5 gave 45 / 56 / 64 % of the copy ceiling at 8K / 32K / 128K
    where 3 gave 41 / 49 / 54 %; with TMA key loads, programs of up to 4096 tokens 70 / 78 % at
    32K / 128K where 2048 gave 67 / 77 %).

    block_n: tokens per tile (the MMA's M dimension); num_warps, num_stages: Triton's;
    max_tokens_per_program: most tokens one program scores; tile_in_page: page addressing by
    whole tiles: one block-table read per tile when ``page_size % block_n == 0``, one per page
    when the tile is 2 to 4 whole pages (``block_n % page_size == 0``); otherwise (or False) one
    per token; tma: keys through a host tensor descriptor (bulk tensor copies; paged caches
    need the whole-tile addressing; key rows 16-byte aligned); None (the default): wherever
    that holds on a CUDA device of compute capability 9 or more (H200, B=64, fp8 keys, page
    64: 67 / 77 % of the copy ceiling at 32K / 128K where pointer loads gave 56 / 63 %),
    else pointer loads; True: required (ValueError where it cannot); False: never; maxnreg: register cap per
    thread (None: the compiler's choice); prefetch: read the block table two tiles and the fp8
    scales one tile ahead (the kernel's ``PREFETCH``); None (the default): with the fp8 query
    only (H200, B=64, fp8 keys, page 64, fp8 query: 82.6 / 292.4 us at 32K / 128K with it, 85.3 /
    293.6 without; the bf16 query's TMA loads 92.3 / 92.8 us at 32K, no gain); programs_per_sm: programs launched per
    SM when the rows have enough tiles (fewer, longer programs as it drops);
    tokens_per_program: every program scores exactly this many tokens (a power of two; the
    last of a row fewer), overriding programs_per_sm and max_tokens_per_program.
    """

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 5
    max_tokens_per_program: int = 4096
    tile_in_page: bool = True
    maxnreg: Optional[int] = None
    prefetch: Optional[bool] = None
    programs_per_sm: int = 4
    tokens_per_program: Optional[int] = None
    tma: Optional[bool] = None

    def __post_init__(self):
        for name in ("block_n", "max_tokens_per_program", "tokens_per_program"):
            v = getattr(self, name)
            if v is None and name == "tokens_per_program":
                continue
            if not isinstance(v, int) or not _is_pow2(v) or v < 16:
                raise ValueError(f"IndexerLaunch.{name} must be a power of two >= 16, got {v!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"IndexerLaunch.num_warps must be one of 1, 2, 4, 8, 16, "
                             f"got {self.num_warps!r}")
        for name in ("num_stages", "programs_per_sm"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"IndexerLaunch.{name} must be an int >= 1, got {v!r}")
        if not isinstance(self.tile_in_page, bool):
            raise ValueError(f"IndexerLaunch.tile_in_page must be True or False, "
                             f"got {self.tile_in_page!r}")
        if self.prefetch is not None and not isinstance(self.prefetch, bool):
            raise ValueError(f"IndexerLaunch.prefetch must be True, False or None (with the fp8 "
                             f"query), got {self.prefetch!r}")
        if self.tma is not None and not isinstance(self.tma, bool):
            raise ValueError(f"IndexerLaunch.tma must be True, False or None (where it works), "
                             f"got {self.tma!r}")

    def prefetch_for(self, query_fp8: bool) -> bool:
        """Whether the kernel prefetches (``prefetch``, None: with the fp8 query)."""
        return query_fp8 if self.prefetch is None else self.prefetch

    def use_tma(self, device: torch.device, supported: bool) -> bool:
        """Whether a launch on ``device`` loads keys by TMA: ``tma`` when given, else when
        ``supported`` (addressing and alignment allow it) on CUDA of capability 9 or more."""
        if self.tma is not None:
            return self.tma
        return (supported and device.type == "cuda"
                and torch.cuda.get_device_capability(device)[0] >= 9)

    def pages_per_tile(self, page_size: int) -> int:
        """The kernel's ``PAGES_PER_TILE`` for ``page_size``-token pages (``_tile_pages``)."""
        if not self.tile_in_page:
            return 0
        if page_size % self.block_n == 0:
            return 1
        n = self.block_n // page_size
        return n if 2 <= n <= _MAX_PAGES_PER_TILE else 0

    def options(self) -> dict:
        """Triton launch options."""
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        return opts if self.maxnreg is None else {**opts, "maxnreg": self.maxnreg}


def _tma_aligned(keys: torch.Tensor, strides) -> bool:
    """Whether ``keys`` (viewed with element ``strides``) has the 16-byte alignment TMA needs."""
    nbytes = keys.element_size()
    return keys.data_ptr() % 16 == 0 and all((st * nbytes) % 16 == 0 for st in strides[:-1])


def _key_descriptor(keys: torch.Tensor, shape, strides, block_shape) -> TensorDescriptor:
    """Host tensor descriptor of ``keys`` viewed as ``shape`` / ``strides`` (elements), after
    the alignment TMA needs (else ValueError naming ``IndexerLaunch.tma``)."""
    if not _tma_aligned(keys, strides):
        raise ValueError(f"IndexerLaunch.tma needs a 16-byte aligned key buffer and row strides "
                         f"of 16-byte multiples; got strides {list(strides)} x "
                         f"{keys.element_size()} B")
    return TensorDescriptor(base=keys, shape=list(shape), strides=list(strides),
                            block_shape=list(block_shape))


def indexer_logits_paged(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor,
                         block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                         max_len: Optional[int] = None, out: Optional[torch.Tensor] = None,
                         check: bool = False, query_dtype: str = "bf16",
                         launch: IndexerLaunch = IndexerLaunch()) -> torch.Tensor:
    """Indexer logits of one decode query per request over its paged index keys.

    Args:
        q: bfloat16 ``[B, H, D]`` index queries (H, D powers of two >= 16; e.g. 64 x 128).
        weights: float32 ``[B, H]`` per-head weights (any softmax / head scales folded in).
        k_cache: fp8 ``uint8 [num_pages, P*(D+4)]`` or bf16 ``[num_pages, P, D]`` (see
            ``harness.index_cache``); ``P`` is inferred and must be a power of two.
        block_table: int32 ``[B, max_pages]`` physical page of each logical page.
        seq_lens: int32 ``[B]`` tokens per request.
        max_len: output width, ``>= max(seq_lens)`` (default: ``max(seq_lens)``, a host sync).
        out: optional float32 ``[B, max_len]`` output.
        check: run ``validate_indexer_paged_inputs`` first (device sync).
        query_dtype: ``"bf16"`` (default): the query as given; ``"fp8"``: the query quantized
            per (row, head) by ``quantize_index_query`` (upstream's indexer numerics; module
            docstring), the fp8 keys taken by the MMA as they are.
        launch: the kernel's launch configuration.
    Returns:
        float32 ``[B, max_len]``: ``logits[b, t] = sum_h w[b,h] relu(q[b,h] . k_t)`` for
        ``t < seq_lens[b]``, ``-inf`` after (``q`` the quantized query with ``"fp8"``).
    """
    q_fp8 = _check_query_dtype(query_dtype)
    B, H, D = _check_q_w(q, weights)
    is_fp8, P = paged_cache_geometry(k_cache, D)
    dev = q.device
    if k_cache.device != dev:
        raise ValueError(f"k_cache is on {k_cache.device}, q on {dev}")
    if (not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32
            or block_table.dim() != 2 or block_table.shape[0] != B or block_table.device != dev):
        raise ValueError(f"block_table must be an int32 [{B}, max_pages] tensor on {dev}")
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        raise ValueError("block_table must be contiguous along its last dimension")
    _check_int_vec("seq_lens", seq_lens, B, dev)
    if max_len is not None and (not isinstance(max_len, int) or max_len < 0):
        raise ValueError(f"max_len must be an int >= 0, got {max_len!r}")
    if check:
        validate_indexer_paged_inputs(q, weights, k_cache, block_table, seq_lens, max_len)
    if max_len is None:
        max_len = int(seq_lens.max().item()) if B else 0
    out = _alloc_out(out, B, max_len, dev)
    if B == 0 or max_len == 0:
        return out
    if is_fp8:
        k_vals = k_cache.view(torch.float8_e4m3fn)
        k_scl = k_cache.view(torch.float32)
        stride_kpage, stride_spage = k_cache.stride(0), k_cache.stride(0) // _SCALE_BYTES
    else:
        k_vals, k_scl = k_cache, weights  # scale pointer unused
        stride_kpage, stride_spage = k_cache.stride(0), 0
    pages_per_tile = launch.pages_per_tile(P)
    k_desc = None
    tma = launch.use_tma(dev, pages_per_tile > 0
                         and _tma_aligned(k_vals, (stride_kpage, D, 1)))
    if tma:
        if pages_per_tile == 0:
            raise ValueError(f"IndexerLaunch.tma needs tile_in_page=True and page_size % block_n "
                             f"== 0 or block_n = 2 or 4 pages; got page_size={P}, "
                             f"block_n={launch.block_n}, tile_in_page={launch.tile_in_page}")
        k_desc = _key_descriptor(k_vals, (k_cache.shape[0], P, D), (stride_kpage, D, 1),
                                 (1, min(launch.block_n, P), D))
    per_prog, n_split = _launch_shape(B, max_len, launch, dev)
    _indexer_logits_kernel[(B, n_split)](
        q, weights, k_vals, k_desc, k_scl, block_table, seq_lens, seq_lens, out,
        q.stride(0), q.stride(1), weights.stride(0), block_table.stride(0),
        stride_kpage, stride_spage, D, out.stride(0), max_len, per_prog,
        H=H, D=D, PAGE=P, BLOCK_N=launch.block_n, KV_FP8=is_fp8, PAGED=True,
        PAGES_PER_TILE=pages_per_tile, PREFETCH=launch.prefetch_for(q_fp8), TMA=tma, Q_FP8=q_fp8,
        ROUND_FP8=dev.type != "cuda", **launch.options())
    return out


def indexer_logits_ragged(q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor,
                          ks: torch.Tensor, ke: torch.Tensor, *,
                          k_scales: Optional[torch.Tensor] = None, max_len: Optional[int] = None,
                          out: Optional[torch.Tensor] = None, check: bool = False,
                          query_dtype: str = "bf16",
                          launch: IndexerLaunch = IndexerLaunch()) -> torch.Tensor:
    """Indexer logits of extend queries over a concatenated key buffer (causal ranges).

    Args:
        q: bfloat16 ``[M, H, D]``; weights: float32 ``[M, H]``.
        k: ``[N, D]`` keys: bfloat16, or fp8 values (uint8 / float8_e4m3fn) with ``k_scales``.
        ks, ke: int32 ``[M]``: row ``r`` scores keys ``[ks[r], ke[r])``.
        k_scales: float32 ``[N]`` per-key scales (fp8 keys only).
        max_len: output width ``>= max(ke - ks)`` (default: that maximum, a host sync).
        out: optional float32 ``[M, max_len]`` output.
        check: run ``validate_indexer_ragged_inputs`` first (device sync).
        query_dtype: ``"bf16"`` or ``"fp8"``, as for ``indexer_logits_paged``.
        launch: the kernel's launch configuration (``tile_in_page`` does not apply).
    Returns:
        float32 ``[M, max_len]``; column ``j`` holds key ``ks[r] + j``; ``-inf`` for
        ``j >= ke[r] - ks[r]``.
    """
    q_fp8 = _check_query_dtype(query_dtype)
    M, H, D = _check_q_w(q, weights)
    dev = q.device
    if not isinstance(k, torch.Tensor) or k.dim() != 2 or k.shape[1] != D or k.device != dev:
        raise ValueError(f"k must be a [N, {D}] tensor on {dev}")
    if k.stride(1) != 1:
        raise ValueError("k must be contiguous along its last dimension")
    is_fp8 = k.dtype in (torch.uint8, torch.float8_e4m3fn)
    if is_fp8:
        if (not isinstance(k_scales, torch.Tensor) or k_scales.dtype != torch.float32
                or k_scales.shape != (k.shape[0],) or k_scales.device != dev):
            raise ValueError(f"fp8 k needs k_scales: a float32 [{k.shape[0]}] tensor on {dev}")
        if k_scales.stride(0) != 1:
            raise ValueError("k_scales must be contiguous")
        k = k.view(torch.float8_e4m3fn)
    elif k.dtype != torch.bfloat16:
        raise ValueError(f"k must be bfloat16, uint8 or float8_e4m3fn, got {k.dtype}")
    elif k_scales is not None:
        raise ValueError("k_scales is only for fp8 keys")
    _check_int_vec("ks", ks, M, dev)
    _check_int_vec("ke", ke, M, dev)
    if max_len is not None and (not isinstance(max_len, int) or max_len < 0):
        raise ValueError(f"max_len must be an int >= 0, got {max_len!r}")
    if check:
        validate_indexer_ragged_inputs(q, weights, k, ks, ke, k_scales, max_len)
    if max_len is None:
        max_len = max(int((ke - ks).max().item()), 0) if M else 0
    out = _alloc_out(out, M, max_len, dev)
    if M == 0 or max_len == 0:
        return out
    k_desc = None
    tma = launch.use_tma(dev, _tma_aligned(k, k.stride()))
    if tma:
        k_desc = _key_descriptor(k, k.shape, k.stride(), (launch.block_n, D))
    per_prog, n_split = _launch_shape(M, max_len, launch, dev)
    _indexer_logits_kernel[(M, n_split)](
        q, weights, k, k_desc, k_scales if is_fp8 else weights, ks, ks, ke, out,
        q.stride(0), q.stride(1), weights.stride(0), 0, 0, 0, k.stride(0), out.stride(0),
        max_len, per_prog,
        H=H, D=D, PAGE=1, BLOCK_N=launch.block_n, KV_FP8=is_fp8, PAGED=False,
        PAGES_PER_TILE=0, PREFETCH=launch.prefetch_for(q_fp8), TMA=tma, Q_FP8=q_fp8,
        ROUND_FP8=dev.type != "cuda", **launch.options())
    return out


def pad_index_heads(q: torch.Tensor, w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Zero-pads index heads to ``max(16, next_pow2(H))`` (the indexer kernel's minimum).

    A padded head has q = 0 and weight 0, so it adds exactly 0 to every logit.
    q bf16 ``[M, H, D]``, w float32 ``[M, H]`` -> ``[M, Hp, D]``, ``[M, Hp]`` (contiguous).
    """
    M, H, D = q.shape
    Hp = max(16, triton.next_power_of_2(H))
    if Hp == H:
        return q.contiguous(), w.contiguous()
    qp = torch.zeros(M, Hp, D, dtype=q.dtype, device=q.device)
    wp = torch.zeros(M, Hp, dtype=w.dtype, device=w.device)
    qp[:, :H] = q
    wp[:, :H] = w
    return qp, wp
