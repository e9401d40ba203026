"""vLLM's index-conversion kernel, staged out of the vllm wheel: the ast extraction on a
synthetic source (no wheel needed), and the staged kernel against ours and the reference."""
import glob
import os
import zipfile
from pathlib import Path

import pytest
import torch

from backends.kernels import vllm_peer
from backends.kernels.flashmla_peer import PeerUnavailable
from backends.kernels.index_convert import convert_req_index_to_global_index
from harness.reference import convert_req_index_to_global_index_ref

SYNTHETIC = '''
import torch
from somewhere import helper
from vllm.triton_utils import tl, triton

SCALE = 3

class Holder:
    @staticmethod
    @triton.jit(do_not_specialize=["n"])
    def affine_kernel(x_ptr, out_ptr, n, A: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m, other=0)
        tl.store(out_ptr + offs, v * A + 1, mask=m)

@triton.jit
def needs_global(x_ptr):
    tl.store(x_ptr, SCALE)

def not_a_kernel(x):
    return helper(x)
'''


def test_extraction_cuts_out_the_jit_function_and_runs_it(tmp_path, device):
    text = vllm_peer.extract_jit_source(SYNTHETIC, ["affine_kernel"])
    assert "staticmethod" not in text and "helper" not in text and "vllm" not in text
    assert "needs_global" not in text and "@triton.jit(do_not_specialize=['n'])" in text
    path = tmp_path / "k.py"
    path.write_text(text)
    fn = vllm_peer.load_module(path, "_synthetic_kernel").affine_kernel
    x = torch.randint(-1000, 1000, (300,), dtype=torch.int32, device=device)
    out = torch.empty_like(x)
    fn[(3,)](x, out, 300, A=5, BLOCK=128)
    assert torch.equal(out, x * 5 + 1)


def test_extraction_names_what_is_missing():
    with pytest.raises(vllm_peer.ExtractionError, match="needs names beyond triton/tl: SCALE"):
        vllm_peer.extract_jit_source(SYNTHETIC, ["needs_global"])
    with pytest.raises(vllm_peer.ExtractionError, match="no @triton.jit function named not_a_kernel"):
        vllm_peer.extract_jit_source(SYNTHETIC, ["not_a_kernel"])


def test_unstaged_is_unavailable_and_bad_wheel_is_refused(tmp_path):
    with pytest.raises(PeerUnavailable, match="not staged"):
        vllm_peer.vllm_convert_kernel(tmp_path / "nothing")
    bad = tmp_path / "vllm-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("vllm/__init__.py", "")
    assert vllm_peer.main(["stage", "--vllm", str(bad)]) == 2
    with pytest.raises(vllm_peer.ExtractionError, match="has no vllm/v1"):
        vllm_peer.stage(bad, tmp_path / "out")


def _stage_dir(tmp_path) -> Path:
    """The repo's staged kernel, else one staged here from a wheel at $VLLM_WHEEL or
    /tmp/vllm/vllm-*.whl; skips when neither exists."""
    if (vllm_peer.STAGE_DIR / vllm_peer.STAGED_FILE).exists():
        return vllm_peer.STAGE_DIR
    wheels = [os.environ["VLLM_WHEEL"]] if os.environ.get("VLLM_WHEEL") else sorted(glob.glob("/tmp/vllm/vllm-*.whl"))
    if not wheels:
        pytest.skip("vLLM's kernel is not staged and no vllm wheel is at hand "
                    "(python -m backends.kernels.vllm_peer stage --vllm WHEEL)")
    vllm_peer.stage(Path(wheels[-1]), tmp_path / "vllm")
    return tmp_path / "vllm"


@pytest.mark.parametrize("page_size, k, t", [(64, 256, 7), (16, 128, 5), (1, 384, 3)])
def test_staged_vllm_kernel_equals_ours(tmp_path, device, page_size, k, t):
    stage_dir = _stage_dir(tmp_path)
    g = torch.Generator().manual_seed(page_size * 31 + k)
    r, blocks = 4, 24
    bt = torch.randperm(r * blocks, generator=g).to(torch.int32).view(r, blocks)
    req = torch.randint(0, r, (t,), generator=g, dtype=torch.int32)
    # positions up to 1.25x the table (beyond it: -1) and -1 padding
    tok = torch.randint(0, int(blocks * page_size * 1.25), (t, k), generator=g, dtype=torch.int32)
    tok[torch.rand(t, k, generator=g) < 0.2] = -1
    req, bt, tok = req.to(device), bt.to(device), tok.to(device)
    theirs = vllm_peer.vllm_convert_req_index_to_global_index(req, bt, tok, page_size, stage_dir=stage_dir)
    ours = convert_req_index_to_global_index(req, bt, tok, page_size)
    ref = convert_req_index_to_global_index_ref(req, bt, tok, page_size)
    assert torch.equal(theirs.cpu(), ref.cpu()) and torch.equal(ours.cpu(), ref.cpu())
    valid = ref.cpu() >= 0
    assert valid.any() and (~valid).any() and (tok.cpu() // page_size >= blocks).any()
    with pytest.raises(ValueError, match="multiple of 128"):
        vllm_peer.vllm_convert_req_index_to_global_index(req, bt, tok[:, :100].contiguous(),
                                                         page_size, stage_dir=stage_dir)
