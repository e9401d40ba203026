"""Request-local top-k positions -> global slot ids: Triton kernel vs torch reference vs a loop."""
import pytest
import torch

from backends.kernels.index_convert import convert_req_index_to_global_index
from harness.reference import convert_req_index_to_global_index_ref


def _loop_ref(req_id, block_table, tok, page_size):
    """The definition, one element at a time (cross-checks the vectorised reference)."""
    out = torch.full(tok.shape, -1, dtype=torch.int32)
    r, mb = block_table.shape
    for t in range(tok.shape[0]):
        q = int(req_id[t])
        for j in range(tok.shape[1]):
            i = int(tok[t, j])
            if i < 0 or not 0 <= q < r or i // page_size >= mb:
                continue
            page = int(block_table[q, i // page_size])
            if page >= 0:
                out[t, j] = page * page_size + i % page_size
    return out


def _case(seed, t, k, r, max_blocks, page_size, device):
    g = torch.Generator().manual_seed(seed)
    # shuffled block tables: the pages of all requests are a random permutation of the pool
    bt = torch.randperm(r * max_blocks, generator=g).to(torch.int32).view(r, max_blocks)
    req = torch.randint(0, r, (t,), generator=g, dtype=torch.int32)
    # positions up to 1.25x the table (some fall beyond it), with -1 padding
    tok = torch.randint(0, int(max_blocks * page_size * 1.25), (t, k), generator=g, dtype=torch.int32)
    tok[torch.rand(t, k, generator=g) < 0.2] = -1
    return req.to(device), bt.to(device), tok.to(device)


@pytest.mark.parametrize("page_size, k, block_k", [(64, 300, 256), (16, 70, 32), (1, 33, 16)])
def test_matches_reference_and_loop(device, page_size, k, block_k):
    req, bt, tok = _case(page_size + k, t=9, k=k, r=4, max_blocks=6, page_size=page_size, device=device)
    out = convert_req_index_to_global_index(req, bt, tok, page_size, block_k=block_k)
    ref = convert_req_index_to_global_index_ref(req, bt, tok, page_size)
    assert out.dtype == torch.int32 and out.shape == tok.shape and out.is_contiguous()
    assert torch.equal(out.cpu(), ref.cpu())
    assert torch.equal(ref.cpu(), _loop_ref(req.cpu(), bt.cpu(), tok.cpu(), page_size))
    # the case exercises every branch: valid slots, -1 padding, positions beyond the table
    beyond = (tok.cpu() // page_size >= bt.shape[1])
    assert (out.cpu() >= 0).sum() > 0 and beyond.any() and (tok.cpu() < 0).any()
    assert torch.all(out.cpu()[beyond] == -1) and torch.all(out.cpu()[tok.cpu() < 0] == -1)


def test_negative_pages_bad_requests_and_strided_table(device):
    req, bt, tok = _case(5, t=6, k=40, r=3, max_blocks=5, page_size=8, device=device)
    wide = torch.full((3, 9), 777, dtype=torch.int32, device=device)
    wide[:, :5] = bt
    wide[1, 2] = -1                                   # an unallocated page
    table = wide[:, :5]                               # row stride 9, unit column stride
    req = req.clone()
    req[0] = 3                                        # request id outside [0, R)
    req[1] = 1
    out = convert_req_index_to_global_index(req, table, tok, 8)
    ref = convert_req_index_to_global_index_ref(req, table.contiguous(), tok, 8)
    assert torch.equal(out.cpu(), ref.cpu())
    assert torch.all(out[0] == -1)
    hit_unallocated = (tok[1] >= 16) & (tok[1] < 24)
    assert hit_unallocated.any() and torch.all(out[1][hit_unallocated] == -1)


def test_validation_errors(device):
    req, bt, tok = _case(1, t=4, k=8, r=2, max_blocks=3, page_size=4, device=device)
    f = convert_req_index_to_global_index
    with pytest.raises(ValueError, match="req_id must be torch.int32"):
        f(req.long(), bt, tok, 4)
    with pytest.raises(ValueError, match="block_table must be 2-D"):
        f(req, bt.flatten(), tok, 4)
    with pytest.raises(ValueError, match="token_indices must have T=4"):
        f(req, bt, tok[:3], 4)
    with pytest.raises(ValueError, match="page_size"):
        f(req, bt, tok, 0)
    with pytest.raises(ValueError, match="unit last-dim stride"):
        f(req, bt, tok.t().contiguous().t(), 4)
    with pytest.raises(ValueError, match="block_k"):
        f(req, bt, tok, 4, block_k=100)
