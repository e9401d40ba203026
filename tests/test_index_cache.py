"""Index-key cache: byte layout, quantization, writes through block tables, dequantization."""
import pytest
import torch

from backends.kernels.index_cache import (FP8_MAX, SCALE_FLOOR, IndexKeyCache, IndexKeyFormat,
                                 dequantize_fp8_keys, quantize_index_keys, slots_for_positions)


def _keys(T, D, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, D, generator=g) * torch.rand(T, 1, generator=g).mul(5).add(0.1)


def test_quantize_scale_and_error():
    k = _keys(50, 128, 0)
    k[3] = 0.0  # amax floor
    vals, scales = quantize_index_keys(k)
    assert vals.dtype == torch.uint8 and vals.shape == (50, 128) and scales.dtype == torch.float32
    amax = k.abs().amax(dim=1)
    torch.testing.assert_close(scales, amax.clamp_min(SCALE_FLOOR) / FP8_MAX)
    deq = dequantize_fp8_keys(vals, scales)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 of each value, plus subnormal spacing
    bound = k.abs() * 2.0 ** -4 + scales[:, None] * 2.0 ** -9 + 1e-12
    assert bool(((deq - k).abs() <= bound).all())
    assert bool((deq[3] == 0).all())
    # the largest element of each row maps to +-448 exactly
    row_max = vals.view(torch.float8_e4m3fn).float().abs().amax(dim=1)
    assert bool((row_max[amax > SCALE_FLOOR] == FP8_MAX).all())


@pytest.mark.parametrize("page_size", [1, 4, 16, 64])
def test_fp8_page_layout_bytes(page_size):
    """Values of all tokens of a page first, then the page's float32 scales."""
    D, num_pages = 32, 6
    cache = IndexKeyCache.allocate(num_pages, page_size, D, "fp8")
    assert cache.data.shape == (num_pages, page_size * (D + 4)) and cache.data.dtype == torch.uint8
    T = num_pages * page_size
    k = _keys(T, D, 1)
    slots = torch.randperm(T, generator=torch.Generator().manual_seed(2))
    cache.write_slots(slots, k)
    vals, scales = quantize_index_keys(k)
    raw = cache.data
    for i in range(T):
        page, off = int(slots[i]) // page_size, int(slots[i]) % page_size
        assert torch.equal(raw[page, off * D:(off + 1) * D], vals[i])
        sb = raw[page, page_size * D + 4 * off: page_size * D + 4 * off + 4].contiguous()
        assert sb.view(torch.float32).item() == scales[i].item()


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_write_positions_and_gather(fmt):
    P, D, B = 8, 16, 3
    lens = torch.tensor([13, 0, 30], dtype=torch.int32)
    num_pages = 12
    cache = IndexKeyCache.allocate(num_pages, P, D, fmt)
    bt = torch.randperm(num_pages, generator=torch.Generator().manual_seed(3))[:B * 4] \
        .view(B, 4).to(torch.int32)
    keys = {}
    for b in range(B):
        n = int(lens[b])
        pos = torch.randperm(n, generator=torch.Generator().manual_seed(10 + b))  # any order
        k = _keys(n, D, 20 + b)
        cache.write_positions(bt, torch.full_like(pos, b), pos, k)
        keys[b] = torch.empty(n, D)
        keys[b][pos] = k
    got = cache.gather(bt, lens)
    for b in range(B):
        assert got[b].shape == (int(lens[b]), D)
        if fmt == "bf16":
            assert torch.equal(got[b], keys[b].to(torch.bfloat16).float())
        else:
            v, s = quantize_index_keys(keys[b])
            assert torch.equal(got[b], dequantize_fp8_keys(v, s))
    # dequantize() agrees with gather on a slot
    slot = int(slots_for_positions(bt, torch.tensor([2]), torch.tensor([17]), P)[0])
    assert torch.equal(cache.dequantize().reshape(-1, D)[slot], got[2][17])


def test_slots_for_positions():
    bt = torch.tensor([[5, 2, 7], [1, 0, 3]], dtype=torch.int32)
    s = slots_for_positions(bt, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 9, 3, 17]), 8)
    assert s.tolist() == [40, 2 * 8 + 1, 8 + 3, 3 * 8 + 1]


def test_wrap_infers_format():
    c = IndexKeyCache.allocate(3, 16, 128, IndexKeyFormat.FP8)
    w = IndexKeyCache.wrap(c.data, 128)
    assert w.fmt is IndexKeyFormat.FP8 and w.page_size == 16 and w.bytes_per_token == 132
    b = IndexKeyCache.wrap(torch.zeros(2, 32, 64, dtype=torch.bfloat16), 64)
    assert b.fmt is IndexKeyFormat.BF16 and b.page_size == 32


def test_validation_errors():
    with pytest.raises(ValueError, match="page_size"):
        IndexKeyCache.allocate(2, 12, 16)
    with pytest.raises(ValueError, match="head_dim"):
        IndexKeyCache.allocate(2, 16, 6)
    c = IndexKeyCache.allocate(2, 4, 16)
    with pytest.raises(ValueError, match="non-finite"):
        c.write_slots(torch.tensor([0]), torch.full((1, 16), float("nan")))
    with pytest.raises(ValueError, match="out of range"):
        c.write_slots(torch.tensor([8]), torch.ones(1, 16))
    with pytest.raises(ValueError, match=r"k must be \[T, 16\]"):
        c.write_slots(torch.tensor([0]), torch.ones(1, 8))
    with pytest.raises(ValueError, match="page_size"):
        IndexKeyCache.wrap(torch.zeros(2, 100, dtype=torch.uint8), 16)
    with pytest.raises(ValueError, match="positions"):
        slots_for_positions(torch.zeros(1, 2, dtype=torch.int32), torch.tensor([0]),
                            torch.tensor([-1]), 4)
