"""i9: as comb41.py (i6), with the bf16 partials' combine at 4 warps a program and at as many as a
row's words fill (``_PAIRS_WARPS_BY_COLUMNS``, the module's switch really set, see ws_ab43.py).
comb41.py's doc: The split combine alone on float32 and on bf16 partials (the pairs path), at the ws decode's
small-batch shapes (H128 d_v 512; B / splits 4 / 16, 8 / 8, 16 / 4, 32 / 2), partials drawn at
random (the bf16 ones the float32 ones rounded): cold L2 (flushed before each call), and with
the partials just rewritten by a copy before each call (``setup``, untimed: in L2 and dirty, as
the decode leaves them). Each output checked against the float64 merge of the same partials
first. CUDA events, launch shield, median of 30. Usage: python3 comb44.py"""
import sys

import torch

from backends.kernels.sparse_mla_decode import combine_splits

smd = sys.modules["backends.kernels.sparse_mla_decode"]
from harness.timing import time_fn

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(41)
print(f"{'B':>3} {'S':>3} {'partials':11} {'state':6} {'median_us':>9} {'p10':>7} {'p90':>7} {'MB':>6} {'max_err':>8}")
for b, s in ((4, 16), (8, 8), (16, 4), (32, 2)):
    h, d_v = 128, 512
    src32 = torch.randn(b, h, s, d_v, generator=g, device=dev)
    lse = torch.randn(b, h, s, generator=g, device=dev) * 3
    w = torch.softmax(lse.double(), -1)
    for dt, wc in ((torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)):
        smd._PAIRS_WARPS_BY_COLUMNS = wc
        src = src32.to(dt)
        part = src.clone()
        ref = (w[..., None] * src.double()).sum(2)
        out = torch.empty(b, h, d_v, dtype=torch.bfloat16, device=dev)
        o_lse = torch.empty(b, h, device=dev)
        combine_splits(part, lse, out, o_lse)
        torch.cuda.synchronize()
        err = (out.double() - ref).abs().max().item()
        assert err < 2e-2, (b, s, dt, err)
        fn = lambda: combine_splits(part, lse, out, o_lse)
        for state, kw in (("cold", dict(cold_l2=True)),
                          ("dirty", dict(cold_l2=False, setup=lambda: part.copy_(src)))):
            t = time_fn(fn, dev, warmup=5, repeats=30, **kw)
            print(f"{b:>3} {s:>3} {str(dt)[6:] + (' wc' if wc else ''):11} {state:6} {t.median_us:9.1f} {t.p10_us:7.1f} "
                  f"{t.p90_us:7.1f} {part.numel() * part.element_size() / 1e6:6.1f} {err:8.1e}")
