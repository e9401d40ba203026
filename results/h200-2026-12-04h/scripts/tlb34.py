"""Does the host pool's page size change the cold cost of its translations? tlb33.py's gather
(9824 random 656-byte rows, the coordinator's default copy launch) from pools of 0.32 and 1.28
GiB in registered (4 KiB pages), THP (2 MiB), hugetlb 2 MiB and hugetlb 1 GiB memory, the same
rows every call, without (warm) and with a 4 GiB ``HostTranslationFlusher`` before each call
(cold). Every call's rows checked against the pool's device mirror. CUDA events, L2 flushed,
median of 24. Needs 2 free 1 GiB and 700 free 2 MiB huge pages. Usage: python3 tlb34.py [ROUNDS]"""
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
flushers = {4: HostTranslationFlusher(dev, 4 << 30)}
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
for gib, alloc in [(g, a) for g in (0.32, 1.28)
                   for a in ("registered", "thp", "hugetlb_2m", "hugetlb_1g")]:
    pool_rows = int(gib * (1 << 30)) // ROW
    pool = HostPool(pool_rows, ROW, alloc, dev, seed=pool_rows)
    evict_host_caches()
    rng = np.random.default_rng(pool_rows)
    cases = [GatherCase(pool, rng.choice(pool_rows, N, replace=False), rng, dev)
             for _ in range(1)]
    modes = [(f"{alloc} warm", None, False), (f"{alloc} flush4", 4, False)]
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
print(f"{'pool_GiB':>8} {'mode':18} {'round':>5} {'median_us':>9} {'p10':>7} {'p90':>7} check")
for r in rows:
    print(f"{r[0]:8.2f} {r[1]:18} {r[2]:5d} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]}")
