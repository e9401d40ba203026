"""KV row formats: sizes, fp8_ds_mla byte layout, quantize/dequantize round trip, validation."""
import struct

import pytest
import torch

from backends.kernels.kv_format import (FP8_MAX, FP8_SCALE_FLOOR, KV_DTYPES, dequantize_fp8_ds_mla,
                               fp8_ds_mla_offsets, fp8_ds_mla_views, kv_cache_to_float,
                               kv_dtype_of, make_kv_cache, quantize_fp8_ds_mla, row_bytes)


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


@pytest.mark.parametrize("d_nope, d_rope", [(512, 64), (256, 64), (384, 32), (128, 0)])
def test_fp8_byte_layout(d_nope, d_rope):
    n = 37
    kv = _random_kv(n, d_nope + d_rope, seed=d_nope + d_rope)
    kv[3, :128] = 0                                  # an all-zero tile gets the floor scale
    rows = quantize_fp8_ds_mla(kv, d_nope)
    assert rows.dtype == torch.uint8 and rows.shape == (n, row_bytes("fp8_ds_mla", d_nope, d_rope))
    g = d_nope // 128
    x = kv.float()
    for r in (0, 3, n - 1):
        raw = bytes(rows[r].tolist())
        # scales: raw little-endian fp32 right after the d_nope fp8 bytes, max(amax / 448, floor)
        scales = struct.unpack("<" + "f" * g, raw[d_nope:d_nope + 4 * g])
        for j in range(g):
            amax = x[r, 128 * j:128 * (j + 1)].abs().max().item()
            expect = max(struct.unpack("<f", struct.pack("<f", amax / 448.0))[0], FP8_SCALE_FLOOR)
            assert scales[j] == pytest.approx(expect, rel=1e-6, abs=0)
        # rope: the bf16 input bytes unchanged
        rope_bits = kv[r, d_nope:].view(torch.int16).tolist()
        assert raw[d_nope + 4 * g:] == struct.pack("<" + "h" * d_rope, *rope_bits)
        # fp8 values: the e4m3 encoding of x / scale (torch's own cast), byte for byte
        for j in range(g):
            tile = x[r, 128 * j:128 * (j + 1)] / scales[j]
            expect = tile.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8).tolist()
            assert list(raw[128 * j:128 * (j + 1)]) == expect
    zero_scale = struct.unpack("<f", bytes(rows[3, d_nope:d_nope + 4].tolist()))[0]
    assert zero_scale == FP8_SCALE_FLOOR
    assert torch.all(rows[3, :128] == 0)


@pytest.mark.parametrize("d_nope, d_rope", [(512, 64), (256, 64)])
def test_fp8_round_trip_error_bound(d_nope, d_rope):
    kv = _random_kv(300, d_nope + d_rope, seed=7)
    deq = dequantize_fp8_ds_mla(quantize_fp8_ds_mla(kv, d_nope), d_nope, d_rope)
    assert deq.dtype == torch.float32 and deq.shape == kv.shape
    x = kv.float()
    # rope part is exact
    assert torch.equal(deq[:, d_nope:], x[:, d_nope:])
    # NoPE: e4m3 has 3 mantissa bits: |err| <= |x| * 2^-4 for normals, <= scale * 2^-10 below
    nope = x[:, :d_nope].reshape(300, -1, 128)
    scale = (nope.abs().amax(-1, keepdim=True) / 448.0).clamp_min(FP8_SCALE_FLOOR)
    err = (deq[:, :d_nope].reshape(300, -1, 128) - nope).abs()
    bound = torch.maximum(nope.abs() * 2.0 ** -4, scale * 2.0 ** -10) * (1 + 1e-5)
    assert torch.all(err <= bound)
    # the tile maximum is represented exactly (it maps to +-448)
    am = nope.abs().argmax(-1, keepdim=True)
    assert torch.all(err.gather(-1, am) <= nope.abs().gather(-1, am) * 1e-6)
    # and the error is not trivially zero: the format is lossy
    assert err.max() > 0


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
