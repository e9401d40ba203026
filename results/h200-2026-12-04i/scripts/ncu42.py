"""One split-combine launch on float32 and one on bf16 partials (the pairs path) at B32 H128
d_v 512, 2 splits, for Nsight Compute (call7.sh profiles the two launches). Partials random,
each output checked against the float64 merge; with ``wc`` the bf16 launch at as many warps as
a row's words fill (``_PAIRS_WARPS_BY_COLUMNS``, call i8). Usage: python3 ncu42.py [wc]"""
import sys

import torch

from backends.kernels import sparse_mla_decode as smd
from backends.kernels.sparse_mla_decode import combine_splits

smd._PAIRS_WARPS_BY_COLUMNS = sys.argv[1:] == ["wc"]

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(42)
b, h, s, d_v = 32, 128, 2, 512
src = torch.randn(b, h, s, d_v, generator=g, device=dev)
lse = torch.randn(b, h, s, generator=g, device=dev) * 3
w = torch.softmax(lse.double(), -1)
for dt in (torch.float32, torch.bfloat16):
    part = src.to(dt)
    out = torch.empty(b, h, d_v, dtype=torch.bfloat16, device=dev)
    o_lse = torch.empty(b, h, device=dev)
    combine_splits(part, lse, out, o_lse)
    torch.cuda.synchronize()
    err = (out.double() - (w[..., None] * part.double()).sum(2)).abs().max().item()
    print(dt, "max_err", err)
    assert err < 2e-2
