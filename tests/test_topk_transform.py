"""Top-k + index transform: PAGED and RAGGED, fused vs unfused, and the indexer metadata."""
import pytest
import torch

from backends.kernels.indexer import indexer_logits_ragged
from backends.kernels.topk import plan_build_count, plan_topk, topk_per_row
from backends.kernels.topk_transform import (IndexerMetadata, TopkTransformMethod, topk_transform,
                                             transform_topk_positions)
from backends.kernels.index_cache import quantize_index_keys
from harness.indexer_ref import (indexer_logits_ragged_ref, paged_transform_ref,
                                 ragged_transform_ref, topk_ref)


def _logits(B, N, seed, device):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, generator=g)
    x[:, ::7] = torch.randint(-2, 3, (B, len(range(0, N, 7))), generator=g).float()  # some ties
    return x.to(device)


@pytest.mark.parametrize("P", [1, 4, 64])
def test_paged_fused_equals_unfused_and_reference(P, device):
    k = 16
    lengths = torch.tensor([0, 9, 16, 40, 300, 500], dtype=torch.int32)
    B, N = lengths.shape[0], 500
    logits = _logits(B, N, P, device)
    max_pages = -(-N // P)
    g = torch.Generator().manual_seed(100 + P)
    bt = torch.randperm(B * max_pages + 3, generator=g)[:B * max_pages].view(B, max_pages)
    bt = bt.to(torch.int32).to(device)
    lengths = lengths.to(device)
    plan = plan_topk(lengths, k, chunk_size=128)
    fused = topk_transform(logits, lengths, k, TopkTransformMethod.PAGED, block_table=bt,
                           page_size=P, plan=plan, check=True)
    unfused = topk_transform(logits, lengths, k, TopkTransformMethod.PAGED, block_table=bt,
                             page_size=P, plan=plan, fuse=False)
    assert torch.equal(fused, unfused)
    pos = topk_ref(logits.cpu(), lengths.cpu(), k)
    assert torch.equal(fused.cpu(), paged_transform_ref(pos, bt.cpu(), P))
    assert bool((fused[0] == -1).all()) and bool((fused[1, 9:] == -1).all())
    assert plan.uses == 2


def test_paged_with_row_to_request_map(device):
    """Several logits rows (e.g. MTP drafts) share one request's block table row."""
    k, P = 8, 4
    lengths = torch.tensor([30, 31, 12, 13], dtype=torch.int32, device=device)
    row_req = torch.tensor([1, 1, 0, 0], dtype=torch.int32, device=device)
    bt = torch.tensor([[9, 3, 5, 7, 0, 0, 0, 0], [2, 8, 6, 4, 1, 11, 10, 12]],
                      dtype=torch.int32, device=device)
    logits = _logits(4, 31, 5, device)
    for fuse in (True, False):
        got = topk_transform(logits, lengths, k, TopkTransformMethod.PAGED, block_table=bt,
                             page_size=P, row_req=row_req, fuse=fuse)
        pos = topk_ref(logits.cpu(), lengths.cpu(), k)
        assert torch.equal(got.cpu(), paged_transform_ref(pos, bt.cpu(), P, row_req.cpu()))


def test_ragged_fused_equals_unfused_and_reference(device):
    k = 12
    lengths = torch.tensor([5, 12, 100, 400, 260], dtype=torch.int32, device=device)
    # rows 0-2 are one request's extend tokens (same start), rows 3-4 another one's
    offsets = torch.tensor([0, 0, 0, 100, 100], dtype=torch.int32, device=device)
    logits = _logits(5, 400, 9, device)
    plan = plan_topk(lengths, k, chunk_size=64)
    fused = topk_transform(logits, lengths, k, TopkTransformMethod.RAGGED, row_offsets=offsets,
                           plan=plan)
    unfused = topk_transform(logits, lengths, k, TopkTransformMethod.RAGGED, row_offsets=offsets,
                             plan=plan, fuse=False)
    assert torch.equal(fused, unfused)
    pos = topk_ref(logits.cpu(), lengths.cpu(), k)
    assert torch.equal(fused.cpu(), ragged_transform_ref(pos, offsets.cpu()))


def test_standalone_transform_keeps_minus_one(device):
    pos = torch.tensor([[3, -1, 0, 7], [-1, -1, -1, -1]], dtype=torch.int32, device=device)
    bt = torch.tensor([[4, 2], [1, 0]], dtype=torch.int32, device=device)
    out = transform_topk_positions(pos, TopkTransformMethod.PAGED, block_table=bt, page_size=4)
    assert out.cpu().tolist() == [[19, -1, 16, 11], [-1, -1, -1, -1]]
    off = torch.tensor([10, 20], dtype=torch.int32, device=device)
    out = transform_topk_positions(pos, TopkTransformMethod.RAGGED, row_offsets=off)
    assert out.cpu().tolist() == [[13, -1, 10, 17], [-1, -1, -1, -1]]


def test_metadata_decode_is_paged_extend_is_ragged(device):
    k, P = 8, 16
    seq = torch.tensor([40, 7, 100], dtype=torch.int32, device=device)
    bt = torch.tensor([[3, 1, 0, 0, 0, 0, 0], [5, 0, 0, 0, 0, 0, 0], [2, 4, 6, 8, 9, 10, 11]],
                      dtype=torch.int32, device=device)
    before = plan_build_count()
    meta = IndexerMetadata.for_decode(seq, bt, P, k)
    assert meta.method is TopkTransformMethod.PAGED and meta.fuse_topk
    assert plan_build_count() == before + 1
    for layer in range(3):  # one plan, several layers
        logits = _logits(3, 100, 20 + layer, device)
        got = meta.select(logits)
        pos = meta.positions(logits)
        assert torch.equal(pos.cpu(), topk_ref(logits.cpu(), seq.cpu(), k))
        assert torch.equal(got.cpu(), paged_transform_ref(pos.cpu(), bt.cpu(), P))
    assert plan_build_count() == before + 1 and meta.plan.uses == 6
    unfused = IndexerMetadata.for_decode(seq, bt, P, k, fuse_topk=False)
    assert torch.equal(unfused.select(logits), meta.select(logits))

    ks = torch.tensor([0, 0, 50], dtype=torch.int32, device=device)
    ke = torch.tensor([30, 31, 90], dtype=torch.int32, device=device)
    ext = IndexerMetadata.for_extend(ks, ke, k)
    assert ext.method is TopkTransformMethod.RAGGED
    assert ext.lengths.cpu().tolist() == [30, 31, 40]


def test_extend_end_to_end_indices_point_at_top_keys(device):
    """Ragged indexer logits -> RAGGED top-k: indices into the concatenated key buffer whose
    reference scores are the row's top-k scores."""
    g = torch.Generator().manual_seed(12)
    H, D, N, k = 16, 32, 150, 10
    keys = torch.randn(N, D, generator=g)
    vals, scales = quantize_index_keys(keys)
    ks = torch.tensor([0, 0, 0, 80, 80], dtype=torch.int32)
    ke = torch.tensor([60, 61, 62, 149, 150], dtype=torch.int32)
    q = torch.randn(5, H, D, generator=g).to(torch.bfloat16)
    w = torch.randn(5, H, generator=g)
    to = [x.to(device) for x in (q, w, vals, ks, ke, scales)]
    logits = indexer_logits_ragged(*to[:5], k_scales=to[5])
    meta = IndexerMetadata.for_extend(to[3], to[4], k)
    idx = meta.select(logits).cpu().long()
    ref = indexer_logits_ragged_ref(q, w, vals, ks, ke, k_scales=scales)
    for r in range(5):
        assert bool((idx[r] >= ks[r]).all()) and bool((idx[r] < ke[r]).all())
        got = ref[r, idx[r] - ks[r]].sort().values
        want = torch.topk(ref[r, : ke[r] - ks[r]], k).values.sort().values
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_validation_errors(device):
    logits = _logits(2, 20, 1, device)
    lengths = torch.tensor([20, 5], dtype=torch.int32, device=device)
    bt = torch.zeros(2, 5, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="PAGED needs block_table"):
        topk_transform(logits, lengths, 4, TopkTransformMethod.PAGED, page_size=4)
    with pytest.raises(ValueError, match="power of two"):
        topk_transform(logits, lengths, 4, TopkTransformMethod.PAGED, block_table=bt,
                       page_size=6)
    with pytest.raises(ValueError, match="RAGGED needs row_offsets"):
        topk_transform(logits, lengths, 4, TopkTransformMethod.RAGGED)
    with pytest.raises(ValueError, match="method must be"):
        topk_transform(logits, lengths, 4, "paged", block_table=bt, page_size=4)
    with pytest.raises(ValueError, match="fewer pages"):
        topk_transform(logits, lengths, 4, TopkTransformMethod.PAGED, block_table=bt[:, :2],
                       page_size=4, check=True)
    with pytest.raises(ValueError, match="row_req"):
        topk_transform(logits, lengths, 4, TopkTransformMethod.PAGED, block_table=bt,
                       page_size=4, row_req=torch.zeros(3, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="top_k"):
        topk_transform(logits, lengths, 0, TopkTransformMethod.RAGGED,
                       row_offsets=torch.zeros(2, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="ks and ke"):
        IndexerMetadata.for_extend(lengths, lengths.long(), 4)


@pytest.mark.gpu
def test_gpu_dsv32_fused_vs_unfused():
    k, P = 2048, 64
    g = torch.Generator().manual_seed(0)
    B, N = 8, 32768
    lengths = torch.randint(1, N + 1, (B,), generator=g).to(torch.int32)
    lengths[0] = N
    logits = torch.randn(B, N, generator=g)
    pages = -(-N // P)
    bt = torch.randperm(B * pages, generator=g).view(B, pages).to(torch.int32)
    logits, lengths, bt = logits.cuda(), lengths.cuda(), bt.cuda()
    plan = plan_topk(lengths, k)
    pos = topk_per_row(logits, lengths, k, plan=plan)
    assert torch.equal(pos.cpu(), topk_ref(logits.cpu(), lengths.cpu(), k))
    for method, kw in ((TopkTransformMethod.PAGED, dict(block_table=bt, page_size=P)),
                       (TopkTransformMethod.RAGGED, dict(row_offsets=lengths * 3))):
        f = topk_transform(logits, lengths, k, method, plan=plan, **kw)
        u = topk_transform(logits, lengths, k, method, plan=plan, fuse=False, **kw)
        assert torch.equal(f, u)
