"""The FlashMLA peer: its argument mapping on the CPU (through a model of the upstream kernels'
documented contract), and the real kernels against the reference on the GPU."""
import pytest
import torch

from backends.kernels import flashmla_peer as fp
from backends.kernels.kv_format import quantize_fp8_ds_mla
from harness.reference import sparse_mla_decode_ref


def _inputs(b=3, h=64, n=256, k=100, fmt="fp8_ds_mla", seed=0, device="cpu"):
    g = torch.Generator(device=device).manual_seed(seed)
    kv = torch.randn(n, 576, generator=g, device=device).to(torch.bfloat16)
    cache = quantize_fp8_ds_mla(kv, d_nope=512) if fmt == "fp8_ds_mla" else kv
    q = torch.randn(b, h, 576, generator=g, device=device).to(torch.bfloat16)
    idx = torch.randint(0, n, (b, k), generator=g, device=device, dtype=torch.int32)
    idx[0, ::7] = -1
    idx[-1, :] = -1  # a fully masked row
    return q, cache, idx


def _fp8_decode_contract(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale,
                         is_fp8_kvcache, indices):
    """What flash_mla_with_kvcache computes per its docstring: index = block * block_size +
    offset into k_cache [num_blocks, block_size, 1, bytes]; -1 invalid; q [b, s_q, h, d]."""
    assert is_fp8_kvcache and block_table is None and head_dim_v == 512
    assert indices.shape[-1] % fp.DECODE_TOPK_TILE == 0
    flat = k_cache.reshape(-1, k_cache.shape[-1])
    out, lse = sparse_mla_decode_ref(q[:, 0], flat, indices[:, 0], softmax_scale, d_v=head_dim_v)
    return out.unsqueeze(1), lse.unsqueeze(-1)


def test_fp8_mapping_reproduces_reference():
    q, cache, idx = _inputs()
    scale = 0.0721
    out, lse = fp.unmap_fp8_decode(*_fp8_decode_contract(**fp.map_fp8_decode(q, cache, idx, scale)))
    ref_out, ref_lse = sparse_mla_decode_ref(q, cache, idx, scale, d_v=512)
    assert out.shape == (3, 64, 512) and lse.shape == (3, 64)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)
    assert torch.isinf(lse[-1]).all()


def test_fp8_mapping_views_slots_not_copies():
    q, cache, idx = _inputs()
    args = fp.map_fp8_decode(q, cache, idx, 0.1)
    assert args["k_cache"].shape == (256 // 64, 64, 1, 656)
    assert args["k_cache"].data_ptr() == cache.data_ptr()
    assert args["indices"].shape == (3, 1, 128)  # 100 padded to the 64-token tile
    assert (args["indices"][:, 0, 100:] == -1).all()
    assert torch.equal(args["indices"][:, 0, :100], idx)


def test_bf16_mapping_reproduces_reference():
    q, cache, idx = _inputs(fmt="bf16", k=130)
    a = fp.map_bf16_sparse(q, cache, idx, 0.05)
    assert a["kv"].shape == (256, 1, 576) and a["indices"].shape == (3, 1, 256)
    # flash_mla_sparse_fwd contract: s_q = batch, kv [s_kv, 1, d], indices [s_q, 1, topk]
    out, lse = sparse_mla_decode_ref(a["q"], a["kv"][:, 0], a["indices"][:, 0], a["sm_scale"], d_v=a["d_v"])
    ref_out, ref_lse = sparse_mla_decode_ref(q, cache, idx, 0.05, d_v=512)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)


@pytest.mark.parametrize("h,d", [(256, 576), (64, 320)])
def test_unsupported_shapes(h, d):
    q = torch.zeros(2, h, d, dtype=torch.bfloat16)
    kv = torch.zeros(64, d, dtype=torch.bfloat16)
    with pytest.raises(fp.PeerUnsupported):
        fp.check_supported(q, kv, 512 if d == 576 else 256)


@pytest.mark.parametrize("h,want", [(1, 64), (16, 64), (64, 64), (65, 128), (128, 128)])
def test_heads_padded_as_vllm_pads_them(h, want):
    """Fewer heads than the kernel computes are zero-padded (TP8: 16 heads -> 64 on Hopper)."""
    assert fp.padded_heads(h) == want
    q = torch.zeros(2, h, 576, dtype=torch.bfloat16)
    assert fp.check_supported(q, torch.zeros(64, 576, dtype=torch.bfloat16), 512) == "bf16"


def test_unavailable_on_cpu():
    with pytest.raises(fp.PeerUnavailable):
        fp.FlashMLAAttention(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
@pytest.mark.parametrize("b,h,k,n", [(8, 128, 2048, 64 * 2048), (4, 64, 512, 64 * 256)])
def test_flashmla_matches_reference_gpu(fmt, b, h, k, n):
    try:
        peer = fp.flashmla_attention(torch.device("cuda"))
    except fp.PeerUnavailable as e:
        pytest.skip(str(e))
    q, cache, idx = _inputs(b=b, h=h, n=n, k=k, fmt=fmt, device="cuda", seed=3)
    out, lse = peer(q, cache, idx, 0.0721, d_v=512)
    ref_out, ref_lse = sparse_mla_decode_ref(q, cache, idx, 0.0721, d_v=512)
    rel = ((out.float() - ref_out).norm() / ref_out.norm()).item()
    assert rel < 0.02, rel
    fin = torch.isfinite(ref_lse)
    assert (lse[fin] - ref_lse[fin]).abs().max().item() < 0.05
    masked = ~fin.all(-1)
    assert out[masked].float().abs().max().item() == 0.0  # fully masked rows: out 0


def test_flashmla_build_recorded(tmp_path, monkeypatch):
    """The build string comes from distribution metadata: name, version, the PEP 610 commit."""
    import json
    import sys
    from harness.env import provenance
    assert fp.flashmla_build() == provenance("cpu")["flashmla_build"]
    dist = tmp_path / "sgl_flash_mla-9.8.7.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sgl-flash-mla\nVersion: 9.8.7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert fp.flashmla_build() == "sgl-flash-mla 9.8.7 commit=unknown"
    (dist / "direct_url.json").write_text(json.dumps(
        {"url": "https://github.com/sgl-project/FlashMLA", "vcs_info": {"vcs": "git", "commit_id": "ab" * 20}}))
    assert fp.flashmla_build() == f"sgl-flash-mla 9.8.7 commit={'ab' * 20}"
    assert sys.path[0] == str(tmp_path)
