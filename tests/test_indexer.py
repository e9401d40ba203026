"""Lightning-indexer kernels (paged decode, ragged extend) against the plain-torch reference."""
import pytest
import torch

from backends.kernels.indexer import (IndexerLaunch, indexer_logits_paged, indexer_logits_ragged,
                                      quantize_index_query, validate_indexer_paged_inputs)
from backends.kernels.index_cache import IndexKeyCache, quantize_index_keys
from harness.indexer_ref import indexer_logits_paged_ref, indexer_logits_ragged_ref, query_ref


def assert_logits_close(got, ref):
    assert got.dtype == torch.float32 and got.shape == ref.shape
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(got)), "-inf pattern differs"
    assert bool((got[~fin] == float("-inf")).all())
    if fin.any():
        scale = ref[fin].abs().max().item()
        err = (got[fin] - ref[fin]).abs().max().item()
        assert err <= 2e-6 * scale + 1e-30, f"max error {err} vs max |ref| {scale}"


def make_paged(fmt, B, H, D, P, lens, device, seed, key_scale=1.0, extra_pages=5):
    g = torch.Generator().manual_seed(seed)
    pages_per = max(1, -(-max(lens) // P))
    num_pages = B * pages_per + extra_pages
    cache = IndexKeyCache.allocate(num_pages, P, D, fmt, device)
    # scrambled pages; entries past a row's length point anywhere (must not be read)
    bt = torch.randperm(num_pages, generator=g)[:B * pages_per].view(B, pages_per).to(torch.int32)
    # fill every slot (also unused ones) with keys so stray reads would show
    keys = torch.randn(num_pages * P, D, generator=g) * key_scale
    keys *= torch.rand(num_pages * P, 1, generator=g) * 4 + 0.05
    cache.write_slots(torch.arange(num_pages * P), keys)
    q = (torch.randn(B, H, D, generator=g)).to(torch.bfloat16)
    w = torch.randn(B, H, generator=g)
    seq = torch.tensor(lens, dtype=torch.int32)
    return (cache.data.to(device), bt.to(device), q.to(device), w.to(device), seq.to(device))


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
@pytest.mark.parametrize("P", [1, 16, 64])
def test_paged_matches_reference(fmt, P, device):
    lens = [37, 0, 150, 64, 1]
    k_cache, bt, q, w, seq = make_paged(fmt, 5, 16, 32, P, lens, device, seed=P)
    out = indexer_logits_paged(q, w, k_cache, bt, seq)
    assert out.shape == (5, 150)
    ref = indexer_logits_paged_ref(q.cpu(), w.cpu(), k_cache.cpu(), bt.cpu(), seq.cpu())
    assert_logits_close(out.cpu(), ref)


def test_paged_dsv32_heads_and_wider_output(device):
    """64 heads x 128 dims (DeepSeek-V3.2), fp8, page 64, output wider than the longest row."""
    lens = [200, 77]
    k_cache, bt, q, w, seq = make_paged("fp8", 2, 64, 128, 64, lens, device, seed=7)
    out = indexer_logits_paged(q, w, k_cache, bt, seq, max_len=260, check=True)
    ref = indexer_logits_paged_ref(q.cpu(), w.cpu(), k_cache.cpu(), bt.cpu(), seq.cpu(),
                                   max_len=260)
    assert_logits_close(out.cpu(), ref)


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
@pytest.mark.parametrize("q_scale", [1e-9, 3e5])
def test_paged_extreme_query_magnitudes(fmt, q_scale, device):
    """Queries far outside float16 range must still be exact (per-head power-of-two scaling)."""
    k_cache, bt, q, w, seq = make_paged(fmt, 2, 16, 32, 16, [40, 90], device, seed=11,
                                        key_scale=1e3 if fmt == "bf16" else 1.0)
    q = (q.float() * q_scale).to(torch.bfloat16)
    out = indexer_logits_paged(q, w, k_cache, bt, seq)
    ref = indexer_logits_paged_ref(q.cpu(), w.cpu(), k_cache.cpu(), bt.cpu(), seq.cpu())
    assert torch.isfinite(out[0, :40]).all()
    assert_logits_close(out.cpu(), ref)


def _ragged_problem(fmt, device, seed):
    """Two requests in one concatenated buffer plus a third that shares request 0's prefix:
    its rows point into request 0's key rows (same ks), causal ke per extend token."""
    g = torch.Generator().manual_seed(seed)
    H, D = 16, 32
    N = 180
    keys = torch.randn(N, D, generator=g) * (torch.rand(N, 1, generator=g) * 3 + 0.1)
    ks, ke = [], []
    for t in range(6):  # request 0: keys [0, 100), extend tokens at positions 94..99
        ks.append(0)
        ke.append(95 + t)
    for t in range(5):  # request 1: keys [100, 180), extend of 5 tokens
        ks.append(100)
        ke.append(176 + t)
    for t in range(3):  # request 2: shares request 0's first 60 keys (prefix), then nothing else
        ks.append(0)
        ke.append(58 + t)
    ks.append(30)  # an empty range
    ke.append(30)
    M = len(ks)
    q = torch.randn(M, H, D, generator=g).to(torch.bfloat16)
    w = torch.randn(M, H, generator=g)
    ks = torch.tensor(ks, dtype=torch.int32)
    ke = torch.tensor(ke, dtype=torch.int32)
    if fmt == "fp8":
        vals, scales = quantize_index_keys(keys)
        kk, sc = vals, scales
    else:
        kk, sc = keys.to(torch.bfloat16), None
    to = (lambda x: None if x is None else x.to(device))
    return to(q), to(w), to(kk), to(ks), to(ke), to(sc)


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_ragged_matches_reference(fmt, device):
    q, w, k, ks, ke, sc = _ragged_problem(fmt, device, seed=3)
    out = indexer_logits_ragged(q, w, k, ks, ke, k_scales=sc, check=True)
    assert out.shape == (q.shape[0], 100)  # max(ke - ks)
    ref = indexer_logits_ragged_ref(q.cpu(), w.cpu(), k.cpu(), ks.cpu(), ke.cpu(),
                                    None if sc is None else sc.cpu())
    assert_logits_close(out.cpu(), ref)
    assert bool((out[-1] == float("-inf")).all())  # empty range


def test_ragged_float8_dtype_input(device):
    q, w, k, ks, ke, sc = _ragged_problem("fp8", device, seed=4)
    a = indexer_logits_ragged(q, w, k, ks, ke, k_scales=sc, max_len=120)
    b = indexer_logits_ragged(q, w, k.view(torch.float8_e4m3fn), ks, ke, k_scales=sc, max_len=120)
    assert a.shape == (q.shape[0], 120)
    assert torch.equal(a, b)


def test_paged_validation_errors(device):
    k_cache, bt, q, w, seq = make_paged("fp8", 2, 16, 32, 16, [20, 30], device, seed=5)
    with pytest.raises(ValueError, match="q must be a bfloat16"):
        indexer_logits_paged(q.float(), w, k_cache, bt, seq)
    with pytest.raises(ValueError, match="powers of two"):
        indexer_logits_paged(q[:, :12], w[:, :12].contiguous(), k_cache, bt, seq)
    with pytest.raises(ValueError, match="weights must be a float32"):
        indexer_logits_paged(q, w.double(), k_cache, bt, seq)
    with pytest.raises(ValueError, match="k_cache"):
        indexer_logits_paged(q, w, k_cache[:, :-4], bt, seq)
    with pytest.raises(ValueError, match="block_table"):
        indexer_logits_paged(q, w, k_cache, bt[:1], seq)
    with pytest.raises(ValueError, match="seq_lens"):
        indexer_logits_paged(q, w, k_cache, bt, seq.long())
    with pytest.raises(ValueError, match="weights contains non-finite"):
        bad = w.clone()
        bad[1, 3] = float("inf")
        indexer_logits_paged(q, bad, k_cache, bt, seq, check=True)
    with pytest.raises(ValueError, match="scales"):
        bad = k_cache.clone()
        page = int(bt[0, 0])
        bad[page, 16 * 32: 16 * 32 + 4] = torch.tensor([0, 0, 0xC0, 0x7F], dtype=torch.uint8)
        validate_indexer_paged_inputs(q, w, bad, bt, seq)  # NaN scale
    with pytest.raises(ValueError, match="seq_lens must be >= 0"):
        validate_indexer_paged_inputs(q, w, k_cache, bt, torch.tensor([-1, 3], dtype=torch.int32,
                                                                      device=device))
    with pytest.raises(ValueError, match="fewer pages"):
        validate_indexer_paged_inputs(q, w, k_cache, bt, torch.tensor([20, 33], dtype=torch.int32,
                                                                      device=device))
    with pytest.raises(ValueError, match="max_len"):
        indexer_logits_paged(q, w, k_cache, bt, seq, max_len=10, check=True)
    bf = make_paged("bf16", 2, 16, 32, 16, [20, 30], device, seed=6)
    bad = bf[0].clone()
    bad[int(bf[1][1, 1]), 3, 5] = float("nan")
    with pytest.raises(ValueError, match="k_cache contains non-finite"):
        indexer_logits_paged(bf[2], bf[3], bad, bf[1], bf[4], check=True)


def test_ragged_validation_errors(device):
    q, w, k, ks, ke, sc = _ragged_problem("fp8", device, seed=8)
    with pytest.raises(ValueError, match="k_scales"):
        indexer_logits_ragged(q, w, k, ks, ke)
    with pytest.raises(ValueError, match="ks must be an int32"):
        indexer_logits_ragged(q, w, k, ks[:-1], ke, k_scales=sc)
    with pytest.raises(ValueError, match="ks <= ke"):
        indexer_logits_ragged(q, w, k, ke, ks, k_scales=sc, check=True)
    bad = sc.clone()
    bad[5] = float("nan")
    with pytest.raises(ValueError, match="k_scales must be finite"):
        indexer_logits_ragged(q, w, k, ks, ke, k_scales=bad, check=True)
    with pytest.raises(ValueError, match="k must be bfloat16"):
        indexer_logits_ragged(q, w, k.float(), ks, ke)


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", [2048, 32768])
def test_gpu_dsv32_paged(ctx):
    lens = [ctx, ctx // 3 + 5, 1, 0]
    k_cache, bt, q, w, seq = make_paged("fp8", 4, 64, 128, 64, lens, "cuda", seed=ctx)
    out = indexer_logits_paged(q, w, k_cache, bt, seq)
    ref = indexer_logits_paged_ref(q, w, k_cache, bt, seq)
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(out))
    err = (out[fin] - ref[fin]).abs().max().item()
    assert err <= 1e-5 * ref[fin].abs().max().item()


@pytest.mark.gpu
def test_gpu_dsv32_ragged():
    g = torch.Generator().manual_seed(0)
    N, M = 8192, 64
    keys = torch.randn(N, 128, generator=g)
    vals, sc = quantize_index_keys(keys)
    ks = torch.zeros(M, dtype=torch.int32)
    ke = torch.arange(N - M + 1, N + 1, dtype=torch.int32)
    q = torch.randn(M, 64, 128, generator=g).to(torch.bfloat16)
    w = torch.randn(M, 64, generator=g)
    args = [x.cuda() for x in (q, w, vals, ks, ke)]
    out = indexer_logits_ragged(*args, k_scales=sc.cuda())
    ref = indexer_logits_ragged_ref(*args, k_scales=sc.cuda())
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(out))
    assert (out[fin] - ref[fin]).abs().max().item() <= 1e-5 * ref[fin].abs().max().item()


#: launch variants the indexer bench times: each must give the reference's logits
LAUNCH_VARIANTS = {
    "default_tok256": IndexerLaunch(tokens_per_program=256),
    "prefetch_tok256": IndexerLaunch(prefetch=True, tokens_per_program=256),
    "prefetch_n32_tok128": IndexerLaunch(block_n=32, prefetch=True, tokens_per_program=128),
    "prefetch_n128_w8": IndexerLaunch(block_n=128, num_warps=8, tile_in_page=False,
                                      prefetch=True, tokens_per_program=256),
    "prefetch_scattered": IndexerLaunch(prefetch=True, tile_in_page=False,
                                        tokens_per_program=512),
    "prefetch_pps1": IndexerLaunch(programs_per_sm=1, prefetch=True),
    "stages3_tok256": IndexerLaunch(num_stages=3, tokens_per_program=256),
    # two whole pages per tile: one block-table read per page
    "n128_w8_pages2": IndexerLaunch(block_n=128, num_warps=8, tokens_per_program=256),
    # keys by bulk tensor copies: a box inside one page (64 and 32 of 64 tokens), two pages
    "tma_tok256": IndexerLaunch(tma=True, tokens_per_program=256),
    "tma_prefetch_n32_tok128": IndexerLaunch(tma=True, prefetch=True, block_n=32,
                                             tokens_per_program=128),
    "tma_prefetch_n128_w8": IndexerLaunch(tma=True, prefetch=True, block_n=128, num_warps=8,
                                          tokens_per_program=256),
}


@pytest.mark.parametrize("name", sorted(LAUNCH_VARIANTS))
@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_paged_launch_variants_match_reference(name, fmt, device):
    """Several tiles per program (prefetch across tiles and pages: the 300-token row spans 5
    pages), rows ending mid-tile and mid-page, an empty row, scrambled pages, programs wholly
    past a row's length: every variant equals the reference."""
    launch = LAUNCH_VARIANTS[name]
    lens = [300, 0, 129, 64, 1]
    k_cache, bt, q, w, seq = make_paged(fmt, 5, 16, 32, 64, lens, device, seed=21)
    out = indexer_logits_paged(q, w, k_cache, bt, seq, max_len=320, launch=launch)
    ref = indexer_logits_paged_ref(q.cpu(), w.cpu(), k_cache.cpu(), bt.cpu(), seq.cpu(),
                                   max_len=320)
    assert_logits_close(out.cpu(), ref)


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_paged_tma_four_pages_per_tile(fmt, device):
    """TMA over 16-token pages with 64-token tiles: four page boxes stacked per tile, rows
    ending mid-page, an empty row, a program wholly past its row."""
    lens = [150, 0, 37, 64]
    k_cache, bt, q, w, seq = make_paged(fmt, 4, 16, 32, 16, lens, device, seed=23)
    launch = IndexerLaunch(tma=True, tokens_per_program=128)
    assert launch.pages_per_tile(16) == 4
    out = indexer_logits_paged(q, w, k_cache, bt, seq, max_len=200, launch=launch)
    ref = indexer_logits_paged_ref(q.cpu(), w.cpu(), k_cache.cpu(), bt.cpu(), seq.cpu(),
                                   max_len=200)
    assert_logits_close(out.cpu(), ref)


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
@pytest.mark.parametrize("tma", [False, True])
def test_ragged_prefetch_matches_reference(fmt, tma, device):
    q, w, k, ks, ke, sc = _ragged_problem(fmt, device, seed=13)
    launch = IndexerLaunch(block_n=16, tokens_per_program=64, prefetch=True, tma=tma)
    out = indexer_logits_ragged(q, w, k, ks, ke, k_scales=sc, launch=launch)
    ref = indexer_logits_ragged_ref(q.cpu(), w.cpu(), k.cpu(), ks.cpu(), ke.cpu(),
                                    None if sc is None else sc.cpu())
    assert_logits_close(out.cpu(), ref)


def test_launch_validation_errors():
    with pytest.raises(ValueError, match="IndexerLaunch.block_n"):
        IndexerLaunch(block_n=48)
    with pytest.raises(ValueError, match="IndexerLaunch.max_tokens_per_program"):
        IndexerLaunch(max_tokens_per_program=8)
    with pytest.raises(ValueError, match="IndexerLaunch.num_warps"):
        IndexerLaunch(num_warps=3)
    with pytest.raises(ValueError, match="IndexerLaunch.tokens_per_program"):
        IndexerLaunch(tokens_per_program=100)
    with pytest.raises(ValueError, match="IndexerLaunch.programs_per_sm"):
        IndexerLaunch(programs_per_sm=0)
    with pytest.raises(ValueError, match="IndexerLaunch.prefetch must be True, False or None"):
        IndexerLaunch(prefetch=1)
    assert IndexerLaunch().prefetch_for(True) and not IndexerLaunch().prefetch_for(False)
    assert not IndexerLaunch(prefetch=False).prefetch_for(True)
    with pytest.raises(ValueError, match="IndexerLaunch.tma must be True, False or None"):
        IndexerLaunch(tma=1)


def test_tma_unsupported_layouts_rejected(device):
    """TMA needs whole-tile page addressing and 16-byte aligned key rows."""
    k_cache, bt, q, w, seq = make_paged("fp8", 2, 16, 32, 1, [20, 30], device, seed=9)
    with pytest.raises(ValueError, match="IndexerLaunch.tma needs tile_in_page=True"):
        indexer_logits_paged(q, w, k_cache, bt, seq, launch=IndexerLaunch(tma=True))
    k_cache, bt, q, w, seq = make_paged("fp8", 2, 16, 32, 64, [20, 30], device, seed=9)
    with pytest.raises(ValueError, match="IndexerLaunch.tma needs tile_in_page=True"):
        indexer_logits_paged(q, w, k_cache, bt, seq,
                             launch=IndexerLaunch(tma=True, tile_in_page=False))
    q, w, k, ks, ke, sc = _ragged_problem("bf16", device, seed=10)
    padded = torch.zeros(k.shape[0], 36, dtype=k.dtype, device=device)
    padded[:, :32] = k  # rows of 72 bytes
    with pytest.raises(ValueError, match="IndexerLaunch.tma needs a 16-byte aligned"):
        indexer_logits_ragged(q, w, padded[:, :32], ks, ke, launch=IndexerLaunch(tma=True))


def test_tma_by_default_only_where_it_works():
    """``tma=None`` (the default): TMA on CUDA of capability >= 9 where the addressing and the
    alignment allow it, never on the CPU; an explicit True / False is kept as given."""
    cpu = torch.device("cpu")
    assert IndexerLaunch().tma is None
    assert IndexerLaunch().use_tma(cpu, supported=True) is False
    assert IndexerLaunch(tma=True).use_tma(cpu, supported=False) is True
    assert IndexerLaunch(tma=False).use_tma(cpu, supported=True) is False


@pytest.mark.gpu
def test_tma_by_default_on_cuda_of_capability_9():
    dev = torch.device("cuda")
    want = torch.cuda.get_device_capability(dev)[0] >= 9
    assert IndexerLaunch().use_tma(dev, supported=True) is want
    assert IndexerLaunch().use_tma(dev, supported=False) is False


# ----------------------------------------------------------------------------------------------
# fp8 query (query_dtype="fp8")
# ----------------------------------------------------------------------------------------------


def _spread_query(q, seed):
    """``q`` with one head at zero, one at 1e-9 and one at 3e5 times its values, and a tenth of
    the elements shrunk 1000x (they land on e4m3 subnormals or zero after scaling)."""
    g = torch.Generator().manual_seed(seed)
    x = q.float().cpu()
    x[:, 0] = 0
    x[:, 1] *= 1e-9
    x[:, 2] *= 3e5
    x = torch.where(torch.rand(x.shape, generator=g) < 0.1, x * 1e-3, x)
    return x.to(torch.bfloat16).to(q.device)


def test_quantize_index_query_rule(device):
    """UE8M0 scales: a power of two s = 2^ceil(log2(amax / 448)) per (row, head), so amax / s
    lies in (224, 448]; the values round to nearest even; an all-zero head gets s = 2^-42 (from
    amax 1e-10) and zeros."""
    q = _spread_query(torch.randn(3, 16, 32, generator=torch.Generator().manual_seed(1)), 2)
    q = q.to(device)
    q8, s = quantize_index_query(q)
    assert q8.dtype == torch.float8_e4m3fn and q8.shape == q.shape
    assert s.dtype == torch.float32 and s.shape == q.shape[:2]
    mant, _ = torch.frexp(s)
    assert bool((mant == 0.5).all())
    amax = q.float().abs().amax(-1)
    nz = amax > 0
    assert bool((amax[nz] / s[nz] <= 448).all()) and bool((amax[nz] / s[nz] > 224).all())
    assert bool((s[~nz] == 2.0 ** -42).all()) and bool((q8.float()[~nz] == 0).all())
    expect = (q.float() / s[..., None]).to(torch.float8_e4m3fn)  # RNE, in range
    assert torch.equal(q8.view(torch.uint8), expect.view(torch.uint8))
    assert bool((q8.float().abs() < 2.0 ** -6).any())  # subnormals exercised
    deq = query_ref(q, "fp8")
    assert torch.equal(deq, q8.float() * s[..., None])
    # at most half an e4m3 step: below 256 s (steps <= 16 s) that is 8 s < amax / 28; at or
    # above (steps 32 s) 16 s <= amax / 16
    rel = (deq - q.float()).abs() / amax[..., None].clamp_min(1e-30)
    assert rel.max() <= 2.0 ** -4


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
@pytest.mark.parametrize("P", [1, 16, 64])
def test_paged_fp8_query_matches_reference(fmt, P, device):
    """The fp8 query equals the fp8-query reference tightly (the in-kernel quantization is the
    torch rule's, bit for bit); it is close to, not asserted equal to, the bf16 query's logits."""
    lens = [37, 0, 150, 64, 1]
    k_cache, bt, q, w, seq = make_paged(fmt, 5, 16, 32, P, lens, device, seed=40 + P)
    q = _spread_query(q, P)
    out = indexer_logits_paged(q, w, k_cache, bt, seq, query_dtype="fp8")
    args = (q.cpu(), w.cpu(), k_cache.cpu(), bt.cpu(), seq.cpu())
    ref = indexer_logits_paged_ref(*args, query_dtype="fp8")
    assert_logits_close(out.cpu(), ref)
    bf16 = indexer_logits_paged_ref(*args)
    fin = torch.isfinite(ref)
    assert (ref[fin] - bf16[fin]).abs().max() <= 0.1 * bf16[fin].abs().max()


FP8_QUERY_LAUNCHES = {name: LAUNCH_VARIANTS[name] for name in (
    "default_tok256", "prefetch_n32_tok128", "prefetch_scattered", "n128_w8_pages2",
    "tma_tok256", "tma_prefetch_n128_w8")}


@pytest.mark.parametrize("name", sorted(FP8_QUERY_LAUNCHES))
@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_paged_fp8_query_launch_variants(name, fmt, device):
    """Pointer and TMA loads, one / two pages or per-token page reads per tile, prefetch, rows
    ending mid-tile, an empty row: the fp8 query equals its reference under each."""
    lens = [300, 0, 129, 64, 1]
    k_cache, bt, q, w, seq = make_paged(fmt, 5, 16, 32, 64, lens, device, seed=51)
    out = indexer_logits_paged(q, w, k_cache, bt, seq, max_len=320, query_dtype="fp8",
                               launch=FP8_QUERY_LAUNCHES[name])
    ref = indexer_logits_paged_ref(q.cpu(), w.cpu(), k_cache.cpu(), bt.cpu(), seq.cpu(),
                                   max_len=320, query_dtype="fp8")
    assert_logits_close(out.cpu(), ref)


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_paged_fp8_query_tma_four_pages_per_tile(fmt, device):
    lens = [150, 0, 37, 64]
    k_cache, bt, q, w, seq = make_paged(fmt, 4, 16, 32, 16, lens, device, seed=53)
    out = indexer_logits_paged(q, w, k_cache, bt, seq, max_len=200, query_dtype="fp8",
                               launch=IndexerLaunch(tma=True, tokens_per_program=128))
    ref = indexer_logits_paged_ref(q.cpu(), w.cpu(), k_cache.cpu(), bt.cpu(), seq.cpu(),
                                   max_len=200, query_dtype="fp8")
    assert_logits_close(out.cpu(), ref)


def test_paged_fp8_query_dsv32_heads(device):
    """64 heads x 128 dims, fp8 keys, page 64 (the bench's shape)."""
    k_cache, bt, q, w, seq = make_paged("fp8", 2, 64, 128, 64, [200, 77], device, seed=57)
    out = indexer_logits_paged(q, w, k_cache, bt, seq, max_len=260, query_dtype="fp8")
    ref = indexer_logits_paged_ref(q.cpu(), w.cpu(), k_cache.cpu(), bt.cpu(), seq.cpu(),
                                   max_len=260, query_dtype="fp8")
    assert_logits_close(out.cpu(), ref)


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
@pytest.mark.parametrize("tma", [False, True])
def test_ragged_fp8_query_matches_reference(fmt, tma, device):
    q, w, k, ks, ke, sc = _ragged_problem(fmt, device, seed=59)
    q = _spread_query(q, 3)
    launch = IndexerLaunch(block_n=16, tokens_per_program=64, prefetch=True, tma=tma)
    out = indexer_logits_ragged(q, w, k, ks, ke, k_scales=sc, query_dtype="fp8", launch=launch)
    ref = indexer_logits_ragged_ref(q.cpu(), w.cpu(), k.cpu(), ks.cpu(), ke.cpu(),
                                    None if sc is None else sc.cpu(), query_dtype="fp8")
    assert_logits_close(out.cpu(), ref)


def test_query_dtype_validation(device):
    k_cache, bt, q, w, seq = make_paged("fp8", 2, 16, 32, 16, [20, 30], device, seed=61)
    for bad in ("fp16", "FP8", None, torch.float8_e4m3fn):
        with pytest.raises(ValueError, match="query_dtype must be one of 'bf16', 'fp8'"):
            indexer_logits_paged(q, w, k_cache, bt, seq, query_dtype=bad)
    qr, wr, k, ks, ke, sc = _ragged_problem("fp8", device, seed=62)
    with pytest.raises(ValueError, match="query_dtype must be one of 'bf16', 'fp8', got 'e4m3'"):
        indexer_logits_ragged(qr, wr, k, ks, ke, k_scales=sc, query_dtype="e4m3")
    with pytest.raises(ValueError, match="query_dtype must be one of 'bf16', 'fp8'"):
        indexer_logits_paged_ref(q, w, k_cache, bt, seq, query_dtype="int8")


def _fp8_cache_of(vals: torch.Tensor, P: int) -> torch.Tensor:
    """fp8 index-key pages ``uint8 [T / P, P * (D + 4)]`` holding the float8 values ``vals``
    ``[T, D]`` (exactly representable) with every scale 1.0."""
    T, D = vals.shape
    v = vals.to(torch.float8_e4m3fn).view(torch.uint8).view(T // P, P * D)
    s = torch.ones(T // P, P, dtype=torch.float32).view(torch.uint8).view(T // P, P * 4)
    return torch.cat([v, s], dim=1).contiguous()


def test_fp8_query_identity_keys_exact(device):
    """Keys +-e_j (token 2j: +e_j, 2j+1: -e_j; scale 1) and one-hot head weights (row b keeps
    head b) make every logit one quantized query element times its scale, with no rounding
    anywhere (also not in the GPU's fp8 accumulation): the kernel's quantization (the GPU's
    cast, or the interpreter's rounding) equals ``quantize_index_query`` element for element."""
    H, D, P = 64, 128, 64
    eye = torch.eye(D)
    k_cache = _fp8_cache_of(torch.stack([eye, -eye], dim=1).reshape(2 * D, D), P).to(device)
    q = _spread_query(torch.randn(H, H, D, generator=torch.Generator().manual_seed(71)), 72)
    q, w = q.to(device), torch.eye(H, device=device)
    bt = torch.arange(2 * D // P, dtype=torch.int32, device=device).repeat(H, 1)
    seq = torch.full((H,), 2 * D, dtype=torch.int32, device=device)
    out = indexer_logits_paged(q, w, k_cache, bt, seq, query_dtype="fp8")
    q8, s = quantize_index_query(q)
    expect = (q8.float() * s[..., None])[torch.arange(H), torch.arange(H)]  # [B, D]: row b, head b
    expect = torch.stack([expect, -expect], dim=2).reshape(H, 2 * D).clamp_min(0)
    assert torch.equal(out, expect)


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", [2048, 32768])
def test_gpu_dsv32_paged_fp8_query(ctx):
    """Random data on the GPU: Hopper's fp8 MMA accumulates with ~14 bits (DeepSeek-V3 report),
    hence the bench's FP8_QUERY_TOL instead of 1e-5."""
    from harness.bench.indexer import FP8_QUERY_TOL
    lens = [ctx, ctx // 3 + 5, 1, 0]
    k_cache, bt, q, w, seq = make_paged("fp8", 4, 64, 128, 64, lens, "cuda", seed=ctx + 1)
    out = indexer_logits_paged(q, w, k_cache, bt, seq, query_dtype="fp8")
    ref = indexer_logits_paged_ref(q, w, k_cache, bt, seq, query_dtype="fp8")
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(out))
    assert (out[fin] - ref[fin]).abs().max().item() <= FP8_QUERY_TOL * ref[fin].abs().max().item()
