"""Is the swap-in's growth with the host pool the translation of host addresses, and does a
translation flush make every pool size read cold? The zero-copy gather of 9824 random 656-byte
rows (the context bench's misses a step at batch 32) from registered host pools of 0.32 / 1.28 /
2.56 GiB, the coordinator's default copy launch, four ways: the same rows every call (warm),
a different row set each call from 24 (fresh: one pool read step after step), and both of
those with ``HostTranslationFlusher`` (4 GiB) before each call; then the same rows with
flushers of 0.5 / 1 / 2 / 8 GiB at the smallest pool (does the cold level saturate?). Every
call's rows checked against the pool's device mirror. CUDA events, L2 flushed, median of 24.
Usage: python3 tlb33.py [ROUNDS]"""
import sys
import time

import numpy as np
import torch

from harness.bench.swap_in import GatherCase, HostPool, evict_host_caches, gather_engine
from harness.timing import HostTranslationFlusher, time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
ROW, N, SETS = 656, 9824, 24
dev = torch.device("cuda")
engine = gather_engine("default", dev)
flushers = {gib: HostTranslationFlusher(dev, int(gib * (1 << 30))) for gib in (0.5, 1, 2, 4, 8)}
for f in flushers.values():        # the flush itself: its time and that it read every page
    f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    f()
    torch.cuda.synchronize()
    words = f.host.tensor.view(torch.int32).view(f.n_pages, -1)[:, 0]
    print(f"flusher {f.n_pages * 4096 / 2**30:.1f} GiB: {1e3 * (time.perf_counter() - t0):.2f} ms,"
          f" sum {'ok' if f.last_sum == int(words.sum()) else 'BAD'}", flush=True)
rows = []
for gib in (0.32, 1.28, 2.56):
    pool_rows = int(gib * (1 << 30)) // ROW
    pool = HostPool(pool_rows, ROW, "registered", dev, seed=pool_rows)
    evict_host_caches()
    rng = np.random.default_rng(pool_rows)
    cases = [GatherCase(pool, rng.choice(pool_rows, N, replace=False), rng, dev)
             for _ in range(SETS)]
    modes = [("warm", None, False), ("fresh", None, True), ("warm+flush4", 4, False),
             ("fresh+flush4", 4, True)]
    if gib == 0.32:
        modes += [(f"warm+flush{g}", g, False) for g in (0.5, 1, 2, 8)]
    for r in range(ROUNDS):
        for name, fl, fresh in modes:
            it = iter(range(10 ** 9))
            cur = [cases[0]]

            def setup():
                c = cur[0] = cases[next(it) % SETS] if fresh else cases[0]
                c.setup()
                if fl is not None:
                    flushers[fl]()
            bad = []

            def call():
                engine.copy(cur[0].pool, cur[0].dev, cur[0].plan, 1, 1)
            t = time_fn(call, dev, warmup=3, repeats=24, setup=setup)
            for c in (cases if fresh else cases[:1]):   # each case's last use was a copy
                if c.check().failure():
                    bad.append(c)
            rows.append((gib, name, r, t.median_us, t.p10_us, t.p90_us, "BAD" if bad else "ok"))
            print(rows[-1], flush=True)
    del cases
    pool.close()
print(f"{'pool_GiB':>8} {'mode':14} {'round':>5} {'median_us':>9} {'p10':>7} {'p90':>7} check")
for r in rows:
    print(f"{r[0]:8.2f} {r[1]:14} {r[2]:5d} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]}")
