"""The warp-specialised Gluon sparse MLA decode (``kernel="ws"``) against the plain-torch
reference, its input limits, and what the compiler makes of it for sm_90a.

Tolerances are those of tests/test_sparse_mla_decode.py (same rounding: bf16 P and output).
The kernel needs Hopper: the reference checks run on the GPU only; the compile check runs
anywhere the installed Triton can compile for sm_90a (no GPU needed).
"""
import math

import pytest
import torch

from backends.kernels.kv_format import make_kv_cache
from backends.kernels.sparse_mla_decode import sparse_mla_decode, sparse_mla_decode_with_info
from backends.kernels.sparse_mla_decode_ws import (_SMEM_BUDGET, block_heads,
                                                   shared_memory_bytes, ws_supported)
from harness.reference import sparse_mla_decode_ref

REL_TOL = 1e-2
LSE_TOL = {"bf16": 1e-3, "fp8_ds_mla": 2e-2}


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _inputs(seed, b, h, d_v, d_rope, k, num_slots, device, pad_frac=0.1):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, h, d_v + d_rope, generator=g, device=device).to(torch.bfloat16)
    kv = (torch.randn(num_slots, d_v + d_rope, generator=g, device=device) * 2).to(torch.bfloat16)
    idx = torch.randint(0, num_slots, (b, k), generator=g, device=device, dtype=torch.int32)
    idx[torch.rand(b, k, generator=g, device=device) < pad_frac] = -1
    return q, kv, idx


def _check(q, kv, idx, d_v, kv_dtype="bf16", **kw):
    sm_scale = q.shape[-1] ** -0.5
    out, lse, info = sparse_mla_decode_with_info(q, kv, idx, sm_scale, d_v, kernel="ws", **kw)
    ref_out, ref_lse = sparse_mla_decode_ref(q, kv, idx, sm_scale, d_v)
    assert info.kernel == "ws" and out.shape == (q.shape[0], q.shape[1], d_v)
    rel = ((out.float() - ref_out).norm() / ref_out.norm()).item()
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse)) and torch.all(lse[~fin] == ref_lse[~fin])
    assert rel <= REL_TOL, rel
    assert (lse[fin] - ref_lse[fin]).abs().max().item() <= LSE_TOL[kv_dtype]
    return out, lse, info


# ------------------------------- anywhere: input limits -------------------------------

def test_options_that_do_not_apply_are_refused():
    q, kv, idx = _inputs(1, b=1, h=64, d_v=256, d_rope=64, k=64, num_slots=128,
                         device=torch.device("cpu"))
    for kw, name in [({"block_h": 32}, "block_h"), ({"block_n": 32}, "block_n"),
                     ({"num_warps": 4}, "num_warps"), ({"prefetch": "none"}, "prefetch"),
                     ({"split_scores": False}, "split_scores"),
                     ({"mma_dtype": torch.float16}, "mma_dtype")]:
        with pytest.raises(ValueError, match=f"{name}=.*kernel='ws'"):
            sparse_mla_decode(q, kv, idx, 0.1, 256, kernel="ws", **kw)
    with pytest.raises(ValueError, match="kernel must be 'triton' or 'ws'"):
        sparse_mla_decode(q, kv, idx, 0.1, 256, kernel="cuda")
    # 16-bit split partials are the ws kernel's; a dtype it does not have is named first
    for partials in ("bfloat16", "float16"):
        with pytest.raises(ValueError, match=f"split_partials='{partials}' applies to "
                                             "kernel='ws' only"):
            sparse_mla_decode(q, kv, idx, 0.1, 256, split_partials=partials)
    for kernel in ("ws", "triton"):
        with pytest.raises(ValueError, match="split_partials must be one of float32, bfloat16, "
                                             "float16, got 'float64'"):
            sparse_mla_decode(q, kv, idx, 0.1, 256, kernel=kernel, split_partials="float64")
    if _hopper():
        with pytest.raises(ValueError, match="stages must be an int >= 1"):
            sparse_mla_decode(q.cuda(), kv.cuda(), idx.cuda(), 0.1, 256, kernel="ws", num_stages=0)


def test_program_head_count_and_stages_that_fit():
    """Few heads go to the transposed 16- / 32-head programs (up to 32 heads in both row
    formats: measured, BENCHMARKS 6q), more to 64-head ones; the shared-memory estimate decides
    how many stages fit: 2 with 64-head programs, 3 for fp8 rows at 16 heads."""
    for kind in ("bf16", "fp8_ds_mla"):
        assert [block_heads(h, kind) for h in (1, 8, 16, 17, 32, 33, 64, 128)] == \
            [16, 16, 16, 32, 32, 64, 64, 64]
    fits = lambda kind, bh: [s for s in (1, 2, 3) if shared_memory_bytes(kind, 512, s, bh)
                             <= _SMEM_BUDGET]
    assert fits("bf16", 64) == fits("fp8_ds_mla", 64) == fits("bf16", 16) == [1, 2]
    assert fits("fp8_ds_mla", 16) == [1, 2, 3]
    # the query block shrinks with the head block, P^T's buffer appears
    assert (shared_memory_bytes("bf16", 512, 2, 64) - shared_memory_bytes("bf16", 512, 2, 16)
            == 48 * 576 * 2 - 64 * 16 * 2)


def test_limits_are_named_before_any_launch():
    cpu = torch.device("cpu")
    q, kv, idx = _inputs(2, b=1, h=64, d_v=256, d_rope=64, k=64, num_slots=128, device=cpu)
    assert "CUDA device" in ws_supported(q, kv, 256)
    # off the GPU the device is named first (the interpreter cannot run Gluon kernels)
    for bad_idx in (idx, idx.long()):
        with pytest.raises(ValueError, match="sparse_mla_decode_ws needs a CUDA device"):
            sparse_mla_decode(q, kv, bad_idx, 0.1, 256, kernel="ws")
    if _hopper():
        dev = torch.device("cuda")
        # on the GPU the common checks come first: a bad index dtype is named as such
        with pytest.raises(ValueError, match="indices must be a 2-D torch.int32"):
            sparse_mla_decode(q.to(dev), kv.to(dev), idx.long().to(dev), 0.1, 256, kernel="ws")
        # a third 64-token bf16 stage does not fit beside the query block: named, not launched
        q5, kv5, idx5 = _inputs(4, b=1, h=64, d_v=512, d_rope=64, k=64, num_slots=128, device=dev)
        with pytest.raises(ValueError, match="stages=3 needs 295424 bytes.*at most 2 stages"):
            sparse_mla_decode(q5, kv5, idx5, 0.1, 512, kernel="ws", num_stages=3)
        q, kv, idx = _inputs(3, b=1, h=48, d_v=256, d_rope=64, k=64, num_slots=128, device=dev)
        assert ws_supported(q, kv, 256) is None          # heads padded to a 64-head program
        q, kv, idx = _inputs(3, b=1, h=64, d_v=256, d_rope=48, k=64, num_slots=128, device=dev)
        assert "d_qk - d_v = 64" in ws_supported(q, kv, 256)
        # fp8_ds_mla rows at d_v 256 put the rope part at byte 264: not 16-byte aligned
        q, kv, idx = _inputs(3, b=1, h=64, d_v=256, d_rope=64, k=64, num_slots=128, device=dev)
        assert "16-byte aligned" in ws_supported(q, make_kv_cache(kv, "fp8_ds_mla", d_nope=256), 256)
        assert ws_supported(q, kv, 256) is None
        # bf16 rows 324 values (648 bytes) apart
        padded = torch.zeros(128, 324, dtype=torch.bfloat16, device=dev)[:, :320]
        assert "16-byte aligned" in ws_supported(q, padded, 256)


# ------------------------------- anywhere: the dequantization's PTX -------------------------------

def _run_dequant_ptx(words: torch.Tensor, scale_pair: torch.Tensor):
    """Executes the kernel's fp8 dequantization PTX (``_E4M3X4_TO_BF16_PTX``, parsed line by
    line: prmt / shl / and / mul.rn.bf16x2 as the PTX ISA defines them) on int64 tensors
    holding uint32 words; returns the two output registers ($0, $1) as int64 uint32 words."""
    from backends.kernels.sparse_mla_decode_ws import _E4M3X4_TO_BF16_PTX
    reg = {"$2": words, "$3": scale_pair}
    mask32 = 0xFFFFFFFF

    def val(tok):
        tok = tok.strip()
        return reg[tok] if tok in reg else int(tok, 0)

    def bf16x2_mul(a, b):
        halves = []
        for sh in (0, 16):
            x = ((a >> sh) & 0xFFFF).to(torch.int32) << 16
            y = ((b >> sh) & 0xFFFF).to(torch.int32) << 16
            prod = x.view(torch.float32) * y.view(torch.float32)       # exact: 8 x 8 bits
            bits = prod.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
            halves.append(bits << sh)
        return halves[0] | halves[1]

    for line in _E4M3X4_TO_BF16_PTX.value.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = [a.strip() for a in args.split(",")]
        if op == "prmt.b32":
            a, sel = val(src[0]), val(src[2])
            assert val(src[1]) == 0
            out = torch.zeros_like(a)
            for i in range(4):
                nib = (sel >> (4 * i)) & 0xF
                byte = (a >> (8 * (nib & 7))) & 0xFF if (nib & 7) < 4 else torch.zeros_like(a)
                if nib & 8:                                  # replicate the byte's sign bit
                    byte = torch.where(byte >= 0x80, 0xFF, 0)
                out = out | (byte << (8 * i))
        elif op == "shl.b32":
            out = (val(src[0]) << val(src[1])) & mask32
        elif op == "and.b32":
            out = val(src[0]) & val(src[1])
        elif op == "mul.rn.bf16x2":
            out = bf16x2_mul(val(src[0]), val(src[1]))
        else:
            raise AssertionError(f"unexpected PTX op {op}")
        reg[dst] = out
    return reg["$0"], reg["$1"]


def test_dequantization_ptx_matches_float8_conversion():
    """Every finite e4m3 byte in every position of the 32-bit word, times power-of-two and raw
    tile scales: the kernel's PTX (bit moves, one bf16 multiply by the scale x 2^120 rounded to
    bf16) gives exactly ``bf16(float(e4m3) x bf16(scale))`` (bit-exact against torch's float8
    conversion, subnormals and -0 included; on power-of-two scales also exactly the float32
    path's ``bf16(float(e4m3) x scale)``), and a NaN byte comes out as +-480 x scale."""
    from backends.kernels.sparse_mla_decode_ws import _E4M3_TO_BF16_BIAS
    g = torch.Generator().manual_seed(5)
    byte = torch.arange(256, dtype=torch.int64)
    scales = [2.0 ** -13, 2.0 ** -7, 1.0, 4.0,                      # pow2 (FlashMLA's quantizer)
              *(torch.rand(6, generator=g, dtype=torch.float64) * 0.05 + 1e-4).tolist()]
    for scale in scales:
        s_bf = torch.tensor(scale * _E4M3_TO_BF16_BIAS.value, dtype=torch.float32).to(torch.bfloat16)
        pair = s_bf.view(torch.int16).to(torch.int64) & 0xFFFF
        pair = (pair | (pair << 16)).expand(256)
        for pos in range(4):
            other = torch.randint(0, 256, (3, 256), generator=g, dtype=torch.int64)
            lanes = [other[j] for j in range(3)]
            lanes.insert(pos, byte)
            words = lanes[0] | (lanes[1] << 8) | (lanes[2] << 16) | (lanes[3] << 24)
            lo, hi = _run_dequant_ptx(words, pair)
            got = ((hi if pos >= 2 else lo) >> (16 * (pos % 2))) & 0xFFFF
            got = got.to(torch.int16).view(torch.bfloat16).float()
            e4 = byte.to(torch.uint8).view(torch.float8_e4m3fn).float()
            finite = torch.isfinite(e4)
            ref = (e4 * torch.tensor(scale, dtype=torch.float32).to(torch.bfloat16).float()
                   ).to(torch.bfloat16).float()
            assert torch.equal(got[finite], ref[finite]), (scale, pos)
            assert torch.equal(torch.signbit(got[finite]), torch.signbit(ref[finite]))
            nan_as = (480 * torch.tensor(scale, dtype=torch.float32).to(torch.bfloat16).float()
                      ).to(torch.bfloat16).float()
            assert torch.equal(got[~finite].abs(), nan_as.expand(2))
            if scale in (2.0 ** -13, 2.0 ** -7, 1.0, 4.0):
                f32 = (e4 * scale).to(torch.bfloat16).float()
                assert torch.equal(got[finite], f32[finite])


# ------------------------------- anywhere: the sm_90a compile -------------------------------

_WS_COMPILE = r"""
import json
from backends.kernels.sparse_mla_decode_ws import compile_for_sm90
out = {}
for kind in ("bf16", "fp8_ds_mla"):
    for partials in ("float32", "bfloat16", "float16"):
        ptx = compile_for_sm90(kind, d_v=512, d_rope=64, stages=2, split=True,
                               split_partials=partials).asm["ptx"]
        out[f"{kind} split {partials}"] = {"st_global": ptx.count("st.global"),
                                           "st_global_v2": ptx.count("st.global.v2"),
                                           "st_global_v4": ptx.count("st.global.v4")}
    k = compile_for_sm90(kind, d_v=512, d_rope=64, stages=2)
    ptx = k.asm["ptx"]
    lines = ptx.splitlines()
    wait = next(i for i, l in enumerate(lines) if "wgmma.wait_group" in l)   # the score MMAs'
    p_store = next(i for i in range(wait, len(lines)) if "stmatrix" in lines[i])  # P's store
    out[kind] = {"bar_before_p": sum("bar.sync" in l for l in lines[wait:p_store]),
                 "shared": k.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                 "cp_async": ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
                 "st_global": ptx.count("st.global"), "st_global_v4": ptx.count("st.global.v4"),
                 "maxnreg": sorted(set(l.split()[0] for l in ptx.splitlines() if "setmaxnreg" in l))}
print(json.dumps(out))
"""


def test_compiles_for_sm90_within_shared_memory():
    """Compiled for sm_90a by the installed Triton in a process of its own (no GPU), for both
    KV formats: the partitions get register budgets of their own (setmaxnreg), the score and
    PV MMAs are wgmma, the gather is cp.async, and the query block and the stages fit the
    H200's shared memory (bf16: two bf16 stages; fp8_ds_mla: two stages of the rows as stored
    and one bf16 tile). bf16 rows: 36 k-steps of the 576-wide scores and 4 of the 64-token PV,
    40 a tile; P overwrites the stage's rope tile, which the other warpgroup's score MMA may
    still read, so the partition-wide barrier of the cross-warpgroup row max must stand
    between the score MMAs' wait and P's store (the kernel relies on it, as it ran on the
    H200). fp8_ds_mla rows (the asymmetric consumers): the 36 score k-steps in warpgroup 0
    alone, 4 PV k-steps in each warpgroup, 44 a tile. The bf16 output goes through shared
    memory and out as 16-byte vectors (64 x 512 bf16 over 256 consumer threads: 16 vector
    stores a thread), so the only other global stores are the LSE's. A split call's float32
    partials go out from the accumulator's layout (8-byte stores, 2 floats a thread a row: 128
    a thread over the fp8 consumers' 64 x 512, 64 over the bf16 ones' 8 warps), its bf16 and
    fp16 partials as the bf16 output does (16-byte vectors, no 8-byte stores; the fp16 ones'
    exponents a few scalar stores more)."""
    from tests.test_sparse_mla_decode import _H200_SMEM, _compile_report
    rep = _compile_report(_WS_COMPILE)
    for kind in ("bf16", "fp8_ds_mla"):
        f32, bf16 = rep.pop(f"{kind} split float32"), rep.pop(f"{kind} split bfloat16")
        f16 = rep.pop(f"{kind} split float16")
        assert f32["st_global_v2"] >= 64 and f32["st_global_v4"] == 0, (kind, f32)
        for r in (bf16, f16):
            assert r["st_global_v4"] >= 16 and r["st_global_v2"] == 0, (kind, r)
        assert bf16["st_global"] - bf16["st_global_v4"] <= 4, (kind, bf16)
        assert 0 < f16["st_global"] - f16["st_global_v4"] - (bf16["st_global"] - bf16["st_global_v4"]) <= 4, (kind, f16)
    for kind, r in rep.items():
        assert r["wgmma"] == {"bf16": 40, "fp8_ds_mla": 44}[kind], (kind, r)
        assert r["cp_async"] > 0, (kind, r)
        assert kind != "bf16" or r["bar_before_p"] >= 1, (kind, r)
        assert {"setmaxnreg.dec.sync.aligned.u32", "setmaxnreg.inc.sync.aligned.u32"} <= set(r["maxnreg"]), r
        assert 2 * (64 * 576 * 2) < r["shared"] <= _H200_SMEM, (kind, r)
        assert r["st_global_v4"] >= 16 and r["st_global"] - r["st_global_v4"] <= 2, (kind, r)


# ------------------------------- GPU (Hopper) -------------------------------

hopper = pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (wgmma)")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("num_splits", [1, 3, None])
@pytest.mark.parametrize("stages", [1, 2])
def test_dsv32_size_matches_reference(kv_dtype, num_splits, stages):
    dev = torch.device("cuda")
    b = 6
    q, kv, idx = _inputs(100 + stages, b=b, h=128, d_v=512, d_rope=64, k=2000, num_slots=65536,
                         device=dev)
    cache = make_kv_cache(kv, kv_dtype, d_nope=512)
    idx[b - 1] = -1                                  # one fully masked row
    idx[0, :65] = 12345                              # a duplicated slot, 65 times
    idx[1, 5] = 65536                                # past the cache: masked like -1
    out, lse, info = _check(q, cache, idx, 512, kv_dtype, num_splits=num_splits,
                            num_stages=stages)
    assert torch.all(out[b - 1] == 0) and torch.all(lse[b - 1] == math.inf)
    assert info.num_stages == stages and (num_splits is None or info.num_splits == num_splits)
    assert info.smem_bytes <= 232448
    # the same numbers as the Triton kernel within the tolerance, on the same inputs
    tri, _ = sparse_mla_decode(q, cache, idx, 576 ** -0.5, 512)
    assert ((out.float() - tri.float()).norm() / tri.float().norm()).item() <= REL_TOL


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("partials", ["bfloat16", "float16"])
def test_16bit_split_partials_match_reference(kv_dtype, partials):
    """``split_partials="bfloat16"`` / ``"float16"`` at DeepSeek-V3.2's size, split by the
    model (which prices the 16-bit partials) and by hand, a fully masked row and a masked first
    split: within the tolerance of the reference, and within one bf16 rounding of the float32
    partials' output on most values (a partial or the combine's word order wrong would be off
    by far more); fp16 ones (11 bits, a power of two a head's stored columns) add no more than
    3 % to the float32 partials' error from the reference."""
    dev = torch.device("cuda")
    q, kv, idx = _inputs(41, b=4, h=128, d_v=512, d_rope=64, k=2048, num_slots=65536, device=dev)
    cache = make_kv_cache(kv, kv_dtype, d_nope=512)
    idx[3] = -1
    idx[2, :128] = -1
    ref, _ = sparse_mla_decode_ref(q, cache, idx, 576 ** -0.5, 512)
    for splits in (None, 3):
        out, lse, info = _check(q, cache, idx, 512, kv_dtype, num_splits=splits,
                                split_partials=partials)
        assert info.split_partials == partials and info.num_splits == (splits or 16)
        assert torch.all(out[3] == 0) and torch.all(lse[3] == math.inf)
        f32, lse32, info32 = _check(q, cache, idx, 512, kv_dtype, num_splits=info.num_splits,
                                    split_partials="float32")
        assert info32.split_partials == "float32"
        rel = (out.float() - f32.float()).abs() / f32.float().abs().clamp_min(1e-2)
        assert rel.median().item() <= 4e-3 and torch.allclose(lse, lse32, atol=1e-5)
        if partials == "float16":
            err, err32 = ((o.float() - ref).norm() / ref.norm() for o in (out, f32))
            assert err <= 1.03 * err32, (err, err32)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("h", [16, 32])
def test_16bit_split_partials_of_few_heads(kv_dtype, h):
    """16- and 32-head programs (the transposed consumers, whose fp16 partials' head maximum
    is taken across warps): fp16 and bf16 partials at the model's split count and at 5 splits,
    a fully masked row, within the tolerance of the reference."""
    dev = torch.device("cuda")
    q, kv, idx = _inputs(45 + h, b=3, h=h, d_v=512, d_rope=64, k=2048, num_slots=16384,
                         device=dev)
    cache = make_kv_cache(kv, kv_dtype, d_nope=512)
    idx[2] = -1
    for partials in ("float16", "bfloat16"):
        for splits in (None, 5):
            out, lse, info = _check(q, cache, idx, 512, kv_dtype, num_splits=splits,
                                    split_partials=partials)
            assert info.block_h == h and info.num_splits > 1 and info.split_partials == partials
            assert torch.all(out[2] == 0) and torch.all(lse[2] == math.inf)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
def test_float16_split_partials_hold_any_range(kv_dtype):
    """fp16 partials of outputs past fp16's range: rows of about 2^16 (1 + N(0, 0.1)) (outputs
    past its 65504; fp8_ds_mla tiles' maxima stay under the 448 x 2^8 that the bf16
    dequantization's scale x 2^120 admits) and rows of 2^-40 N(0, 2) (outputs below its
    smallest normal), the scores kept by ``sm_scale``: finite and within the tolerance of the
    reference at every split count (unscaled fp16 partials would be inf or flushed to 0)."""
    dev = torch.device("cuda")
    q, kv, idx = _inputs(43, b=2, h=128, d_v=512, d_rope=64, k=1024, num_slots=8192, device=dev)
    for base in (2.0 ** 16, 2.0 ** -40):
        rows = kv.float() * (0.05 if base > 1 else 1.0) + (1.0 if base > 1 else 0.0)
        cache = make_kv_cache((rows * base).to(torch.bfloat16), kv_dtype, d_nope=512)
        sm_scale = 576 ** -0.5 / base
        ref, _ = sparse_mla_decode_ref(q, cache, idx, sm_scale, 512)
        assert ref.abs().max() > 65504 if base > 1 else ref.abs().max() < 6e-5
        for splits in (None, 4):
            out, _, info = sparse_mla_decode_with_info(q, cache, idx, sm_scale, 512, kernel="ws",
                                                       num_splits=splits, split_partials="float16")
            assert info.split_partials == "float16" and info.num_splits > 1 and torch.isfinite(out.float()).all(), (base, splits)
            assert ((out.float() - ref).norm() / ref.norm()).item() <= REL_TOL, (base, splits)


@pytest.mark.gpu
@hopper
def test_other_widths_and_a_partial_tile():
    dev = torch.device("cuda")
    # d_v 256 + d_rope 64 at 64 heads; top_k 100: one full and one partial 64-token tile
    q, kv, idx = _inputs(7, b=3, h=64, d_v=256, d_rope=64, k=100, num_slots=500, device=dev)
    _check(q, kv, idx, 256, num_splits=2)
    _check(q, kv, idx, 256, num_splits=1)
    # d_v 128; and row 0's first split (its first 64 tokens) all masked, the second not
    q2, kv2, idx2 = _inputs(8, b=2, h=64, d_v=128, d_rope=64, k=100, num_slots=500, device=dev)
    idx2[0, :64] = -1
    _check(q2, kv2, idx2, 128, num_splits=2)
    # few heads: a TP8 shard's 16 and a TP4 shard's 32 (one transposed program a request);
    # 80 heads: one 64-head program and one padded with masked rows; both row formats, split
    # and not; the program's head count in the launch info
    for h in (16, 32, 80):
        q3, kv3, idx3 = _inputs(9 + h, b=3, h=h, d_v=512, d_rope=64, k=300, num_slots=1000,
                                device=dev)
        for kv_dtype in ("bf16", "fp8_ds_mla"):
            cache = make_kv_cache(kv3, kv_dtype, d_nope=512)
            for splits in (1, 3):
                info = _check(q3, cache, idx3, 512, kv_dtype, num_splits=splits)[2]
                assert info.block_h == block_heads(h, kv_dtype)
                # the default stage count: 3 where they fit (fp8 rows, 16-head programs)
                assert info.num_stages == (3 if (kv_dtype, h) == ("fp8_ds_mla", 16) else 2)
    # an empty top-k: zeros and +inf without a launch
    out, lse, _ = sparse_mla_decode_with_info(q, kv, idx[:, :0], 0.1, 256, kernel="ws")
    assert torch.all(out == 0) and torch.all(lse == math.inf)


@pytest.mark.gpu
@hopper
def test_fp8_dequantization_by_bit_moves_is_exact_on_power_of_two_scales(monkeypatch):
    """The default dequantization (e4m3 bits moved into a bf16, one bf16 multiply by the
    scale x 2^120) against the float32 one (convert, multiply, round once): on power-of-two
    scales every dequantized value is the same, so the outputs are bit-identical; rows from
    1e-3 to 10 in magnitude put subnormal e4m3 bytes, zeros and both signs into every tile."""
    import backends.kernels.sparse_mla_decode_ws as ws
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(21)
    x = (torch.randn(4096, 576, generator=g, device=dev)
         * torch.logspace(-3, 1, 4096, device=dev)[:, None]).to(torch.bfloat16)
    x[7, :128] = 0                                           # an all-zero group
    cache = make_kv_cache(x, "fp8_ds_mla", d_nope=512, scale_format="pow2")
    for h in (128, 16):
        q = torch.randn(3, h, 576, generator=g, device=dev).to(torch.bfloat16)
        idx = torch.randint(0, 4096, (3, 700), generator=g, device=dev, dtype=torch.int32)
        idx[0, :4] = 7
        outs = []
        for bits in (False, True):
            monkeypatch.setattr(ws, "_DEQ_BF16", bits)
            outs.append(_check(q, cache, idx, 512, "fp8_ds_mla", num_splits=2)[:2])
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_attention_switch_names_the_limit():
    """``attention_kernel=triton_ws`` is checked when a backend resolves it, before any
    timing: off Hopper it is a BackendInvalid naming why."""
    from backends.attention import ATTENTION_KERNELS, heads_computed, resolve_attention
    from backends.base import BackendInvalid
    assert {"triton_ws", "triton_ws_f16p", "triton_ws_bf16p"} <= set(ATTENTION_KERNELS)
    # the FLOP accounting counts the heads the programs compute: 16 / 32-head programs up to
    # 32 heads, else 64-head programs with a padded remainder
    for kind in ("bf16", "fp8_ds_mla"):
        for name in ("triton_ws", "triton_ws_f16p", "triton_ws_bf16p"):
            assert [heads_computed(name, h, kind) for h in (8, 16, 20, 32, 33, 64, 80, 128)] \
                == [16, 16, 32, 32, 64, 64, 128, 128]
    assert heads_computed("triton", 16, "bf16") == 16
    kv = torch.zeros(64, 576, dtype=torch.bfloat16)
    if not _hopper():
        for name in ("triton_ws", "triton_ws_f16p", "triton_ws_bf16p"):
            with pytest.raises(BackendInvalid, match=f"attention_kernel='{name}' needs"):
                resolve_attention(name, torch.device("cpu"), 128, 576, 512, kv)
    else:
        fn = resolve_attention("triton_ws", torch.device("cuda"), 128, 576, 512, kv.cuda())
        assert fn.keywords == {"kernel": "ws", "split_partials": "float32"}
        q, kvr, idx = _inputs(5, b=2, h=128, d_v=512, d_rope=64, k=256, num_slots=512,
                              device=torch.device("cuda"))
        out, _ = fn(q, kvr, idx, 0.05, 512)
        ref, _ = sparse_mla_decode_ref(q, kvr, idx, 0.05, 512)
        assert ((out.float() - ref).norm() / ref.norm()).item() <= REL_TOL
        for name, partials in (("triton_ws_f16p", "float16"), ("triton_ws_bf16p", "bfloat16")):
            fn_p = resolve_attention(name, torch.device("cuda"), 128, 576, 512, kv.cuda())
            assert fn_p.keywords == {"kernel": "ws", "split_partials": partials}
            out_p, _ = fn_p(q, kvr, idx, 0.05, 512)
            assert ((out_p.float() - ref).norm() / ref.norm()).item() <= REL_TOL
        resolve_attention("triton_ws", torch.device("cuda"), 16, 576, 512, kv.cuda())
        with pytest.raises(BackendInvalid, match="d_v a power of two"):
            resolve_attention("triton_ws", torch.device("cuda"), 128, 576, 448, kv.cuda())
