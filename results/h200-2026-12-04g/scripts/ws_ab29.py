"""The split combine waiting row by row (``ws._ROW_WAIT_COMBINE``: each consumer partition
counts its stored partials in on its (row, head block) counter, the combine is launched as a
programmatic dependent that the decode triggers first thing, and each combine program waits
for its own row's count) against the plain launch after the whole decode. Split calls: H128
fp8 B1-B32, bf16 B1 / B4 / B32, the transposed 16-head programs (fp8 and bf16) at B8; FlashMLA
in the same process. Every row checked against the float32 reference (rel 1e-2, LSE_TOL) and
against the plain variant (``vs_off``), re-run 5 times for a race, the counters checked back
at 0 after the calls, and one CUDA graph of the call replayed 3 times against the eager
output. CUDA events, L2 flushed, median of 30; interleaved rounds.
Usage: python3 ws_ab29.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from backends.kernels.sparse_mla_decode import _ROW_COUNTERS
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
pools = {kv: Pool(128, 32768, 64, 576, 512, kv, dev, seed=7) for kv in ("fp8_ds_mla", "bf16")}
shapes = ([("fp8_ds_mla", b, 128) for b in (1, 2, 4, 8, 16, 32)]
          + [("bf16", b, 128) for b in (1, 4, 32)] + [("fp8_ds_mla", 8, 16), ("bf16", 8, 16)])
probs = {s: DecodeProblem.draw(pools[s[0]], s[1], s[2], 2048, seed=8 + s[1] + s[2]) for s in shapes}


def counters_zero() -> bool:
    torch.cuda.synchronize()
    return all(int(t.abs().sum()) == 0 for kept in _ROW_COUNTERS.values() for t in kept)


def graph_check(fn, want) -> float:
    """Largest difference of 3 replays of a captured call from ``want`` (the eager output)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = fn()
    worst = 0.0
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        worst = max(worst, (got[0].float() - want.float()).abs().max().item())
    return worst


rows = []
for r in range(ROUNDS):
    for shape, prob in probs.items():
        kv = shape[0]
        pool = pools[kv]
        ref = None
        for name in ("flashmla", "plain", "rowwait"):
            if name == "flashmla":
                fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
            else:
                ws._ROW_WAIT_COMBINE = name == "rowwait"
                fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
            vs = race = graph = float("nan")
            zero = True
            if name != "flashmla":
                if ref is None:
                    ref = out[0].clone()
                vs = (out[0].float() - ref.float()).abs().max().item()
                race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(5))
                zero = counters_zero()
                if r == 0:
                    graph = graph_check(fn, out[0])
                    zero = zero and counters_zero()
            t = time_fn(fn, dev, warmup=5, repeats=30)
            zero = zero and (name == "flashmla" or counters_zero())
            splits = out[2].num_splits if name != "flashmla" else 0
            rows.append((shape, name, splits, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                         "BAD" if chk.failure() or not zero else "ok", vs, race, graph))
ws._ROW_WAIT_COMBINE = True
print(f"{'kv':10} {'B':>3} {'H':>3} {'variant':9} {'S':>3} {'median_us':>9} {'p10':>7} {'p90':>7} "
      f"{'rel_err':>8} {'check':5} {'vs_off':>8} {'race':>8} {'graph':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[1] == "flashmla":
        fm[r[0]] = r[3]
    (kv, b, h) = r[0]
    print(f"{kv:10} {b:>3} {h:>3} {r[1]:9} {r[2]:>3} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} "
          f"{r[7]:5} {r[8]:8.1e} {r[9]:8.1e} {r[10]:8.1e} {r[3] / fm[r[0]]:6.3f}")
