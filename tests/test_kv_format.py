"""KV row formats: sizes, fp8_ds_mla byte layout, quantize/dequantize round trip, validation."""
import numpy as np
import pytest
import torch

from backends.kernels.kv_format import (FP8_SCALE_FLOOR, KV_DTYPES, KV_SCALE_FORMATS,
                                        dequantize_fp8_ds_mla, fp8_ds_mla_offsets,
                                        fp8_ds_mla_views, kv_cache_to_float, kv_dtype_of,
                                        make_kv_cache, quantize_fp8_ds_mla, row_bytes, tile_scales)


def _random_kv(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    # rows of very different magnitudes, plus a few outliers, so tile scales differ a lot
    x = torch.randn(n, d, generator=g) * torch.exp(torch.randn(n, 1, generator=g) * 3)
    x[torch.rand(n, d, generator=g) < 0.01] *= 50
    return x.to(torch.bfloat16)


def test_kv_dtypes_and_row_bytes():
    assert KV_DTYPES == ("bf16", "fp8_ds_mla")
    assert row_bytes("bf16", 512, 64) == 1152
    assert row_bytes("fp8_ds_mla", 512, 64) == 656
    assert row_bytes("fp8_ds_mla", 256, 64) == 392
    assert row_bytes("fp8_ds_mla", 128, 0) == 132
    assert fp8_ds_mla_offsets(512, 64) == (512, 528, 656)


@pytest.mark.parametrize("args, msg", [
    (("fp16", 512, 64), "kv_dtype"),
    (("fp8_ds_mla", 500, 64), "multiple of 128"),
    (("fp8_ds_mla", 512, 63), "even d_rope"),
    (("bf16", 0, 64), "d_nope"),
    (("bf16", 512, -1), "d_rope"),
])
def test_row_bytes_rejects(args, msg):
    with pytest.raises(ValueError, match=msg):
        row_bytes(*args)


def _e4m3_table():
    """Every finite non-negative float8_e4m3fn value, indexed by its code 0x00..0x7E, from the
    bit layout (4 exponent bits with bias 7, 3 mantissa bits; exponent 0 subnormal; 0x7F NaN)."""
    codes = np.arange(0x7F)
    e, m = codes >> 3, codes & 0x7
    return np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))


_E4M3_POS = _e4m3_table()


def _np_e4m3(x):
    """float64 array -> e4m3 codes: round to nearest, ties to the even code, saturating to
    +-448; the sign bit is the input's (a negative value rounding to 0 gives -0, 0x80)."""
    mag = np.minimum(np.abs(x), 448.0)
    d = np.abs(mag[..., None] - _E4M3_POS)
    best = d.min(-1, keepdims=True)
    tie = d == best
    even = tie & (np.arange(0x7F) % 2 == 0)
    pick = np.where(tie.sum(-1, keepdims=True) > 1, even, tie)
    code = np.argmax(pick, axis=-1).astype(np.uint8)
    return np.where(np.signbit(x), code | 0x80, code).astype(np.uint8)


def _np_quantize(x, d_nope, scale_format):
    """Independent fp8_ds_mla quantizer (numpy) from the documented formula."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    tiles = x[:, :d_nope].reshape(n, -1, 128)
    s = np.float32(np.abs(tiles).max(-1)) / np.float32(448.0)    # fp32 division, like the kernel
    s = s.astype(np.float64)
    if scale_format == "raw":
        scale = np.maximum(s, np.finfo(np.float32).tiny)
    else:
        scale = 2.0 ** np.ceil(np.log2(np.maximum(s, 1e-4)))
    scale = scale.astype(np.float32)
    # x / scale in float32, as the cache writers divide, then rounded to e4m3
    q = tiles.astype(np.float32) / scale[..., None]
    codes = _np_e4m3(q.astype(np.float64)).reshape(n, d_nope)
    return codes, scale


def _edge_kv(n, d_nope, d_rope, seed):
    kv = _random_kv(n, d_nope + d_rope, seed=seed)
    kv[3, :128] = 0                                      # all-zero tile: the floor scale
    sub = 128 if d_nope >= 256 else 0                    # a tile whose amax is subnormal (1e-39)
    kv[4, sub:sub + 128] = torch.tensor(1e-39).to(torch.bfloat16) * torch.randn(128).sign()
    kv[5, :128] = torch.linspace(-464.0, 464.0, 128)     # values at and beyond +-448 of a 1.0 scale
    kv[6, :128] = 2.0 ** torch.randint(-8, 8, (1,)).item() * 448.0  # amax / 448 an exact power of two
    return kv


@pytest.mark.parametrize("scale_format", KV_SCALE_FORMATS)
@pytest.mark.parametrize("d_nope, d_rope", [(512, 64), (256, 64), (384, 32), (128, 0)])
def test_fp8_byte_layout(d_nope, d_rope, scale_format):
    n = 37
    kv = _edge_kv(n, d_nope, d_rope, seed=d_nope + d_rope)
    rows = quantize_fp8_ds_mla(kv, d_nope, scale_format=scale_format)
    assert rows.dtype == torch.uint8 and rows.shape == (n, row_bytes("fp8_ds_mla", d_nope, d_rope))
    g = d_nope // 128
    codes, scales = _np_quantize(kv.float().numpy(), d_nope, scale_format)
    raw = rows.numpy()
    # fp8 values, scales (little-endian fp32 right after them), rope (the bf16 input bytes)
    assert np.array_equal(raw[:, :d_nope], codes)
    assert np.array_equal(raw[:, d_nope:d_nope + 4 * g].copy().view("<f4"), scales)
    rope_bits = kv[:, d_nope:].contiguous().view(torch.int16).numpy().astype("<i2")
    assert raw[:, d_nope + 4 * g:].tobytes() == rope_bits.tobytes()
    got = raw[:, d_nope:d_nope + 4 * g].copy().view("<f4")
    if scale_format == "pow2":
        mant, _ = np.frexp(got)
        assert np.all(mant == 0.5)                           # every scale a power of two
        assert got[3, 0] == 2.0 ** -13 and got[4, 1 if g > 1 else 0] == 2.0 ** -13
    else:                                                    # 1e-39 / 448 is below FLT_MIN
        assert got[3, 0] == FP8_SCALE_FLOOR and got[4, 1 if g > 1 else 0] == FP8_SCALE_FLOOR
    assert np.all(raw[3, :128] == 0)
    # values that land on +-448 (0x7E / 0xFE) are encoded as such, never as NaN (0x7F / 0xFF):
    # the tile maximum under raw scales, a tile whose amax / 448 is a power of two under both
    assert np.all(raw[6, :128] == 0x7E)
    if scale_format == "raw":
        assert raw[5, 0] == 0xFE and raw[5, 127] == 0x7E
    assert not np.isin(raw[:, :d_nope], (0x7F, 0xFF)).any()


@pytest.mark.parametrize("scale_format", KV_SCALE_FORMATS)
@pytest.mark.parametrize("d_nope, d_rope", [(512, 64), (256, 64)])
def test_fp8_round_trip_error_bound(d_nope, d_rope, scale_format):
    kv = _random_kv(300, d_nope + d_rope, seed=7)
    rows = quantize_fp8_ds_mla(kv, d_nope, scale_format=scale_format)
    deq = dequantize_fp8_ds_mla(rows, d_nope, d_rope)
    assert deq.dtype == torch.float32 and deq.shape == kv.shape
    x = kv.float()
    assert torch.equal(deq[:, d_nope:], x[:, d_nope:])        # rope part is exact
    # NoPE: e4m3 has 3 mantissa bits: |err| <= |x| * 2^-4 for normals, <= scale * 2^-10 below
    nope = x[:, :d_nope].reshape(300, -1, 128)
    scale = rows[:, d_nope:d_nope + 4 * (d_nope // 128)].contiguous().view(torch.float32).unsqueeze(-1)
    amax = nope.abs().amax(-1, keepdim=True)
    assert torch.all(scale >= amax / 448.0 * (1 - 1e-6))     # no tile overflows its range
    assert torch.all(scale <= torch.clamp(amax / 448.0, min=1e-4) * 2)  # pow2 at most doubles it
    err = (deq[:, :d_nope].reshape(300, -1, 128) - nope).abs()
    bound = torch.maximum(nope.abs() * 2.0 ** -4, scale * 2.0 ** -10) * (1 + 1e-5)
    assert torch.all(err <= bound)
    am = nope.abs().argmax(-1, keepdim=True)
    if scale_format == "raw":                                 # the tile maximum maps to +-448
        assert torch.all(err.gather(-1, am) <= nope.abs().gather(-1, am) * 1e-6)
    assert err.max() > 0                                      # the format is lossy


def test_scale_formats_differ_and_pow2_rounds_up():
    kv = _random_kv(64, 576, seed=11)
    s_pow2 = quantize_fp8_ds_mla(kv, scale_format="pow2")[:, 512:528].contiguous().view(torch.float32)
    s_raw = quantize_fp8_ds_mla(kv, scale_format="raw")[:, 512:528].contiguous().view(torch.float32)
    assert torch.all(s_pow2 >= s_raw) and torch.all(s_pow2 < 2 * s_raw.clamp_min(1e-4))
    assert (s_pow2 != s_raw).float().mean() > 0.9              # random amax: almost never a power of 2
    # the default is what vLLM's cache writer stores (raw), for the quantizer and the run config
    assert torch.equal(quantize_fp8_ds_mla(kv), quantize_fp8_ds_mla(kv, scale_format="raw"))
    from harness.config import CORE_FIELDS
    assert dict((f[0], f[2]) for f in CORE_FIELDS)["kv_scale_format"] == "raw"
    assert torch.equal(tile_scales(torch.tensor([0.0, 448.0, 449.0]), "pow2"),
                       torch.tensor([2.0 ** -13, 1.0, 2.0]))
    with pytest.raises(ValueError, match="scale_format must be one of"):
        quantize_fp8_ds_mla(kv, scale_format="ue8m0")
    with pytest.raises(ValueError, match="scale_format must be one of"):
        make_kv_cache(kv, "bf16", scale_format="fp32")


def test_views_share_storage_and_kv_cache_helpers():
    kv = _random_kv(5, 320, seed=3)
    rows = make_kv_cache(kv, "fp8_ds_mla", d_nope=256)
    u8, f32, bf = fp8_ds_mla_views(rows, 256, 64)
    assert u8.data_ptr() == f32.data_ptr() == bf.data_ptr() == rows.data_ptr()
    assert f32.shape == (5, 98) and bf.shape == (5, 196)
    assert torch.equal(bf[:, 132:], kv[:, 256:])
    assert kv_dtype_of(rows) == "fp8_ds_mla" and kv_dtype_of(kv) == "bf16"
    assert torch.equal(kv_cache_to_float(rows, 320, 256), dequantize_fp8_ds_mla(rows, 256, 64))
    b = make_kv_cache(kv, "bf16")
    assert b.dtype == torch.bfloat16 and torch.equal(b, kv) and b.data_ptr() != kv.data_ptr()


def test_validation_errors():
    kv = _random_kv(4, 576, seed=1)
    with pytest.raises(ValueError, match="bfloat16"):
        quantize_fp8_ds_mla(kv.float())
    with pytest.raises(ValueError, match="2-D"):
        quantize_fp8_ds_mla(kv[0])
    with pytest.raises(ValueError, match="fewer than d_nope"):
        quantize_fp8_ds_mla(kv[:, :500], 512)
    with pytest.raises(ValueError, match="multiple of 128"):
        quantize_fp8_ds_mla(kv, 500)
    rows = quantize_fp8_ds_mla(kv)
    with pytest.raises(ValueError, match="656 bytes"):
        dequantize_fp8_ds_mla(rows[:, :640], 512, 64)
    with pytest.raises(ValueError, match="uint8"):
        dequantize_fp8_ds_mla(rows.view(torch.int8), 512, 64)
    with pytest.raises(ValueError, match="kv_cache must be"):
        kv_dtype_of(kv.half())
    with pytest.raises(ValueError, match="kv_dtype"):
        make_kv_cache(kv, "fp8")
