"""i5: as kineto38.py (i3) after the pairs combine's packed output store, with 4 warps and with
warps by columns. kineto38.py's doc: The bf16 split partials with the combine reading int32 pairs (after i2), kernel by kernel
(torch.profiler's CUDA timeline, as kineto30.py): float32 partials, bf16 partials (staged
stores) with combine programs of 4096 and 2048 words, fp8_ds_mla H128 top_k 2048 at B4 / B16 / B32 (the wave model's splits). Each call
after an L2 flush, checked against the float32 reference first; medians over the calls.
Usage: python3 kineto40.py [CALLS]"""
import json
import statistics
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool

CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
flush = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
pools = {kv: Pool(128, 32768, 64, 576, 512, kv, dev, seed=7) for kv in ("fp8_ds_mla", "bf16")}
shapes = [("fp8_ds_mla", b) for b in (2, 4, 8, 16, 32)]


def kernel_events(run):
    """The CUDA kernels ``run()`` launched, in start order (chrome-trace events)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        ev = json.load(open(f.name))["traceEvents"]
    return sorted((e for e in ev if e.get("cat") == "kernel"), key=lambda e: e["ts"])


FLUSH = {e["name"] for e in kernel_events(lambda: flush.fill_(1))}


def timeline(fn):
    """Kernels of CALLS calls, each after a flush: a list per call of (name, start_us, dur_us),
    start from the call's first kernel."""
    fn()
    torch.cuda.synchronize()

    def run():
        for i in range(CALLS):
            flush.fill_(i & 255)
            fn()
    ks = kernel_events(run)
    calls, cur = [], None
    for e in ks:
        if e["name"] in FLUSH and (cur is None or cur):
            cur = []
            calls.append(cur)
        elif cur is not None:
            cur.append((e["name"], float(e["ts"]), float(e["dur"])))
    out = []
    for c in calls:
        if c:
            t0 = c[0][1]
            out.append([(n, s - t0, d) for n, s, d in c])
    return out


def short(name: str) -> str:
    n = name.split("(")[0].split("<")[0]
    return n[-38:]


print(f"{'kv':10} {'B':>2} {'who':8} {'kernel':38} {'start':>6} {'dur':>6} {'end':>6}   (us, median of calls)")
from backends.kernels import sparse_mla_decode as smd
VARIANTS = {"f32": (torch.float32, False), "bf16": (torch.bfloat16, False),
            "bf16 wc": (torch.bfloat16, True)}
for kv, b in shapes:
    pool = pools[kv]
    prob = DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b + 128)
    for who, (dt, wc) in VARIANTS.items():
        ws._PARTIALS, smd._PAIRS_WARPS_BY_COLUMNS = dt, wc
        fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
        out = fn()
        torch.cuda.synchronize()
        chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
        if chk.failure():
            print(kv, b, who, "CHECK FAILED", chk.failure())
            continue
        calls = timeline(fn)
        n = statistics.mode(len(c) for c in calls)
        calls = [c for c in calls if len(c) == n]
        for j in range(n):
            s = statistics.median(c[j][1] for c in calls)
            d = statistics.median(c[j][2] for c in calls)
            print(f"{kv:10} {b:>2} {who:8} {short(calls[0][j][0]):38} {s:6.1f} {d:6.1f} {s + d:6.1f}")
        span = statistics.median(c[-1][1] + c[-1][2] for c in calls)
        print(f"{kv:10} {b:>2} {who:8} {'span (' + str(len(calls)) + ' calls)':38} {'':6} {'':6} {span:6.1f}")
ws._PARTIALS, smd._PAIRS_WARPS_BY_COLUMNS = torch.float32, False
