"""vLLM's index conversion as a peer: skipped cleanly where vllm is absent."""
import pytest
import torch

from backends.kernels.flashmla_peer import PeerUnavailable
from backends.kernels import vllm_peer
from harness.reference import convert_req_index_to_global_index_ref


def test_absent_vllm_is_reported_not_crashed():
    try:
        vllm_peer.vllm_convert_kernel()
    except PeerUnavailable as e:
        assert "not importable" in str(e)


def test_vllm_conversion_matches_reference(device):
    try:
        vllm_peer.vllm_convert_kernel()
    except PeerUnavailable as e:
        pytest.skip(str(e))
    g = torch.Generator().manual_seed(0)
    req = torch.randint(0, 4, (6,), generator=g, dtype=torch.int32)
    bt = torch.randperm(4 * 32, generator=g).to(torch.int32).view(4, 32)
    tok = torch.randint(-1, 32 * 64, (6, 256), generator=g, dtype=torch.int32)
    req, bt, tok = req.to(device), bt.to(device), tok.to(device)
    got = vllm_peer.vllm_convert_req_index_to_global_index(req, bt, tok, 64)
    assert torch.equal(got.cpu(), convert_req_index_to_global_index_ref(req, bt, tok, 64).cpu())
