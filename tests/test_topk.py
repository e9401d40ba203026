"""Per-row top-k kernel and its plan, judged against torch.topk on fresh random rows."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from backends.kernels.topk import (MAX_CHUNKS, METHOD_PAGED, RADIX_BINS, RADIX_LIST, TopkLaunch,
                                   _launch_params, _order_key, _sample_scan_block,
                                   _small_block, _threshold_value,
                                   candidate_capacity, launch_capacity, launch_topk,
                                   plan_build_count, plan_topk, sample_target, topk_per_row,
                                   validate_topk_inputs)
from harness.indexer_ref import paged_transform_ref, topk_ref


def assert_valid_topk(pos, logits, lengths, k):
    """Score-set equality with torch.topk (tie-robust), -1 padding exactly where expected,
    no duplicates, every position inside the row."""
    pos, logits, lengths = pos.cpu(), logits.cpu(), lengths.cpu()
    assert pos.dtype == torch.int32 and pos.shape == (logits.shape[0], k)
    for b in range(logits.shape[0]):
        n = int(lengths[b])
        kk = min(k, n)
        p = pos[b].long()
        assert bool((p[:kk] >= 0).all()), f"row {b}: missing positions"
        assert bool((p[kk:] == -1).all()), f"row {b}: -1 padding wrong"
        sel = p[:kk]
        assert bool((sel < n).all()), f"row {b}: position past the length"
        assert sel.unique().numel() == kk, f"row {b}: duplicate positions"
        got = logits[b, sel].sort().values
        ref = torch.topk(logits[b, :n], kk).values.sort().values
        assert torch.equal(got, ref), f"row {b}: selected scores differ from torch.topk"


def _rows(B, N, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, N, generator=g).to(device)


#: half the candidate capacity (CAP = 2 * next_pow2(k)), the threshold aimed at 1.5k with a
#: 7/8 .. 9/8 window in every row (harness/bench/indexer.py TOPK_VARIANTS "cap2_target1.5")
CAP2 = TopkLaunch(cap_factor=2, target_factor=1.5, window_lo=0.875, window_hi=1.125,
                  long_row=None)
#: the default before the length-aware threshold: 2k with a 3/4 .. 3/2 window, one block
UNIFORM_T2 = TopkLaunch(target_factor=2.0, window_lo=0.75, window_hi=1.5, small_select=False,
                        long_row=None)


def test_mixed_lengths_all_paths(device):
    """Pass-through, direct (<= cap), split scan (> cap, several chunks), empty rows."""
    k = 16
    cap = candidate_capacity(k)
    assert cap == 64
    lengths = torch.tensor([0, 5, 16, 17, 64, 65, 300, 777, 1000], dtype=torch.int32)
    B, N = lengths.shape[0], 1000
    logits = _rows(B, N, 0, device)
    # garbage past each row's length must be ignored
    cols = torch.arange(N, device=device)
    logits = torch.where(cols[None, :] >= lengths.to(device)[:, None], 1e30, logits)
    lengths = lengths.to(device)
    plan = plan_topk(lengths, k, chunk_size=128)
    assert plan.max_chunks == 8 and plan.row_chunks.tolist() == [0, 0, 0, 0, 0, 1, 3, 7, 8]
    pos = topk_per_row(logits, lengths, k, plan=plan)
    assert_valid_topk(pos, logits.cpu(), lengths.cpu(), k)
    # deterministic rule: ascending positions, ties to lower positions == stable-sort reference
    assert torch.equal(pos.cpu(), topk_ref(logits.cpu(), lengths.cpu(), k))


def test_ties_and_infinities(device):
    """Heavy ties (integer scores), all-equal rows and -inf entries inside the length."""
    k = 12
    g = torch.Generator().manual_seed(1)
    B, N = 6, 400
    logits = torch.randint(-3, 4, (B, N), generator=g).float()
    logits[1] = 2.5  # all equal: lower positions win
    logits[2, ::3] = float("-inf")
    logits[3, :] = float("-inf")
    logits[3, 7] = 0.0
    logits[4] = torch.randint(0, 2, (N,), generator=g).float()  # ~200 ties at the top -> fallback
    # -0.0 and +0.0 compare equal: they tie and go by position (as in torch)
    logits[5] = torch.tensor([-0.0, 0.0, -1.0])[torch.randint(0, 3, (N,), generator=g)]
    lengths = torch.tensor([400, 300, 399, 250, 400, 90], dtype=torch.int32)
    lengths_d = lengths.to(device)  # one tensor: the plan is tied to it
    plan = plan_topk(lengths_d, k, chunk_size=64)
    pos = topk_per_row(logits.to(device), lengths_d, k, plan=plan)
    assert int(plan.counts[4].sum()) > plan.cap  # row 4 overflowed: exact whole-row path
    assert_valid_topk(pos.cpu(), logits, lengths, k)
    assert torch.equal(pos.cpu(), topk_ref(logits, lengths, k))
    assert pos[1].tolist() == list(range(k))


@pytest.mark.parametrize("launch", [TopkLaunch(threshold_window=False), TopkLaunch(),
                                    TopkLaunch(fuse_threshold=True), CAP2],
                         ids=["exact_threshold", "windowed", "fused_windowed", "cap2_target1.5"])
def test_adversarial_sample_falls_back(device, launch):
    """High values exactly at the threshold's sample positions: too few candidates, the select
    kernel must fall back to the exact whole-row path and still be right, whichever way the
    threshold was found (exact quantile, the window, inside the scan)."""
    k, n = 8, 500
    cap = candidate_capacity(k, launch.cap_factor)
    sample = min(launch.sample_max, cap)
    logits = torch.randn(1, n, generator=torch.Generator().manual_seed(2)) - 10.0
    samp = (torch.arange(sample) * n) // sample
    logits[0, samp] = 10.0 + torch.rand(sample, generator=torch.Generator().manual_seed(3))
    lengths = torch.tensor([n], dtype=torch.int32)
    lengths_d = lengths.to(device)
    plan = plan_topk(lengths_d, k, chunk_size=128, cap_factor=launch.cap_factor)
    pos = topk_per_row(logits.to(device), lengths_d, k, plan=plan, launch=launch)
    assert int(plan.counts.sum()) < k  # the sampled threshold really was too high
    assert_valid_topk(pos.cpu(), logits, lengths, k)
    assert torch.equal(pos.cpu(), topk_ref(logits, lengths, k))


@pytest.mark.parametrize("block", [16, 64])
def test_scan_blocks_and_chunk_layouts_exact(block, device):
    """The stable-sort reference's output on rows whose chunks end in 0, 1, 2 and many full
    scan blocks, whose early chunks hold no candidate (rising rows: the whole top-k in the last
    chunk), and whose k-th value is tied across chunks (the select's tie path: the lowest
    positions of the tie are taken)."""
    k, chunk, N = 16, 128, 1000
    launch = TopkLaunch(scan_block_max=block, scan_stages=1)
    assert _sample_scan_block(launch, plan_topk(torch.tensor([N], dtype=torch.int32), k,
                                                chunk_size=chunk)) == block
    g = torch.Generator().manual_seed(31 + block)
    lengths = torch.tensor([130, 145, 161, 250, 1000, 1000, 700, 999], dtype=torch.int32)
    logits = torch.randn(lengths.numel(), N, generator=g)
    logits[4] = torch.arange(N).float() + 0.5 * torch.rand(N, generator=g)   # rising
    perm = torch.randperm(N, generator=g)
    ties = perm[10:30]
    logits[5, perm[:10]] = 100.0 + torch.rand(10, generator=g)
    logits[5, ties] = 50.0           # 10 above it, 20 at it: 6 of the tie taken
    lengths_d = lengths.to(device)
    plan = plan_topk(lengths_d, k, chunk_size=chunk)
    pos = topk_per_row(logits.to(device), lengths_d, k, plan=plan, launch=launch)
    counts = plan.counts.cpu()
    assert int(counts[4, :7].sum()) == 0 and k <= int(counts[4].sum()) <= plan.cap
    assert int((logits[5, :1000] >= 50.0).sum()) == 30
    assert k <= int(counts[5].sum()) <= plan.cap   # row 5 went through the select, not the fallback
    assert torch.equal(pos.cpu(), topk_ref(logits, lengths, k))
    taken = pos[5].cpu().long()
    assert sorted(taken[logits[5, taken] == 50.0].tolist()) == sorted(ties.tolist())[:6]


def test_random_many_rows(device):
    k = 32
    g = torch.Generator().manual_seed(4)
    B, N = 12, 1500
    lengths = torch.randint(0, N + 1, (B,), generator=g).to(torch.int32)
    lengths[0] = N
    logits = torch.randn(B, N, generator=g) * torch.rand(B, 1, generator=g) * 50
    pos = topk_per_row(logits.to(device), lengths.to(device), k, check=True)
    assert_valid_topk(pos.cpu(), logits, lengths, k)


def test_top_k_longer_than_every_row(device):
    lengths = torch.tensor([3, 0, 7], dtype=torch.int32, device=device)
    logits = _rows(3, 7, 5, device)
    pos = topk_per_row(logits, lengths, 10)
    expect = [[0, 1, 2] + [-1] * 7, [-1] * 10, list(range(7)) + [-1] * 3]
    assert pos.cpu().tolist() == expect


def test_plan_is_built_once_and_reused(device):
    k = 16
    lengths = torch.tensor([700, 20, 129, 0], dtype=torch.int32, device=device)
    before = plan_build_count()
    plan = plan_topk(lengths, k, chunk_size=256)
    assert plan_build_count() == before + 1
    for layer in range(3):
        logits = _rows(4, 700, 100 + layer, device)
        pos = topk_per_row(logits, lengths, k, plan=plan)
        assert_valid_topk(pos.cpu(), logits.cpu(), lengths.cpu(), k)
    assert plan.uses == 3
    assert plan_build_count() == before + 1  # the calls did not re-plan


def test_plan_contents():
    lengths = torch.tensor([5, 64, 65, 1000], dtype=torch.int32)
    plan = plan_topk(lengths, 16, chunk_size=256)
    assert plan.cap == 64 and plan.max_len == 1000 and plan.max_chunks == 4
    assert plan.row_chunks.tolist() == [0, 0, 1, 4]
    assert plan.candidates.shape == (4, 4, 64) and plan.counts.shape == (4, 4)
    short = plan_topk(torch.tensor([5, 60], dtype=torch.int32), 16)
    assert not short.needs_scan and short.row_chunks.tolist() == [0, 0]
    auto = plan_topk(torch.full((64,), 131072, dtype=torch.int32), 2048, num_sms=132)
    assert auto.cap == 8192 and auto.chunk_size == 16384 and auto.max_chunks == 8


def test_validation_errors(device):
    logits = _rows(2, 50, 6, device)
    lengths = torch.tensor([50, 10], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="top_k"):
        topk_per_row(logits, lengths, 0)
    with pytest.raises(ValueError, match="lengths must be an int32"):
        topk_per_row(logits, lengths.long(), 4)
    with pytest.raises(ValueError, match="logits must be a float32"):
        topk_per_row(logits.half(), lengths, 4)
    with pytest.raises(ValueError, match=">= 0"):
        topk_per_row(logits, torch.tensor([-1, 3], dtype=torch.int32, device=device), 4)
    with pytest.raises(ValueError, match="<= logits.shape"):
        topk_per_row(logits, torch.tensor([51, 3], dtype=torch.int32, device=device), 4,
                     check=True)
    bad = logits.clone()
    bad[1, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        validate_topk_inputs(bad, lengths, 4)
    bad[1, 30] = float("nan")  # past row 1's length: allowed
    bad[1, 3] = 0.0
    validate_topk_inputs(bad, lengths, 4)
    plan = plan_topk(lengths, 4)
    with pytest.raises(ValueError, match="top_k=4"):
        topk_per_row(logits, lengths, 5, plan=plan)
    with pytest.raises(ValueError, match="different lengths"):
        topk_per_row(logits, lengths.clone(), 4, plan=plan)
    with pytest.raises(ValueError, match="out must be"):
        topk_per_row(logits, lengths, 4, plan=plan, out=torch.empty(2, 5, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", [4096, 32768])
def test_gpu_dsv32_size(ctx):
    k = 2048
    g = torch.Generator().manual_seed(ctx)
    B = 16
    lengths = torch.randint(1, ctx + 1, (B,), generator=g).to(torch.int32)
    lengths[0], lengths[1] = ctx, k
    logits = torch.randn(B, ctx, generator=g).cuda()
    lengths = lengths.cuda()
    plan = plan_topk(lengths, k)
    pos = topk_per_row(logits, lengths, k, plan=plan)
    assert_valid_topk(pos.cpu(), logits.cpu(), lengths.cpu(), k)
    # quantized scores (many ties) through the same plan
    tied = (logits * 4).round()
    pos = topk_per_row(tied, lengths, k, plan=plan)
    assert torch.equal(pos.cpu(), topk_ref(tied.cpu(), lengths.cpu(), k))


#: the top-k launch variants that change the threshold path or the k-th-key search (radix
#: select by 2- or 4-bit digit histograms instead of a bisection; the bench times them)
THRESHOLD_VARIANTS = {
    # the exact sample quantile aims at 2k here: at k = 16 the sample (64 values) puts 1.5k at
    # rank 2, too noisy for the fast path the test asserts
    "exact_threshold": TopkLaunch(threshold_window=False, target_factor=2.0),
    "fused": TopkLaunch(fuse_threshold=True, threshold_window=False, target_factor=2.0),
    "window": TopkLaunch(),
    "uniform_t2": UNIFORM_T2,
    # rows over 300 elements take the long rows' target and window (2k, 3/4 .. 3/2), the others
    # the short rows' (1.5k, 1 .. 9/8), in the same call; no half block (rows of 1000)
    "long_row_300": TopkLaunch(long_row=300),
    "fused_window": TopkLaunch(fuse_threshold=True),
    "radix_bits2": TopkLaunch(radix_bits=2),
    "radix_bits4": TopkLaunch(radix_bits=4),
    "exact_threshold_radix_bits4": TopkLaunch(threshold_window=False, radix_bits=4,
                                              target_factor=2.0),
    # scan blocks of chunk_size // scan_stages rounded down to a power of two (128 // 3 -> 32)
    "scan_stages3": TopkLaunch(scan_stages=3),
    "scan_stages5_block4096": TopkLaunch(scan_stages=5, scan_block_max=4096),
    # a smaller target and window (at k = 16 the capacity stays 64: the [64, 16384] clamp)
    "cap2_target1.5": CAP2,
}
RADIX = TopkLaunch(algorithm="radix")


def test_threshold_window_is_the_default():
    assert TopkLaunch().threshold_window and TopkLaunch().algorithm == "sample"


@pytest.mark.parametrize("name", sorted(THRESHOLD_VARIANTS))
def test_threshold_variants_exact(name, device):
    """Mixed lengths over several chunks, heavy ties, +-0 and -inf, an all-equal row: the
    result equals the stable-sort reference (ascending positions, ties to lower positions)."""
    launch = THRESHOLD_VARIANTS[name]
    k = 16
    g = torch.Generator().manual_seed(9)
    lengths = torch.tensor([0, 5, 64, 65, 300, 777, 1000, 1000, 1000, 900], dtype=torch.int32)
    B, N = lengths.shape[0], 1000
    logits = torch.randn(B, N, generator=g) * torch.rand(B, 1, generator=g) * 30
    logits[6] = torch.randint(-3, 4, (N,), generator=g).float()
    logits[7] = 1.5
    logits[8, ::3] = float("-inf")
    logits[9] = torch.tensor([-0.0, 0.0, -1.0])[torch.randint(0, 3, (N,), generator=g)]
    lengths_d = lengths.to(device)
    plan = plan_topk(lengths_d, k, chunk_size=128, cap_factor=launch.cap_factor)
    pos = topk_per_row(logits.to(device), lengths_d, k, plan=plan, launch=launch)
    assert_valid_topk(pos.cpu(), logits, lengths, k)
    assert torch.equal(pos.cpu(), topk_ref(logits, lengths, k))
    # the candidate counts of the random long rows lie in [k, cap] (the fast path was taken)
    for b in (4, 5):
        assert k <= int(plan.counts[b].sum()) <= launch_capacity(launch, k, plan)


def test_length_aware_threshold_and_half_block():
    """The kernels get both rows' targets and windows (k = 2048: 1.5k with 1 .. 9/8 up to
    long_row, 2k with 3/4 .. 3/2 past it), and the select's half block only in calls whose rows
    are all short (a call lasts as long as its slowest row)."""
    cap, sample, thr = _launch_params(TopkLaunch(), 2048)
    assert (cap, sample) == (8192, 2048)
    assert (thr["target"], thr["target_long"], thr["long_row"]) == (3072, 4096, 65536)
    assert (thr["WLO_N"], thr["WLO_D"], thr["WHI_N"], thr["WHI_D"]) == (1, 1, 9, 8)
    assert (thr["LLO_N"], thr["LLO_D"], thr["LHI_N"], thr["LHI_D"]) == (3, 4, 3, 2)
    assert _launch_params(TopkLaunch(long_row=None), 2048)[2]["long_row"] == 2 ** 31 - 1
    short = plan_topk(torch.tensor([65536, 9000], dtype=torch.int32), 2048)
    long = plan_topk(torch.tensor([65537, 9000], dtype=torch.int32), 2048)
    assert _small_block(TopkLaunch(), short, 8192) == 4096
    assert _small_block(TopkLaunch(), long, 8192) == 0
    assert _small_block(TopkLaunch(long_row=None), long, 8192) == 4096
    assert _small_block(UNIFORM_T2, short, 8192) == 0
    assert _small_block(TopkLaunch(), short, 2048) == 0          # CAP / 2 would not hold 2k


def test_launch_validation():
    with pytest.raises(ValueError, match="TopkLaunch.radix_bits"):
        TopkLaunch(radix_bits=3)
    with pytest.raises(ValueError, match="TopkLaunch.scan_block_max"):
        TopkLaunch(scan_block_max=1000)
    with pytest.raises(ValueError, match="TopkLaunch.select_warps"):
        TopkLaunch(select_warps=6)
    with pytest.raises(ValueError, match="TopkLaunch.scan_stages"):
        TopkLaunch(scan_stages=0)
    with pytest.raises(ValueError, match="TopkLaunch.algorithm must be one of sample, radix"):
        TopkLaunch(algorithm="bitonic")
    with pytest.raises(ValueError, match="TopkLaunch.fuse_threshold"):
        TopkLaunch(algorithm="radix", fuse_threshold=True)


def test_launch_capacity_and_target_validation(device):
    assert candidate_capacity(2048) == 8192 and candidate_capacity(2048, 2) == 4096
    assert candidate_capacity(16, 2) == 64 and candidate_capacity(32, 2) == 64
    assert sample_target(2048) == 3072 and sample_target(2048, long=True) == 4096
    assert sample_target(2048, CAP2) == 3072 and sample_target(2048, UNIFORM_T2) == 4096
    assert sample_target(2048, TopkLaunch(cap_factor=2, target_factor=1.25, window_lo=0.8,
                                          window_hi=1.6, long_row=None)) == 2560
    with pytest.raises(ValueError, match="TopkLaunch.cap_factor must be a power of two >= 2"):
        TopkLaunch(cap_factor=3)
    with pytest.raises(ValueError, match="TopkLaunch.cap_factor"):
        TopkLaunch(cap_factor=1)
    with pytest.raises(ValueError, match=r"TopkLaunch.target_factor must be in \(1, "):
        TopkLaunch(cap_factor=2, target_factor=2.0)  # no room below CAP = 2 next_pow2(k)
    with pytest.raises(ValueError,
                       match=r"TopkLaunch.long_target_factor must be in .* = \(1, 1.5\]"):
        TopkLaunch(cap_factor=2)  # the long rows' 2k
    TopkLaunch(cap_factor=2, long_row=None)  # no long rows: their target is not used
    with pytest.raises(ValueError, match="TopkLaunch.target_factor"):
        TopkLaunch(target_factor=1.0)
    with pytest.raises(ValueError, match="TopkLaunch.target_factor must be a finite number"):
        TopkLaunch(target_factor=float("nan"))
    with pytest.raises(ValueError, match="TopkLaunch.window_hi must be <= cap_factor / target"):
        TopkLaunch(cap_factor=2, window_hi=1.5, long_row=None)  # 3/2 of 1.5k > CAP
    with pytest.raises(ValueError, match="TopkLaunch.window_lo must be >= 1 / target_factor"):
        TopkLaunch(cap_factor=2, target_factor=1.25, window_lo=0.75, window_hi=1.6,
                   long_row=None)  # 3/4 of 1.25k < k
    with pytest.raises(ValueError, match="TopkLaunch.long_window_lo must be >= 1 / "
                                         "long_target_factor"):
        TopkLaunch(long_window_lo=0.25)
    with pytest.raises(ValueError, match=r"TopkLaunch.long_row must be an int >= 0"):
        TopkLaunch(long_row=-1)
    with pytest.raises(ValueError, match="TopkLaunch.threshold_warps must be one of"):
        TopkLaunch(threshold_warps=3)
    with pytest.raises(ValueError, match="TopkLaunch.threshold_warps must be one of"):
        TopkLaunch(threshold_warps=4.0)
    with pytest.raises(ValueError, match="TopkLaunch.radix_bits must be 1, 2 or 4"):
        TopkLaunch(radix_bits=True)
    with pytest.raises(ValueError, match="TopkLaunch.scan_stages must be an int"):
        TopkLaunch(scan_stages=True)
    with pytest.raises(ValueError, match="TopkLaunch.long_row applies to algorithm='sample'"):
        TopkLaunch(algorithm="radix", long_row=12345)
    with pytest.raises(ValueError, match=r"TopkLaunch.window_lo must be in \(0, 1\]"):
        TopkLaunch(window_lo=1.2)
    with pytest.raises(ValueError, match="TopkLaunch.sample_max must be a power of two >= 64"):
        TopkLaunch(sample_max=3000)
    with pytest.raises(ValueError, match="TopkLaunch.target_factor applies to algorithm='sample'"):
        TopkLaunch(algorithm="radix", target_factor=2.0)
    with pytest.raises(ValueError, match="TopkLaunch.long_window_hi applies to algorithm="):
        TopkLaunch(algorithm="radix", long_window_hi=2.0)
    # the window is unused without threshold_window; the radix path takes any cap_factor
    TopkLaunch(cap_factor=2, target_factor=1.5, threshold_window=False, long_row=None)
    TopkLaunch(algorithm="radix", cap_factor=2)
    with pytest.raises(ValueError, match="cap_factor must be a power of two"):
        plan_topk(torch.tensor([100], dtype=torch.int32), 16, cap_factor=6)
    # a launch may not hold more candidates than the plan's lists
    lengths = torch.tensor([300, 40], dtype=torch.int32, device=device)
    small = plan_topk(lengths, 32, cap_factor=2)
    assert small.cap == 64 and small.cap_factor == 2 and small.row_chunks.tolist()[1] == 0
    assert small.candidates.shape[2] == 64
    with pytest.raises(ValueError, match=r"cap_factor=4 needs a candidate capacity of 128 .* "
                                         r"plan's 64"):
        topk_per_row(torch.randn(2, 300, device=device), lengths, 32, plan=small)
    assert plan_topk(lengths, 32).cap == 128
    x = torch.randn(2, 300, generator=torch.Generator().manual_seed(72))
    pos = topk_per_row(x.to(device), lengths, 32, launch=CAP2)  # no plan: one of the launch's
    assert torch.equal(pos.cpu(), topk_ref(x, lengths.cpu(), 32))


#: k = 32 (capacity 128 by default, 64 with cap_factor 2): (launch, the plan's cap_factor)
SMALL_CAP = {
    "cap2_target1.5": (CAP2, 2),
    # the default plan (cap 128): direct rows of 65..128 and 65..128 candidates fall back
    "cap2_target1.5_default_plan": (CAP2, 4),
    "cap2_exact_threshold": (TopkLaunch(cap_factor=2, target_factor=1.5,
                                        threshold_window=False, long_row=None), 2),
    "cap2_fused_window4/3": (TopkLaunch(cap_factor=2, target_factor=1.5, window_hi=4 / 3,
                                        fuse_threshold=True, long_row=None), 2),
    "cap2_radix": (TopkLaunch(algorithm="radix", cap_factor=2), 2),
}


def _small_cap_rows():
    """k = 32 rows around the capacities (64 / 128) and adversarial long rows (chunk 128)."""
    g = torch.Generator().manual_seed(71)
    lengths = torch.tensor([0, 20, 32, 33, 64, 65, 128, 129, 300, 400, 400, 400, 400, 400, 400,
                            399], dtype=torch.int32)
    B, N = lengths.shape[0], 400
    x = torch.randn(B, N, generator=g) * torch.rand(B, 1, generator=g) * 30  # 8: random
    x[9] = torch.sort(x[9]).values                     # ascending: candidates in the last chunk
    x[10] = torch.sort(x[10], descending=True).values  # descending: all in the first chunk
    x[11] = 1.5                                        # all equal: lower positions win
    x[12] = torch.randint(-3, 4, (N,), generator=g).float()  # heavy ties
    x[13] = torch.randn(N, generator=g).clamp(max=4.0)
    x[13, :100] = 5.0  # 100 ties at the top, one chunk: > 64, <= 128 candidates
    x[14, ::3] = float("-inf")
    x[15, :] = float("-inf")
    x[15, 200:220] = torch.randn(20, generator=g)    # 20 finite < k: the k-th is -inf
    cols = torch.arange(N)
    x = torch.where(cols[None, :] >= lengths[:, None], 1e30, x)  # ignored past the length
    return x, lengths


@pytest.mark.parametrize("name", sorted(SMALL_CAP))
def test_smaller_capacity_exact(name, device):
    """cap_factor 2 (the select's block 64 instead of 128 at k = 32): rows just above each
    capacity, sorted rows (candidates in one chunk), all-equal, heavy ties, 100 ties at the top
    (more candidates than 64, fewer than 128), -inf, with a plan of the launch's capacity
    and with the default plan (128): equal to the stable-sort reference; densely sampled rows
    take the fast path, the overflowing ones the exact fallback."""
    launch, plan_factor = SMALL_CAP[name]
    k = 32
    x, lengths = _small_cap_rows()
    lengths_d = lengths.to(device)
    plan = plan_topk(lengths_d, k, chunk_size=128, cap_factor=plan_factor)
    cap = launch_capacity(launch, k, plan)
    assert cap == 64 and plan.cap == 32 * plan_factor
    assert plan.row_chunks.tolist() == [0 if n <= plan.cap else (n + 127) // 128
                                        for n in lengths.tolist()]
    pos = topk_per_row(x.to(device), lengths_d, k, plan=plan, launch=launch)
    assert torch.equal(pos.cpu(), topk_ref(x, lengths, k))
    assert_valid_topk(pos.cpu(), x, lengths, k)
    if launch.algorithm == "sample":
        total = plan.counts.sum(1).cpu()
        # the fast path: a random row sampled densely (129 / 64), the descending row (all
        # candidates in chunk 0); rows 65 / 128 are direct with the default plan. (The random
        # rows of 300 / 400 land on either side of 64: a 64-value sample is coarse there.)
        for b in (7, 10) + ((5, 6) if plan_factor == 2 else ()):
            assert k <= int(total[b]) <= cap, f"row {b}: {int(total[b])}"
        # 100 tied candidates: more than the launch's 64 (the exact fallback), whether the plan's
        # lists hold them (128) or not (64)
        assert int(total[13]) == 100
        for b in (11, 15):  # all equal / mostly -inf: every element a candidate
            assert int(total[b]) == int(lengths[b])


@pytest.mark.parametrize("radix_bits", [1, 4])
def test_small_select_exact(radix_bits, device):
    """small_select at k = 32 (CAP 128, half block 64) over the rows of ``_small_cap_rows``:
    equal to the stable-sort reference, with rows on both blocks and none pushed to the exact
    fallback by the half block: direct rows of 33 / 64 (half) and 65 / 128 (full), 100 tied
    candidates (full block, not the fallback), the other long rows' counts on either side."""
    launch = TopkLaunch(small_select=True, target_factor=1.5, window_lo=1.0, window_hi=1.125,
                        radix_bits=radix_bits)
    k = 32
    x, lengths = _small_cap_rows()
    lengths_d = lengths.to(device)
    plan = plan_topk(lengths_d, k, chunk_size=128)
    assert launch_capacity(launch, k, plan) == plan.cap == 128
    pos = topk_per_row(x.to(device), lengths_d, k, plan=plan, launch=launch)
    assert torch.equal(pos.cpu(), topk_ref(x, lengths, k))
    assert_valid_topk(pos.cpu(), x, lengths, k)
    total = plan.counts.sum(1).cpu()
    assert int(total[13]) == 100                       # > 64: the full block
    chunked = [b for b in range(len(lengths)) if int(plan.row_chunks[b]) > 0]
    assert any(k <= int(total[b]) <= 64 for b in chunked)  # the half block on a chunked row


def _keys_ref(x):
    """Independent order-preserving key of float32 values (int64 holding the uint32)."""
    x = torch.where(x == 0, torch.zeros_like(x), x)  # -0.0 -> +0.0
    b = x.view(torch.int32).long() & 0xFFFFFFFF
    return torch.where(b >= 2 ** 31, 0xFFFFFFFF - b, b + 2 ** 31)


def _radix_rows(seed):
    """Mixed lengths over several chunks (chunk 128, k 16, cap 64) and adversarial rows."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([0, 5, 16, 64, 65, 300, 777, 1000, 1000, 1000, 1000, 900, 1000, 999],
                           dtype=torch.int32)
    B, N = lengths.shape[0], 1000
    x = torch.randn(B, N, generator=g) * torch.rand(B, 1, generator=g) * 30
    x[7] = torch.randint(-3, 4, (N,), generator=g).float()  # heavy ties (> RADIX_LIST at T)
    x[8] = 1.5  # all equal
    x[9, ::3] = float("-inf")
    x[10] = torch.tensor([-0.0, 0.0, -1.0])[torch.randint(0, 3, (N,), generator=g)]
    x[11] = (x[11] * 4).round() / 4  # moderate ties: T's bin fits the list
    x[12, :] = float("-inf")
    x[12, 500:520] = torch.randn(20, generator=g)
    # garbage past each row's length must be ignored
    cols = torch.arange(N)
    x = torch.where(cols[None, :] >= lengths[:, None], 1e30, x)
    return x, lengths


@pytest.mark.parametrize("seed", [21, 22])
def test_radix_exact(seed, device):
    """The radix path equals the stable-sort reference (ascending positions, ties to lower
    positions) on pass-through, direct and chunked rows, heavy ties, all-equal, +-0, -inf;
    its histogram equals an independent one of the window it stored; random rows take the
    fast path (their k-th key's bin listed), the all-equal row the exact fallback."""
    k = 16
    x, lengths = _radix_rows(seed)
    lengths_d = lengths.to(device)
    plan = plan_topk(lengths_d, k, chunk_size=128)
    pos = topk_per_row(x.to(device), lengths_d, k, plan=plan, launch=RADIX)
    assert torch.equal(pos.cpu(), topk_ref(x, lengths, k))
    assert_valid_topk(pos.cpu(), x, lengths, k)
    win, hist = plan.radix_window.cpu(), plan.radix_hist.cpu()
    listed = plan.radix_list_count.cpu()
    for b in range(x.shape[0]):
        n = int(lengths[b])
        if n <= plan.cap:
            continue
        t_lo, shift = int(win[b, 0]) & 0xFFFFFFFF, int(win[b, 1])
        key = _keys_ref(x[b, :n])
        kept = key[key >= t_lo]
        ref = torch.bincount(((kept - t_lo) >> shift).clamp_max(RADIX_BINS - 1),
                             minlength=RADIX_BINS)
        assert torch.equal(hist[b].long(), ref), f"row {b}: histogram"
    for b in (5, 6, 11, 13):  # random / moderately tied rows: the fast path
        assert 1 <= int(listed[b]) <= RADIX_LIST, f"row {b}"
    assert int(listed[8]) == 0  # all equal: k-th key's bin too full, exact fallback


def test_radix_scratch_is_reset_per_call(device):
    """The same plan over fresh rows twice: the histogram and list restart from zero."""
    k = 16
    lengths = torch.tensor([1000, 700, 129], dtype=torch.int32, device=device)
    plan = plan_topk(lengths, k, chunk_size=128)
    for seed in (31, 32):
        x = _rows(3, 1000, seed, device)
        pos = topk_per_row(x, lengths, k, plan=plan, launch=RADIX)
        assert torch.equal(pos.cpu(), topk_ref(x.cpu(), lengths.cpu(), k))
        assert int(plan.radix_hist[0].sum()) <= 1000


def test_radix_k1_and_k_at_least_length(device):
    lengths = torch.tensor([300, 257, 1], dtype=torch.int32, device=device)
    x = _rows(3, 300, 41, device)
    x[0, 17] = x[0, 200] = x[0].max() + 1  # a tie at the top: the lower position wins
    pos = topk_per_row(x, lengths, 1, plan=plan_topk(lengths, 1, chunk_size=64), launch=RADIX)
    assert torch.equal(pos.cpu(), topk_ref(x.cpu(), lengths.cpu(), 1))
    assert int(pos[0, 0]) == 17
    pos = topk_per_row(x, lengths, 300, launch=RADIX)  # k >= every length: pass-through
    assert torch.equal(pos.cpu(), topk_ref(x.cpu(), lengths.cpu(), 300))


def test_radix_paged_epilogue(device):
    """The PAGED transform fused into the radix output kernel equals the reference transform
    of the reference positions."""
    k, P = 16, 16
    g = torch.Generator().manual_seed(51)
    lengths = torch.tensor([1000, 640, 90], dtype=torch.int32)
    x = torch.randn(3, 1000, generator=g)
    bt = torch.randperm(3 * 63, generator=g).to(torch.int32).view(3, 63)
    lengths_d = lengths.to(device)
    plan = plan_topk(lengths_d, k, chunk_size=256)
    out = torch.empty(3, k, dtype=torch.int32, device=device)
    launch_topk(x.to(device), lengths_d, k, plan, out, method=METHOD_PAGED,
                block_table=bt.to(device), page_size=P, launch=RADIX)
    assert torch.equal(out.cpu(), paged_transform_ref(topk_ref(x, lengths, k), bt, P))


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", [32768, 131072])
def test_gpu_radix_dsv32_size(ctx):
    """k = 2048 at the bench's sizes: random rows, ragged lengths, quantized (tied) scores."""
    k = 2048
    g = torch.Generator().manual_seed(ctx + 1)
    B = 16
    lengths = torch.randint(1, ctx + 1, (B,), generator=g).to(torch.int32)
    lengths[0], lengths[1], lengths[2] = ctx, k, k + 1
    logits = torch.randn(B, ctx, generator=g).cuda()
    lengths = lengths.cuda()
    plan = plan_topk(lengths, k)
    for x in (logits, (logits * 64).round(), (logits * 4).round()):
        pos = topk_per_row(x, lengths, k, plan=plan, launch=RADIX)
        assert torch.equal(pos.cpu(), topk_ref(x.cpu(), lengths.cpu(), k))
    # one graph replay equals the eager call on fresh data in the same buffer
    out = torch.empty(B, k, dtype=torch.int32, device="cuda")
    topk_per_row(logits, lengths, k, plan=plan, out=out, launch=RADIX)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk_per_row(logits, lengths, k, plan=plan, out=out, launch=RADIX)
    logits.copy_(torch.randn(B, ctx, generator=g).cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), topk_ref(logits.cpu(), lengths.cpu(), k))


def test_radix_rows_shorter_than_planned(device):
    """Lengths lowered in place after planning (the chunks still say long): pass-through and
    exact results, -1 padded, as the reference."""
    k = 16
    lengths = torch.tensor([1000, 1000, 700], dtype=torch.int32, device=device)
    plan = plan_topk(lengths, k, chunk_size=128)
    lengths.copy_(torch.tensor([10, 40, 0], dtype=torch.int32))
    x = _rows(3, 1000, 61, device)
    pos = topk_per_row(x, lengths, k, plan=plan, launch=RADIX)
    assert torch.equal(pos.cpu(), topk_ref(x.cpu(), lengths.cpu(), k))


@triton.jit
def _threshold_probe(t_ptr, f_ptr, v_ptr, key_ptr, N: tl.constexpr, M: tl.constexpr):
    """``_threshold_value`` of N uint32 keys and ``_order_key`` of M float32 values."""
    i = tl.arange(0, N)
    tl.store(f_ptr + i, _threshold_value(tl.load(t_ptr + i).to(tl.uint32, bitcast=True)))
    j = tl.arange(0, M)
    tl.store(key_ptr + j, _order_key(tl.load(v_ptr + j)).to(tl.int32, bitcast=True))


def test_threshold_value_matches_order_key(device):
    """``_threshold_value(t)``: ``v >= f`` exactly when ``_order_key(v) >= t`` for every
    non-NaN float32 ``v`` (+-0, +-inf, denormals, +-FLT_MAX, random bit patterns) and
    thresholds over the whole uint32 range: every value's key and its neighbours, the negative
    NaN keys below -inf's (0 .. 0x007FFFFE), the key 0x7FFFFFFF no value has (-0.0 maps to
    +0.0's 0x80000000), the positive NaN keys above +inf's, a 2^20 grid and random keys."""
    rng = np.random.default_rng(7)
    fi = np.finfo(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, fi.max, -fi.max, fi.tiny, -fi.tiny, 1e-45,
                        -1e-45, 3e-39, -3e-39, 1.0, -1.0], dtype=np.float32)
    bits = rng.integers(0, 2 ** 32, 3000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    vals = np.concatenate([special, bits[~np.isnan(bits)],
                           rng.standard_normal(500).astype(np.float32)])
    vals = np.concatenate([vals, np.zeros(4096 - len(vals), np.float32)])
    # the key, independently: -0.0 -> +0.0, negative: all bits flipped, else the sign bit
    b = vals.view(np.uint32).astype(np.int64)
    b = np.where(b == 0x80000000, 0, b)
    keys = np.where(b >= 0x80000000, 0xFFFFFFFF - b, b + 0x80000000)
    ts = {int(k + d) % 2 ** 32 for k in keys for d in (-1, 0, 1)}
    ts |= {0, 1, 0x003FFFFF, 0x007FFFFE, 0x007FFFFF, 0x00800000, 0x7FFFFFFE, 0x7FFFFFFF,
           0x80000000, 0x80000001, 0xFF7FFFFF, 0xFF800000, 0xFF800001, 0xFFC00000, 0xFFFFFFFF}
    ts |= set(range(0, 2 ** 32, 2 ** 20))
    ts |= set(rng.integers(0, 2 ** 32, 2000, dtype=np.uint64).tolist())
    ts = np.array(sorted(ts), dtype=np.int64)
    ts = np.concatenate([ts, np.zeros((1 << (len(ts) - 1).bit_length()) - len(ts), np.int64)])
    t_dev = torch.from_numpy(ts.astype(np.uint32).view(np.int32).copy()).to(device)
    f = torch.empty(len(ts), dtype=torch.float32, device=device)
    key = torch.empty(len(vals), dtype=torch.int32, device=device)
    _threshold_probe[(1,)](t_dev, f, torch.from_numpy(vals).to(device), key, N=len(ts), M=len(vals))
    assert (key.cpu().numpy().view(np.uint32).astype(np.int64) == keys).all()
    f = f.cpu().numpy()
    for s in range(0, len(ts), 1024):
        got = vals[None, :] >= f[s:s + 1024, None]
        want = keys[None, :] >= ts[s:s + 1024, None]
        bad = np.argwhere(got != want)
        assert not len(bad), (f"t={int(ts[s + bad[0][0]]):#010x} f={f[s + bad[0][0]]!r} "
                              f"v={vals[bad[0][1]]!r}")


def _fake_scan(monkeypatch, target_rank):
    """Replace the threshold and scan kernels by a torch scan (the select kernel stays real):
    per chunk, the positions of the values >= the row's ``target_rank``-th largest, in order
    (the interpreter would run tens of thousands of scan programs for minutes)."""
    import backends.kernels.topk as topk_mod

    class _Threshold:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    class _Scan:
        def __getitem__(self, grid):
            def run(logits, stride_l, n_cols, lengths, row_chunks, thr, cand, counts, chunk_size,
                    max_chunks, **kwargs):
                for b in range(logits.shape[0]):
                    n, nc = int(lengths[b]), int(row_chunks[b])
                    if nc == 0:
                        continue
                    row = logits[b, :n]
                    tf = row.sort(descending=True).values[target_rank - 1]
                    p = (row >= tf).nonzero().flatten()
                    c = p // chunk_size
                    counts[b, :nc] = torch.bincount(c, minlength=nc)[:nc].to(counts.dtype)
                    first = torch.searchsorted(c, c)   # c is sorted: its chunk's first entry
                    cand[b, c, torch.arange(p.numel()) - first] = p.to(cand.dtype)
            return run

    monkeypatch.setattr(topk_mod, "_topk_threshold_kernel", _Threshold())
    monkeypatch.setattr(topk_mod, "_topk_scan_kernel", _Scan())


@pytest.mark.parametrize("n_chunks", [MAX_CHUNKS, 40000])
def test_select_chunk_search_many_chunks(n_chunks, monkeypatch):
    """The select's binary search over the chunk ends at the most chunks a plan allows
    (``MAX_CHUNKS`` = 65535: CHUNKS = 2^16, all 16 halvings) and at 40000: 24 candidates
    scattered over a row of 16-element chunks (the scan is a torch stand-in; the select kernel
    is the real one); the stable-sort reference's result. One chunk more is refused."""
    _fake_scan(monkeypatch, target_rank=24)
    k, cs = 16, 16
    L = n_chunks * cs
    x = torch.randn(1, L, generator=torch.Generator().manual_seed(5))
    lengths = torch.tensor([L], dtype=torch.int32)
    plan = plan_topk(lengths, k, chunk_size=cs)
    assert plan.max_chunks == n_chunks and int(plan.counts.sum()) == 0
    pos = topk_per_row(x, lengths, k, plan=plan,
                       launch=TopkLaunch(scan_block_max=16, scan_stages=1))
    assert int(plan.counts.sum()) == 24 and int((plan.counts > 0).sum()) > 16
    assert torch.equal(pos, topk_ref(x, lengths, k))
    with pytest.raises(ValueError, match=r"chunk_size=16 splits a row of \d+ elements into "
                                         r"\d+ chunks, more than the scan's grid takes \(65535\)"
                                         r": use chunk_size >= 32"):
        plan_topk(torch.tensor([MAX_CHUNKS * cs + 1], dtype=torch.int32), k, chunk_size=cs)


@pytest.mark.parametrize("radix_bits", [1, 2, 4])
def test_select_fast_path_and_chunk_search_edges(radix_bits, monkeypatch):
    """The select on candidate lists that hold exactly the values >= each row's 16th largest
    (a torch stand-in scan, so the counts are known; the select kernel is the real one), k = 16,
    16-element chunks: ``count(key >= T) == k`` with distinct keys (bisection updates), with
    all-equal candidates (``T`` never leaves the common prefix: n_ge = -1, total == k), with
    the k-th key equal to that prefix (2.0 under 2.x values: no probe succeeds), ties at ``T``
    beyond k (20 equal candidates; 10 above and 12 at ``T`` across chunks), candidates only in
    the first / last chunks (empty chunks at either end), a row of 7 chunks among 13 (CHUNKS 16),
    and a direct all-equal row of 40 (n_ge = -1, total > k: the tie path)."""
    _fake_scan(monkeypatch, target_rank=16)
    k, N = 16, 200
    g = torch.Generator().manual_seed(11)
    x = torch.randn(9, N, generator=g) - 10.0
    perm = lambda n: torch.randperm(N, generator=g)[:n]
    x[0] = torch.randn(N, generator=g)
    x[1, perm(16)] = 5.0
    x[2, perm(20)] = 5.0
    p = perm(16)
    x[3, p] = 2.0 + torch.rand(16, generator=g) * 0.9 + 0.05
    x[3, p[7]] = 2.0
    x[4] = torch.arange(N).float()
    x[5] = -torch.arange(N).float()
    p = perm(22)
    x[7, p[:10]] = 9.0
    x[7, p[10:]] = 4.0
    x[8] = 1.25
    lengths = torch.tensor([N, N, N, N, N, N, 100, N, 40], dtype=torch.int32)
    plan = plan_topk(lengths, k, chunk_size=16)
    assert plan.max_chunks == 13 and int(plan.row_chunks[6]) == 7 and int(plan.row_chunks[8]) == 0
    launch = TopkLaunch(scan_block_max=16, scan_stages=1, radix_bits=radix_bits)
    buf = torch.full((x.shape[0] + 4, k), -7, dtype=torch.int32)  # rows past the output: untouched
    pos = topk_per_row(x, lengths, k, plan=plan, launch=launch, out=buf[:x.shape[0]])
    assert bool((buf[x.shape[0]:] == -7).all())  # nothing written past a row's k slots
    total = plan.counts.sum(1)
    assert total[:6].tolist() == [16, 16, 20, 16, 16, 16] and int(total[7]) == 22
    assert int(plan.counts[4, :11].sum()) == 0 and int(plan.counts[5, 1:].sum()) == 0
    assert torch.equal(pos, topk_ref(x, lengths, k))
