"""Where the CUDA resolve's all-hit time goes (device call e3).

Builds an instrumented copy of backends/kernels/swap_in_resolve.cu (block 0, thread 0 writes
%globaltimer and clock64 at each phase boundary into a __device__ array; the copy lives in
/tmp, the project's source is untouched), swaps it into a coordinator of the swap_in_peer
all-hit case (top_k 2048, 4096 hot slots, seq 6000, B 64 / 1), checks the output against the
uninstrumented library's, and times (harness.timing.time_fn: cold L2, launch shield, median):
the resolve (cold and warm L2), and empty kernels launched with the resolve's launch shape
(1024 threads, 64 KB dynamic shared memory), 1024 threads without shared memory, and one warp.
Then prints the phase boundaries of one cold call (ns from the kernel's entry).
"""
import ctypes
import subprocess
from pathlib import Path

import numpy as np
import torch

from backends.kernels.swap_in import ResolveLaunch
from backends.kernels.swap_in_cuda import RESOLVE_CU, CudaResolve, nvcc_flags
from harness.bench.swap_in import FULL
from harness.bench.swap_in_peer import ordered_coordinator
from harness.timing import L2Flusher, time_fn

PREAMBLE = r'''
__device__ long long g_trace[16];
__device__ __forceinline__ long long gtime() {
  long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
#define TR(n) if (blockIdx.x == 0 && threadIdx.x == 0) { g_trace[n] = gtime(); g_trace[8 + n] = clock64(); }
'''
MARKS = [
    ("  const int b = blockIdx.x, t = threadIdx.x, T = blockDim.x;\n", "after", 0),
    ("  __syncthreads();                    // table cleared, slot -> unit in shared memory\n", "after", 1),
    ("  // ---- 2. the walk", "before", 2),
    ("  __syncthreads();\n\n  // ---- 3.", "sync", 3),
    ("  // ---- 4. the i-th miss", "before", 4),
    ("  // ---- 6. each entry's device row", "before", 5),
    ("  // ---- 7. counts", "before", 6),
    ("    cnt[6] = a.page_mode ? (is_long ? n_uniq : 0) : 0;\n  }\n", "after", 7),
]
NAMES = ["entry", "inputs loaded", "units inserted", "walk done", "counts + hit scan",
         "misses + LRU", "rows written", "counts written"]
EXTRA = r'''
__global__ void empty_kernel(int x) { if (x == 12345) g_trace[15] = x; }
extern "C" int trace_read(long long* out) {
  return (int)cudaMemcpyFromSymbol(out, g_trace, sizeof(long long) * 16); }
extern "C" int empty_launch(int threads, int smem, void* stream) {
  if (smem > 48 * 1024) cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  empty_kernel<<<1, threads, smem, (cudaStream_t)stream>>>(0);
  return (int)cudaGetLastError(); }
'''


def instrumented_library() -> Path:
    src = RESOLVE_CU.read_text()
    src = src.replace("namespace {\n", PREAMBLE + "namespace {\n", 1)
    for text, where, n in MARKS:
        assert src.count(text) == 1, text
        mark = f"  TR({n})\n"
        if where == "after":
            src = src.replace(text, text + mark)
        elif where == "before":
            src = src.replace(text, mark + text)
        else:
            head = "  __syncthreads();\n"
            src = src.replace(text, head + mark + text[len(head):])
    src += EXTRA
    d = Path("/tmp/resolve_diag")
    d.mkdir(exist_ok=True)
    cu, lib = d / "resolve_diag.cu", d / "libresolve_diag.so"
    cu.write_text(src)
    subprocess.run(["nvcc", *nvcc_flags("90a"), str(cu), "-o", str(lib)], check=True,
                   capture_output=True)
    return lib


def main():
    dev = torch.device("cuda")
    lib = instrumented_library()
    diag = CudaResolve(lib)
    extra = ctypes.CDLL(str(lib))
    extra.empty_launch.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    extra.trace_read.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
    sz = FULL
    B, K, D, S = sz.batch, sz.top_k, sz.device_buffer_size, sz.seq_len_b
    c = ordered_coordinator(sz, dev, B, S, 100, "upstream", ResolveLaunch(kernel="cuda"))
    rng = np.random.default_rng(5)
    sel = np.stack([np.concatenate([rng.permutation(D)[:K - 1], [S - 1]]) for _ in range(B)])
    req = torch.arange(B, dtype=torch.int32, device=dev)
    seq = torch.full((B,), S, dtype=torch.int32, device=dev)
    topk = torch.from_numpy(sel.astype(np.int32)).to(dev)
    ref = c.resolve_selection(req, seq, topk, 0).clone()
    assert int(c.counts[0, :B, 1].sum()) == 0
    plain = c.cuda_resolve
    c.cuda_resolve = diag
    assert torch.equal(c.resolve_selection(req, seq, topk, 0), ref)
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for name, fn, cold in (
            ("resolve B64 (instrumented)", lambda: c.resolve_selection(req, seq, topk, 0), True),
            ("resolve B1 (instrumented)", lambda: c.resolve_selection(req[:1], seq[:1], topk[:1], 0), True),
            ("resolve B64 warm L2", lambda: c.resolve_selection(req, seq, topk, 0), False),
            ("resolve B1 warm L2", lambda: c.resolve_selection(req[:1], seq[:1], topk[:1], 0), False),
            ("empty 1024 thr, 64 KB smem", lambda: extra.empty_launch(1024, 65536, stream), True),
            ("empty 1024 thr, no smem", lambda: extra.empty_launch(1024, 0, stream), True),
            ("empty 32 thr, no smem", lambda: extra.empty_launch(32, 0, stream), True)):
        st = time_fn(fn, dev, warmup=5, repeats=40, cold_l2=cold)
        rows.append((name, st.median_us, st.p10_us, st.p90_us))
    c.cuda_resolve = plain
    st = time_fn(lambda: c.resolve_selection(req, seq, topk, 0), dev, warmup=5, repeats=40)
    rows.append(("resolve B64 (plain library)", st.median_us, st.p10_us, st.p90_us))
    c.cuda_resolve = diag
    print(f"{'what':32s} {'median':>8s} {'p10':>8s} {'p90':>8s}  (us)")
    for r in rows:
        print(f"{r[0]:32s} {r[1]:8.2f} {r[2]:8.2f} {r[3]:8.2f}")
    flush = L2Flusher(dev)
    for n in (B, 1):
        for cold in (True, False):
            traces = []
            for _ in range(9):
                if cold:
                    flush()
                torch.cuda._sleep(1_000_000)
                c.resolve_selection(req[:n], seq[:n], topk[:n], 0)
                torch.cuda.synchronize()
                buf = (ctypes.c_longlong * 16)()
                assert extra.trace_read(buf) == 0
                traces.append(list(buf))
            a = np.array(traces, dtype=np.float64)
            a[:, :8] -= a[:, :1]
            a[:, 8:] -= a[:, 8:9]
            t = np.median(a, axis=0)
            print(f"phases, B{n}, {'cold' if cold else 'warm'} L2 (block 0, median of 9): ns since "
                  "entry (globaltimer) / cycles since entry (clock64)")
            for i, name in enumerate(NAMES):
                print(f"  {name:20s} {t[i]:9.0f} ns {t[8 + i]:9.0f} cyc")


if __name__ == "__main__":
    main()
