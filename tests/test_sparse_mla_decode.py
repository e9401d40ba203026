"""Triton sparse MLA decode vs the plain-torch reference, both KV row formats.

Tolerances. The kernel rounds P and (for fp8_ds_mla) the dequantized K/V to the MMA operand type
(bf16 on the GPU, fp16 in the interpreter) and the output to bf16; bf16 rounding alone is a
relative error of at most 2^-9 ~ 2e-3 per element (about 1e-3 rms), and the measured
||out - ref|| / ||ref|| is 2e-3 (bf16 rows) / 3e-3 (fp8 rows) on the H200 and 3.3e-3 in the
interpreter. REL_TOL = 1e-2 leaves a 3x margin over that and still fails on any real error
(the duplicate test below checks that dropping ten copies of one slot out of 64 is caught). The lse compares
exactly computed logits for bf16 rows (measured 5e-6); for fp8 rows the logits use bf16-rounded
dequantized K (measured up to 5e-3 at top_k 2048), hence LSE_TOL_FP8 = 2e-2.
"""
import math

import pytest
import torch

from backends.kernels.sparse_mla_decode import choose_num_splits, combine_splits, sparse_mla_decode
from backends.kernels.kv_format import make_kv_cache
from harness.reference import sparse_mla_decode_ref

REL_TOL = 1e-2
LSE_TOL_BF16 = 1e-3
LSE_TOL_FP8 = 2e-2


def _inputs(seed, b, h, d_nope, d_rope, k, num_slots, kv_dtype, device, pad_frac=0.1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, d_nope + d_rope, generator=g).to(torch.bfloat16)
    kv = (torch.randn(num_slots, d_nope + d_rope, generator=g) * 2).to(torch.bfloat16)
    idx = torch.randint(0, num_slots, (b, k), generator=g, dtype=torch.int32)
    idx[torch.rand(b, k, generator=g) < pad_frac] = -1
    cache = make_kv_cache(kv, kv_dtype, d_nope=d_nope)
    return q.to(device), cache.to(device), idx.to(device)


def _check(q, cache, idx, d_v, kv_dtype, **kw):
    sm_scale = q.shape[-1] ** -0.5
    out, lse = sparse_mla_decode(q, cache, idx, sm_scale, d_v, **kw)
    ref_out, ref_lse = sparse_mla_decode_ref(q, cache, idx, sm_scale, d_v)
    assert out.dtype == torch.bfloat16 and out.shape == (q.shape[0], q.shape[1], d_v)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:2]
    rel = ((out.float() - ref_out).norm() / ref_out.norm()).item()
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse)) and torch.all(lse[~fin] == ref_lse[~fin])
    lse_err = (lse[fin] - ref_lse[fin]).abs().max().item()
    assert rel <= REL_TOL, rel
    assert lse_err <= (LSE_TOL_FP8 if kv_dtype == "fp8_ds_mla" else LSE_TOL_BF16), lse_err
    return out, lse, ref_out, ref_lse


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("split_scores", [False, True])
def test_matches_reference(device, kv_dtype, num_splits, split_scores):
    # H=16 < block_h=64 (a partial head block); K=100 is not a multiple of the 32-token tile
    q, cache, idx = _inputs(11 + num_splits, b=3, h=16, d_nope=256, d_rope=64, k=100,
                            num_slots=400, kv_dtype=kv_dtype, device=device)
    _check(q, cache, idx, 256, kv_dtype, block_h=64, block_n=32, num_splits=num_splits,
           split_scores=split_scores)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
def test_head_blocks_not_dividing_h_and_auto_splits(device, kv_dtype):
    # H=24 over blocks of 16 heads (the second block is half empty); splits from the heuristic
    q, cache, idx = _inputs(21, b=2, h=24, d_nope=256, d_rope=64, k=96, num_slots=300,
                            kv_dtype=kv_dtype, device=device)
    _check(q, cache, idx, 256, kv_dtype, block_h=16, block_n=32)


@pytest.mark.parametrize("kv_dtype, d_nope, d_rope", [("bf16", 384, 32), ("fp8_ds_mla", 384, 32),
                                                      ("fp8_ds_mla", 128, 0), ("bf16", 200, 56)])
@pytest.mark.parametrize("split_scores", [False, True])
def test_other_widths(device, kv_dtype, d_nope, d_rope, split_scores):
    # d_nope not a power of two (padded inside the kernel), no rope at all, odd bf16 widths
    q, cache, idx = _inputs(31 + d_nope, b=2, h=16, d_nope=d_nope, d_rope=d_rope, k=40,
                            num_slots=120, kv_dtype=kv_dtype, device=device)
    _check(q, cache, idx, d_nope, kv_dtype, block_n=16, num_splits=2, split_scores=split_scores)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("prefetch", ["none", "index", "rows"])
@pytest.mark.parametrize("split_scores", [False, True])
def test_prefetch_modes(device, kv_dtype, prefetch, split_scores):
    # (with fp8 rows and split_scores the rope part of K is gathered after the dequantization,
    # except with prefetch "rows")
    q, cache, idx = _inputs(41, b=2, h=16, d_nope=256, d_rope=64, k=70, num_slots=200,
                            kv_dtype=kv_dtype, device=device)
    _check(q, cache, idx, 256, kv_dtype, block_n=32, num_splits=2, prefetch=prefetch,
           split_scores=split_scores)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("split_scores", [False, True])
def test_masked_rows_out_of_range_and_duplicates(device, kv_dtype, num_splits, split_scores):
    q, cache, idx = _inputs(51, b=3, h=16, d_nope=256, d_rope=64, k=64, num_slots=150,
                            kv_dtype=kv_dtype, device=device, pad_frac=0.0)
    idx = idx.clone()
    idx[0] = -1                                        # fully masked row
    idx[1, :40] = -1                                   # masked, incl. a whole split
    idx[1, 45] = 150                                   # == num_slots: out of range -> masked
    idx[1, 50] = 2 ** 31 - 1
    idx[2, 10:20] = idx[2, 5]                          # one slot 11 times
    out, lse, ref_out, _ = _check(q, cache, idx, 256, kv_dtype, block_n=32, num_splits=num_splits,
                                  split_scores=split_scores)
    assert torch.all(out[0] == 0) and torch.all(torch.isinf(lse[0]) & (lse[0] > 0))
    assert torch.isfinite(lse[1:]).all() and torch.isfinite(out.float()).all()
    # duplicates count as often as they appear: the reference with the copies removed is far
    # from the kernel's answer (so deduplicating would fail), the reference with them is close
    dedup = idx.clone()
    dedup[2, 10:20] = -1
    ref_d, _ = sparse_mla_decode_ref(q, cache, dedup, q.shape[-1] ** -0.5, 256)
    row_rel = lambda a, r: ((a.float() - r).norm() / r.norm()).item()  # noqa: E731
    assert row_rel(ref_d[2], ref_out[2]) > 3 * REL_TOL
    assert row_rel(out[2], ref_out[2]) <= REL_TOL
    assert row_rel(out[2], ref_d[2]) > 2 * REL_TOL


@pytest.mark.parametrize("num_splits,d_v,part_dtype", [
    (3, 512, torch.float32), (32, 512, torch.float32), (64, 192, torch.float32),
    (3, 512, torch.bfloat16), (16, 512, torch.bfloat16), (64, 192, torch.bfloat16),
    *(pytest.param(s, d, t, marks=pytest.mark.gpu)      # the same on CUDA (the GPU suite)
      for s, d, t in ((2, 512, torch.bfloat16), (16, 512, torch.bfloat16), (64, 192, torch.bfloat16),
                      (16, 512, torch.float32)))])
def test_combine_splits_matches_torch(device, num_splits, d_v, part_dtype):
    """The split combine against the log-sum-exp merge in float64: split counts that give one
    and several column blocks a program (32 and 64 splits: 128 and 64 columns), a d_v that is
    not a power of two, empty splits (-inf) and a row whose splits are all empty; float32
    partials and bf16 ones (read as int32 pairs: a swapped or shifted half would be off by far
    more than the tolerance)."""
    g = torch.Generator().manual_seed(num_splits)
    b, h = 2, 3
    part_o = torch.randn(b, h, num_splits, d_v, generator=g).to(part_dtype)
    part_lse = torch.randn(b, h, num_splits, generator=g) * 4
    part_lse[torch.rand(b, h, num_splits, generator=g) < 0.3] = -math.inf
    part_lse[..., 0] = part_lse[..., 0].nan_to_num(neginf=0.5)   # every row but one has a split
    part_lse[1, 2] = -math.inf
    out = torch.empty(b, h, d_v, dtype=torch.bfloat16)
    lse = torch.empty(b, h)
    out, lse = out.to(device), lse.to(device)
    combine_splits(part_o.to(device), part_lse.to(device), out, lse)
    w = torch.softmax(part_lse.double(), dim=-1).nan_to_num(0.0)
    ref = (w[..., None] * part_o.double()).sum(2)
    ref_lse = torch.logsumexp(part_lse.double(), dim=-1)
    live = torch.isfinite(ref_lse)
    assert not live[1, 2] and live.sum() == b * h - 1
    torch.testing.assert_close(out.cpu().double()[live], ref[live], rtol=1e-2, atol=1e-2)
    assert ((out.cpu().double() - ref)[live].abs() / ref[live].abs().clamp_min(1e-3)).median() < 4e-3
    assert torch.all(out.cpu()[1, 2] == 0)
    torch.testing.assert_close(lse.cpu().double()[live], ref_lse[live], rtol=1e-5, atol=1e-5)
    assert lse.cpu()[1, 2] == math.inf


@pytest.mark.parametrize("num_splits,nch", [
    (16, 2), (3, 1), (64, 4),
    *(pytest.param(s, c, marks=pytest.mark.gpu) for s, c in ((16, 2), (2, 2), (32, 1)))])
def test_combine_splits_scaled_float16(device, num_splits, nch):
    """fp16 partials each stored divided by a power of two per (row, split, column range): the
    combine against the float64 merge of the unscaled values, which span 1e-6 to 1e6 (outside
    fp16's range either way, so an exponent applied to the wrong range, split or weight, or not
    at all, is off by orders of magnitude), with empty splits and an all-empty row."""
    g = torch.Generator().manual_seed(num_splits + nch)
    b, h, d_v = 2, 3, 256
    mag = 10.0 ** torch.randint(-6, 7, (b, h, 1, 1), generator=g).double()
    o = torch.randn(b, h, num_splits, d_v, generator=g).double() * mag
    o = o * 10.0 ** torch.randint(-1, 2, (b, h, num_splits, nch), generator=g).double() \
        .repeat_interleave(d_v // nch, dim=-1)
    amax = o.abs().view(b, h, num_splits, nch, d_v // nch).amax(-1)
    e = (torch.floor(torch.log2(amax)) - 14).float()
    part_o = (o / torch.exp2(e.double()).repeat_interleave(d_v // nch, dim=-1)).half()
    assert torch.isfinite(part_o).all() and part_o.abs().max() < 32768
    part_lse = torch.randn(b, h, num_splits, generator=g) * 4
    part_lse[torch.rand(b, h, num_splits, generator=g) < 0.3] = -math.inf
    part_lse[..., 0] = part_lse[..., 0].nan_to_num(neginf=0.5)
    part_lse[1, 2] = -math.inf
    out = torch.empty(b, h, d_v, dtype=torch.bfloat16, device=device)
    lse = torch.empty(b, h, device=device)
    combine_splits(part_o.to(device), part_lse.to(device), out, lse, part_e=e.to(device))
    w = torch.softmax(part_lse.double(), dim=-1).nan_to_num(0.0)
    ref = (w[..., None] * o).sum(2)
    live = torch.isfinite(torch.logsumexp(part_lse.double(), dim=-1))
    got = out.cpu().double()
    scale = ref.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    assert ((got - ref).abs() / scale)[live].max() < 1e-2
    assert ((got - ref).abs() / ref.abs().clamp_min(1e-3 * scale))[live].median() < 4e-3
    assert torch.all(got[1, 2] == 0) and lse.cpu()[1, 2] == math.inf


def test_combine_splits_names_what_it_cannot_merge():
    """Partials other than float32 / bf16 / fp16, 16-bit ones at an odd d_v, an out whose rows
    are not whole 4-byte words for 16-bit pairs, fp16 partials without fitting exponents and
    exponents for other partials: one ValueError each, before any launch."""
    b, h, s, d = 1, 2, 3, 64
    lse = torch.zeros(b, h, s)
    out, o_lse = torch.empty(b, h, d, dtype=torch.bfloat16), torch.empty(b, h)
    with pytest.raises(ValueError, match="part_o must be float32, or bfloat16 / float16 with an "
                                         "even d_v; got torch.float64"):
        combine_splits(torch.randn(b, h, s, d).double(), lse, out, o_lse)
    with pytest.raises(ValueError, match="got torch.bfloat16 with d_v=63"):
        combine_splits(torch.randn(b, h, s, 63).bfloat16(), lse, out[..., :63], o_lse)
    odd = torch.empty(b, h, d + 1, dtype=torch.bfloat16)[..., :d]      # rows 65 values apart
    with pytest.raises(ValueError, match="out must have even strides"):
        combine_splits(torch.randn(b, h, s, d).bfloat16(), lse, odd, o_lse)
    half = torch.randn(b, h, s, d).half()
    for bad in (None, torch.zeros(b, h, s), torch.zeros(b, h, s, 3), torch.zeros(b, h, s, 64),
                torch.zeros(b, h, s, 2, dtype=torch.float64), torch.zeros(b, h, 2 * s, 2)):
        with pytest.raises(ValueError, match="float16 partials need part_e"):
            combine_splits(half, lse, out, o_lse, part_e=bad)
    with pytest.raises(ValueError, match="part_e is for float16 partials only"):
        combine_splits(torch.randn(b, h, s, d), lse, out, o_lse, part_e=torch.zeros(b, h, s, 1))


def test_choose_num_splits():
    assert choose_num_splits(128, 128, 2048) == 1            # 256 programs already fill 132 SMs
    # bf16 partials (half the bytes) tip B2 H128 from 16 to 32 splits (measured best, 6w), and
    # leave the batches where a second wave would cost more as they were
    assert [choose_num_splits(b, 128, 2048) for b in (1, 2, 4, 8, 16, 32)] == [32, 16, 16, 8, 4, 2]
    assert [choose_num_splits(b, 128, 2048, partial_bytes=2) for b in (1, 2, 4, 8, 16, 32)] == \
        [32, 32, 16, 8, 4, 2]
    with pytest.raises(ValueError, match="partial_bytes must be an int >= 1"):
        choose_num_splits(2, 128, 2048, partial_bytes=0)
    s8 = choose_num_splits(8, 128, 2048)
    assert 4 <= s8 <= 32
    assert choose_num_splits(1, 16, 2048) >= s8              # fewer programs -> more splits
    assert choose_num_splits(1, 16, 64, block_n=64) == 1      # one tile cannot be split
    assert choose_num_splits(8, 128, 2048, num_sms=1) == 1
    with pytest.raises(ValueError, match="batch"):
        choose_num_splits(0, 128, 2048)


def test_validation_errors(device):
    q, cache, idx = _inputs(61, b=2, h=16, d_nope=256, d_rope=64, k=32, num_slots=64,
                            kv_dtype="fp8_ds_mla", device=device)
    f = sparse_mla_decode
    s = 0.1
    with pytest.raises(ValueError, match="q must be a 3-D torch.bfloat16"):
        f(q.float(), cache, idx, s, 256)
    with pytest.raises(ValueError, match="q must be a 3-D"):
        f(q[0], cache, idx, s, 256)
    with pytest.raises(ValueError, match="q must have a unit last-dim stride"):
        f(q.transpose(1, 2).contiguous().transpose(1, 2), cache, idx, s, 256)
    with pytest.raises(ValueError, match="392 bytes"):
        f(q, cache[:, :388], idx, s, 256)
    with pytest.raises(ValueError, match="multiple of 128"):
        f(q, cache, idx, s, 192)
    with pytest.raises(ValueError, match="kv_cache must be torch.bfloat16"):
        f(q, cache.view(torch.int8), idx, s, 256)
    with pytest.raises(ValueError, match="bf16 kv_cache rows"):
        f(q, torch.zeros(8, 300, dtype=torch.bfloat16, device=device), idx, s, 256)
    with pytest.raises(ValueError, match="indices must be a 2-D torch.int32"):
        f(q, cache, idx.long(), s, 256)
    with pytest.raises(ValueError, match="indices must have B=2"):
        f(q, cache, idx[:1], s, 256)
    with pytest.raises(ValueError, match="sm_scale"):
        f(q, cache, idx, float("nan"), 256)
    with pytest.raises(ValueError, match="sm_scale"):
        f(q, cache, idx, -1.0, 256)
    with pytest.raises(ValueError, match="d_v"):
        f(q, cache, idx, s, 400)
    for kw, msg in [({"block_h": 48}, "block_h"), ({"block_n": 8}, "block_n"),
                    ({"num_warps": 3}, "num_warps"), ({"num_stages": 0}, "num_stages"),
                    ({"num_splits": 0}, "num_splits"), ({"prefetch": "all"}, "prefetch"),
                    ({"mma_dtype": torch.float32}, "mma_dtype"),
                    ({"split_scores": "yes"}, "split_scores")]:
        with pytest.raises(ValueError, match=msg):
            f(q, cache, idx, s, 256, **kw)


def test_empty_top_k(device):
    q, cache, idx = _inputs(71, b=2, h=16, d_nope=256, d_rope=64, k=8, num_slots=16,
                            kv_dtype="bf16", device=device)
    out, lse = sparse_mla_decode(q, cache, idx[:, :0], 0.1, 256)
    assert torch.all(out == 0) and torch.all(lse == math.inf)


# ------------------------------- GPU, DeepSeek-V3.2 size -------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("b", [4, 16])
@pytest.mark.parametrize("split_scores", [False, True])
def test_dsv32_size_gpu(kv_dtype, b, split_scores):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(100 + b)
    n = 65536
    q = torch.randn(b, 128, 576, generator=g, device=dev).to(torch.bfloat16)
    kv = torch.randn(n, 576, generator=g, device=dev).to(torch.bfloat16)
    cache = make_kv_cache(kv, kv_dtype, d_nope=512)
    idx = torch.rand(b, n, generator=g, device=dev).topk(2048, dim=1).indices.to(torch.int32)
    idx[:, -100:] = -1
    idx[b - 1] = -1                                   # one fully masked row
    out, lse, _, _ = _check(q, cache, idx, 512, kv_dtype, split_scores=split_scores)
    assert torch.all(out[b - 1] == 0) and torch.all(lse[b - 1] == math.inf)
    # fp16 MMA operands (the interpreter's instantiation) agree with the bf16 ones
    out16, lse16 = sparse_mla_decode(q, cache, idx, 576 ** -0.5, 512, mma_dtype=torch.float16,
                                     split_scores=split_scores)
    assert ((out16.float() - out.float()).norm() / out.float().norm()).item() <= REL_TOL



# ------------------------------- launch info and the tuning grid -------------------------------

def test_with_info_reports_the_launch(device):
    from backends.kernels.sparse_mla_decode import sparse_mla_decode_with_info
    q, cache, idx = _inputs(81, b=2, h=16, d_nope=256, d_rope=64, k=100, num_slots=300,
                            kv_dtype="bf16", device=device)
    out, lse, info = sparse_mla_decode_with_info(q, cache, idx, 0.1, 256, block_n=32)
    ref_out, ref_lse = sparse_mla_decode(q, cache, idx, 0.1, 256, block_n=32)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    # defaults resolved: block_h = 16 for H=16, bf16 -> 2 stages, splits from the heuristic
    assert (info.block_h, info.block_n, info.num_warps, info.num_stages, info.prefetch,
            info.split_scores) == (16, 32, 8, 2, "index", False)
    # 64-head programs split the scores between their warpgroups; fp8 rows take 3 stages either
    # way, bf16 rows 2
    fq, fcache, fidx = _inputs(82, b=1, h=64, d_nope=256, d_rope=64, k=40, num_slots=100,
                               kv_dtype="fp8_ds_mla", device=device)
    for kw, want in [({}, (64, True, 3)), ({"split_scores": False}, (64, False, 3))]:
        _, _, finfo = sparse_mla_decode_with_info(fq, fcache, fidx, 0.1, 256, **kw)
        assert (finfo.block_h, finfo.split_scores, finfo.num_stages) == want
    # fp8 rows of 16 to 63 heads take padded 64-head programs too (bf16 rows: the next power
    # of two, above); fewer than 16 heads keep theirs
    for h, want in [(16, 64), (32, 64), (8, 16)]:
        hq, hcache, hidx = _inputs(83, b=1, h=h, d_nope=256, d_rope=64, k=40, num_slots=100,
                                   kv_dtype="fp8_ds_mla", device=device)
        _, _, hinfo = sparse_mla_decode_with_info(hq, hcache, hidx, 0.1, 256)
        assert hinfo.block_h == want and hinfo.split_scores == (want == 64)
        _check(hq, hcache, hidx, 256, "fp8_ds_mla")
    assert info.num_splits == choose_num_splits(2, 16, 100, block_h=16, block_n=32)
    # a split count past the 4 tiles is cut to one tile per split; 3 of 4 tiles -> 2 splits of 2
    assert sparse_mla_decode_with_info(q, cache, idx, 0.1, 256, block_n=32, num_splits=64)[2].num_splits == 4
    assert sparse_mla_decode_with_info(q, cache, idx, 0.1, 256, block_n=32, num_splits=3)[2].num_splits == 2
    kw = info.launch_kwargs()
    assert kw["num_splits"] == info.num_splits
    again, _ = sparse_mla_decode(q, cache, idx, 0.1, 256, **kw)
    assert torch.equal(again, out)
    if device.type == "cpu":                     # nothing compiled under the interpreter
        assert info.n_regs is None and info.n_spills is None and info.smem_bytes is None
    else:
        assert 0 < info.n_regs <= 255 and info.n_spills >= 0 and info.smem_bytes > 0


def _tune_kernel_paths():
    """The tuning grid's variants, one per distinct code path in the interpreter (warps and
    pipeline stages change nothing there)."""
    from harness.bench.attention import TUNE
    seen = {}
    for shape in TUNE:
        for name, kw, formats in shape.variants:
            if kw.get("kernel") == "ws":      # Hopper only: tests/test_sparse_mla_decode_ws.py
                continue
            key = tuple(sorted((k, v) for k, v in kw.items() if k not in ("num_warps", "num_stages")))
            seen.setdefault(key, (f"{shape.name}:{name}", kw, formats))
    return list(seen.values())


@pytest.mark.parametrize("name, kw, formats", _tune_kernel_paths(), ids=lambda v: v if isinstance(v, str) else "")
def test_tuning_variants_match_reference(device, name, kw, formats):
    # H=16 (one head block; block_h=64 pads it), K=200: 4 tiles of 64, 7 of 32, 13 of 16, so
    # every split count of the grid is clamped or cuts tiles unevenly
    for kv_dtype in formats:
        q, cache, idx = _inputs(91, b=2, h=16, d_nope=256, d_rope=64, k=200, num_slots=500,
                                kv_dtype=kv_dtype, device=device)
        _check(q, cache, idx, 256, kv_dtype, **kw)


def test_tune_summary_picks_the_fastest_correct_variant():
    from harness.bench.attention import tune_summary
    base = {"case": "B8", "kv_dtype": "bf16", "kernel": "sparse_mla_decode"}
    rows = [
        {**base, "kernel": "flashmla", "variant": None, "status": "ok", "latency_us_median": 50.0},
        {**base, "variant": "default", "status": "ok", "latency_us_median": 40.0, "tflops": 1.0,
         "launch_config": '{"num_splits": 8}', "n_regs": 255, "n_spills": 1, "smem_bytes": 2048},
        {**base, "variant": "fast_wrong", "status": "incorrect", "latency_us_median": 10.0},
        {**base, "variant": "n32", "status": "ok", "latency_us_median": 30.0, "tflops": 2.0,
         "launch_config": '{"num_splits": 16}', "n_regs": 200, "n_spills": 0, "smem_bytes": 4096},
        {**base, "variant": "oom", "status": "invalid"},
        {**base, "kv_dtype": "fp8_ds_mla", "kernel": "flashmla", "status": "unavailable"},
        {**base, "kv_dtype": "fp8_ds_mla", "variant": "default", "status": "ok",
         "latency_us_median": 70.0, "tflops": 3.0, "launch_config": '{"num_splits": 4}'},
        {"kernel": "convert_req_index_to_global_index", "case": "B8", "kv_dtype": "bf16",
         "status": "ok", "latency_us_median": 1.0},
        # the same shape as CUDA-graph replays: a summary row of its own, against FlashMLA's
        # replay (not its Python call), even where a Python call of ours was faster
        {**base, "kernel": "flashmla", "variant": None, "status": "ok", "latency_us_median": 45.0,
         "cuda_graph": True},
        {**base, "variant": "default", "status": "ok", "latency_us_median": 36.0, "tflops": 1.1,
         "launch_config": '{"num_splits": 8}', "cuda_graph": True},
    ]
    bf16, fp8, bf16_graph = tune_summary(rows)
    assert (bf16["mode"], fp8["mode"], bf16_graph["mode"]) == ("eager", "eager", "graph")
    assert (bf16_graph["variant"], bf16_graph["ours_us"], bf16_graph["flashmla_us"]) == ("default", 36.0, 45.0)
    assert bf16_graph["ratio"] == pytest.approx(0.8) and bf16_graph["n_ok"] == 1
    assert (bf16["variant"], bf16["ours_us"], bf16["default_us"], bf16["flashmla_us"]) == ("n32", 30.0, 40.0, 50.0)
    assert bf16["ratio"] == pytest.approx(0.6) and bf16["num_splits"] == 16 and bf16["tflops"] == 2.0
    assert (bf16["n_regs"], bf16["n_spills"], bf16["smem_kb"], bf16["n_ok"]) == (200, 0, 4.0, 2)
    assert bf16["not_ok"] == "fast_wrong:incorrect oom:invalid"
    assert fp8["variant"] == "default" and fp8["ours_us"] == 70.0
    assert math.isnan(fp8["flashmla_us"]) and math.isnan(fp8["ratio"]) and fp8["n_regs"] is None


def test_tune_quick_runs_every_variant_against_the_reference(tmp_path, capsys):
    from harness import results
    from harness.bench.__main__ import main
    from harness.bench.attention import TUNE_QUICK
    import json
    rc = main(["run", "attention", "--quick", "--tune", "--formats", "bf16", "--out", str(tmp_path)])
    df = results.load(tmp_path)
    ours = df[df["kernel"] == "sparse_mla_decode"]
    assert list(ours["variant"]) == [v[0] for v in TUNE_QUICK[0].variants]
    assert set(ours["status"]) == {"ok"} and (ours["max_rel_err"] <= 1e-2).all()
    # the resolved launch: every keyword argument, the split count actually launched
    cfg = dict(zip(ours["variant"], map(json.loads, ours["launch_config"])))
    assert cfg["split3_n32"]["num_splits"] == 3 and cfg["split3_n32"]["block_n"] == 32
    assert set(cfg["default"]) == {"block_h", "block_n", "num_warps", "num_stages", "num_splits", "prefetch",
                                   "split_scores"}
    theirs = df[df["kernel"] == "flashmla"]
    assert rc == 0 and list(theirs["status"]) == ["unavailable"]
    assert "fastest correct variant per shape" in capsys.readouterr().out


@pytest.mark.gpu
def test_tune_quick_times_graph_replays_on_the_gpu(tmp_path):
    """On CUDA, --tune times every variant (and FlashMLA) as a Python call and as a CUDA-graph
    replay, both checked; the summary has a line per mode."""
    from harness import results
    from harness.bench.__main__ import main
    from harness.bench.attention import TUNE_QUICK, tune_summary
    rc = main(["run", "attention", "--quick", "--tune", "--formats", "bf16", "--out", str(tmp_path)])
    df = results.load(tmp_path)
    ours = df[df["kernel"] == "sparse_mla_decode"]
    n = len(TUNE_QUICK[0].variants)
    assert rc == 0 and len(ours) == 2 * n and int(ours["cuda_graph"].sum()) == n
    assert set(ours["status"]) == {"ok"} and (ours["max_rel_err"] <= 1e-2).all()
    assert sorted(r["mode"] for r in tune_summary(df)) == ["eager", "graph"]


# ------------------------------- what the compiler makes of it (no GPU) -------------------------------

_COMPILE_REPORT = r"""
import json, re, sys
from backends.kernels.sparse_mla_decode import compile_for_arch
out = {}
for split in (True, False):
    k = compile_for_arch(sys.argv[1], split_scores=None if split else False)
    warps = sorted(set(re.findall(r"nvidia_mma<\{[^}]*warpsPerCTA = \[([0-9, ]+)\]", k.asm["ttgir"])))
    out["split" if split else "replicated"] = {
        "warps": warps, "wgmma": k.asm["ptx"].count("wgmma.mma_async"), "shared": k.metadata.shared}
print(json.dumps(out))
"""


#: dynamic shared memory a program of the main kernel may have on the H200, in bytes: 227 KB
#: less the 1 KB of static shared memory ptxas gives the compiled kernel (``cuobjdump
#: -res-usage``: SHARED:1024; the driver takes the two together up to 227 KB)
_H200_SMEM = 227 * 1024 - 1024


def _compile_report(script: str, *args: str) -> dict:
    """Runs ``script`` (which prints a JSON object last) in a process of its own with
    TRITON_INTERPRET unset (this one interprets the kernels) and returns what it printed."""
    import json
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                       text=True, timeout=600, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
def test_split_scores_compiles_each_tile_s_once_for_sm90(kv_dtype):
    """Compiled for sm_90a by the installed Triton (no GPU needed): with the default
    ``split_scores`` at 64 heads no MMA layout puts all 8 warps along M (the chained-dot layout
    in which both warpgroups compute the whole of S), and the PTX has no more wgmma instructions
    than the replicated layout's, within the H200's shared memory (``_H200_SMEM``). A refactor
    that chains the score dots into the PV dot again fails here, where every numeric test would
    still pass."""
    rep = _compile_report(_COMPILE_REPORT, kv_dtype)
    split, replicated = rep["split"], rep["replicated"]
    assert split["warps"] and "8, 1" not in split["warps"], split
    # (with Triton 3.6 and 3.9 the replicated layout has [8, 1] and 76 wgmma against 40; a
    # Triton that stops chaining the layouts would make the two equal, not fail this)
    assert 0 < split["wgmma"] <= replicated["wgmma"]
    assert split["shared"] <= _H200_SMEM


_FP8_STAGES_REPORT = r"""
import json
from backends.kernels.sparse_mla_decode import compile_for_arch
out = {}
for stages in (None, 2, 3):
    k = compile_for_arch("fp8_ds_mla", num_stages=stages)
    out[str(stages)] = {"wgmma": k.asm["ptx"].count("wgmma.mma_async"), "shared": k.metadata.shared,
                        "stages": k.metadata.num_stages}
print(json.dumps(out))
"""


def test_fp8_split_scores_fits_three_stages_for_sm90():
    """fp8_ds_mla rows at 64 heads with ``split_scores``, compiled for sm_90a by the installed
    Triton: 3 pipeline stages (the default) fit the H200's 227 KB of shared memory, with the
    same MMAs as 2 stages. The rope part of K reaching its MMA through registers is what makes
    them fit (231424 bytes, all there is; 239616 when the MMA reads the pipeline's copy, as
    before): a change that loses it fails here, where every numeric test would still pass."""
    rep = _compile_report(_FP8_STAGES_REPORT)
    assert rep["None"]["stages"] == 3
    assert rep["3"]["shared"] <= _H200_SMEM, rep
    assert rep["2"]["shared"] < rep["3"]["shared"]
    assert 0 < rep["3"]["wgmma"] == rep["2"]["wgmma"]


def test_compile_for_arch_refuses_the_interpreter():
    from backends.kernels.sparse_mla_decode import _interpreting, compile_for_arch
    if not _interpreting():
        pytest.skip("the kernels are compiled here")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        compile_for_arch("bf16")
    with pytest.raises(ValueError, match="kv_dtype"):
        compile_for_arch("fp16")
