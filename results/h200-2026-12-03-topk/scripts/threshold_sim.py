"""numpy replica of the top-k's windowed sample threshold (``_row_threshold`` /
``_windowed_rank_key`` in backends/kernels/topk.py: a strided 2048-value sample, the first
bisection probe whose sample count lies in the window) on i.i.d. rows, standard normal or with a
random scale and offset per row; prints the share of rows whose candidate count falls below k
(the exact whole-row fallback), above 4096 (the half block of ``small_select`` no longer fits)
and above 8192 (over the default capacity). BENCHMARKS.md 6l.

    python3 results/h200-2026-12-03-topk/scripts/threshold_sim.py 32768 1500
    python3 results/h200-2026-12-03-topk/scripts/threshold_sim.py 131072 600
"""
import numpy as np, math, sys
from fractions import Fraction as F
def okey(x):
    x = np.where(x == 0, np.float32(0), x).astype(np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    return np.where(b >= 2**31, 0xFFFFFFFF - b, b + 2**31).astype(np.uint64)
def windowed(key, r_lo, r_hi):
    kmax, kmin = key.max(), key.min()
    diff = int(kmax ^ kmin)
    nbits = 0 if diff == 0 else diff.bit_length()
    T = int(kmax) & ~((1 << nbits) - 1)
    bit = 1 << (nbits - 1) if nbits > 0 else 0
    steps = nbits
    while steps > 0:
        cand = T | bit
        cnt = int((key >= cand).sum())
        if cnt >= r_lo: T = cand
        steps = 0 if (r_lo <= cnt <= r_hi) else steps - 1
        bit >>= 1
    return T
def sim(L, k, tf, lo, hi, rows, S=2048, seed=0, scaled=False):
    rng = np.random.default_rng(seed)
    target = math.ceil(F(tf) * k)
    r = min(max((S * target + L - 1) // L, 1), S)
    lo, hi = F(lo).limit_denominator(64), F(hi).limit_denominator(64)
    r_lo = max((lo.numerator * r) // lo.denominator, 1); r_hi = min((hi.numerator * r + hi.denominator - 1) // hi.denominator, S)
    counts = []
    pos = (np.arange(S, dtype=np.int64) * L) // S
    for i in range(rows):
        x = rng.standard_normal(L).astype(np.float32)
        if scaled: x = x * np.float32(rng.uniform(0.1, 30)) + np.float32(rng.uniform(-50, 50))
        key = okey(x)
        T = windowed(key[pos], r_lo, r_hi)
        counts.append(int((key >= T).sum()))
    c = np.array(counts)
    return c
if __name__ == "__main__":
    L = int(sys.argv[1]); rows = int(sys.argv[2])
    for name, tf, lo, hi in [("default", 2.0, 0.75, 1.5), ("t1.5_w7/8", 1.5, 0.875, 1.125), ("t1.5_w1", 1.5, 1.0, 1.125), ("t1.75_w0.8", 1.75, 0.8, 1.125)]:
        for scaled in (False, True):
            c = sim(L, 2048, tf, lo, hi, rows, seed=1 + scaled, scaled=scaled)
            print(f"L={L} {name:12s} scaled={scaled}: fallback(<k) {np.mean(c < 2048)*100:.2f}%  >4096 {np.mean(c > 4096)*100:.2f}%  >8192 {np.mean(c>8192)*100:.2f}%  min {c.min()} median {int(np.median(c))} max {c.max()}", flush=True)
