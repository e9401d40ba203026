// dsa-harness: the HiSparse swap-in resolve in the upstream LRU order, as one CUDA block per
// batch row (our code). Same arguments, results and semantics as the Triton
// `resolve_swap_in_kernel` with UPSTREAM (backends/kernels/swap_in.py, whose docstring defines
// units, hot slots, the miss plan and the counts); built by backends/kernels/swap_in_cuda.py.
//
// What differs is where the join lives. The Triton resolve stamps every selected unit and every
// held unit into a context-sized table in global memory and reads it back (a global round trip
// and, cold, one scattered sector a stamp); here the selection's units go into a hash table in
// shared memory (linear probing, atomicCAS; each unit's first entry by atomicMin), the walk over
// the hot buffer looks its units up there, and the CTA-wide counts and ranks are warp-shuffle
// scans. Entry i of the selection is thread i / EPT's (EPT consecutive entries a thread), walk
// lane l is thread l / LPT's.
#include <cuda_runtime.h>
#include <cstdint>

// Mirrored by backends/kernels/swap_in_cuda.py (_ResolveArgs); its size is checked at load.
struct ResolveArgs {
  const void* req_idx;        // [B] int32 or int64 (req64)
  const void* seq_lens;       // [B] int32 or int64 (seq64)
  const int32_t* topk;        // [B, topk_stride] request-local positions, -1 padded
  int32_t* slot_unit;         // [max_reqs, C] this layer
  int32_t* lru;               // [max_reqs, C] this layer
  const int32_t* host_table;  // [max_reqs, host_table_stride]
  int32_t* out;               // [B, out_stride]
  int32_t* plan;              // [B, plan_stride]
  int64_t* counts;            // [B, counts_stride]
  int64_t topk_stride, host_table_stride, out_stride, plan_stride, counts_stride;
  int64_t batch, K, C, D, slots_per_req, row_bytes, max_misses, n_units, unit, page;
  int64_t hash_size;          // power of two >= 2 K: entries of the shared hash table
  int32_t req64, seq64, page_mode, launch_dependents, threads, pad_;
  void* stream;
};

namespace {

constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int warp_inclusive_scan(int x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(kFull, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// Exclusive prefix of each thread's `local` over the block (thread order) and the block's total.
// s_warp: 33 ints of shared memory, free on entry and on return.
__device__ __forceinline__ int block_exclusive_scan(int local, int* s_warp, int& total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int x = warp_inclusive_scan(local);
  if (lane == 31) s_warp[w] = x;
  __syncthreads();
  if (w == 0) {
    int y = warp_inclusive_scan(lane < nw ? s_warp[lane] : 0);
    if (lane < nw) s_warp[lane] = y;
    if (lane == nw - 1) s_warp[32] = y;
  }
  __syncthreads();
  const int prefix = (w ? s_warp[w - 1] : 0) + x - local;
  total = s_warp[32];
  __syncthreads();
  return prefix;
}

__device__ __forceinline__ uint32_t hash_of(int32_t u, uint32_t mask) {
  return ((uint32_t)u * 2654435761u >> 7) & mask;
}

// Slot of unit u (>= 0) in the table, inserted if absent (`inserted`: by this call).
__device__ __forceinline__ int hash_insert(int32_t* key, int32_t u, uint32_t mask,
                                           bool& inserted) {
  uint32_t h = hash_of(u, mask);
  while (true) {
    const int32_t prev = atomicCAS(&key[h], -1, u);
    if (prev == -1 || prev == u) {
      inserted = prev == -1;
      return (int)h;
    }
    h = (h + 1) & mask;
  }
}

// Slot of unit u (>= 0), or -1 when absent.
__device__ __forceinline__ int hash_find(const int32_t* key, int32_t u, uint32_t mask) {
  uint32_t h = hash_of(u, mask);
  while (true) {
    const int32_t k = key[h];
    if (k == u) return (int)h;
    if (k == -1) return -1;
    h = (h + 1) & mask;
  }
}

__device__ __forceinline__ int64_t load_index(const void* p, int is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(p)[i] : (int64_t) static_cast<const int32_t*>(p)[i];
}

template <int EPT, int LPT>
__global__ void __launch_bounds__(1024) resolve_upstream_kernel(const ResolveArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (a.launch_dependents) cudaTriggerProgrammaticLaunchCompletion();
#endif
  extern __shared__ int32_t smem[];
  __shared__ int s_warp[33];
  __shared__ int s_red[3][32];
  __shared__ int s_dup;              // some unit was selected twice
  const int HS = (int)a.hash_size;
  const uint32_t mask = (uint32_t)HS - 1;
  const int C = (int)a.C, K = (int)a.K, UNIT = (int)a.unit, PAGE = (int)a.page;
  int32_t* s_key = smem;             // [HS] unit, -1 empty
  int32_t* s_first = s_key + HS;     // [HS] the unit's first entry
  int32_t* s_slot = s_first + HS;    // [HS] the unit's hot slot (held, then the miss's)
  int32_t* s_su = s_slot + HS;       // [C] slot -> unit; later the evictable slots by rank

  const int b = blockIdx.x, t = threadIdx.x, T = blockDim.x;
  const int32_t req = (int32_t)load_index(a.req_idx, a.req64, b);
  const int32_t seq = (int32_t)load_index(a.seq_lens, a.seq64, b);
  const int32_t base = req * (int32_t)a.slots_per_req;
  const int64_t row = (int64_t)req * C;

  for (int h = t; h < HS; h += T) {
    s_key[h] = -1;
    s_slot[h] = -1;
  }
  if (t == 0) s_dup = 0;

  // ---- the selection's entries: units, the newest unit of a long request -----------------
  const bool is_long = seq > (int32_t)a.D;
  const int32_t newest_unit = is_long ? (seq - 1) / UNIT : -2;
  int32_t pos[EPT], unit[EPT];
  bool valid[EPT], live[EPT], newest[EPT];
  int newest_cnt = 0;
#pragma unroll
  for (int j = 0; j < EPT; ++j) {
    const int i = t * EPT + j;
    pos[j] = i < K ? a.topk[(int64_t)b * a.topk_stride + i] : -1;
    valid[j] = pos[j] >= 0 && pos[j] < seq;
    unit[j] = valid[j] ? pos[j] / UNIT : -1;
    newest[j] = valid[j] && unit[j] == newest_unit;
    live[j] = valid[j] && !newest[j] && unit[j] < a.n_units;
    newest_cnt += newest[j];
  }
  // the hot buffer's rows, every load issued before the first use (one round trip)
  int32_t wslot[LPT], su[LPT];
#pragma unroll
  for (int j = 0; j < LPT; ++j) {
    const int l = t * LPT + j;
    wslot[j] = l < C ? a.lru[row + l] : 0;
    su[j] = l < C ? a.slot_unit[row + l] : -1;
  }
#pragma unroll
  for (int j = 0; j < LPT; ++j)
    if (t * LPT + j < C) s_su[t * LPT + j] = su[j];
  __syncthreads();                    // table cleared, slot -> unit in shared memory

  // ---- 1. the selection's units into the table (each unit's first entry) ---------------
  // The entry that inserts a unit writes its index; an entry that finds its unit there flags
  // a repeat, and then every entry of a repeated unit takes the minimum (its first entry).
  int hk[EPT];
  bool repeat[EPT];
#pragma unroll
  for (int j = 0; j < EPT; ++j) {
    hk[j] = -1;
    repeat[j] = false;
    if (live[j]) {
      bool inserted;
      hk[j] = hash_insert(s_key, unit[j], mask, inserted);
      if (inserted) s_first[hk[j]] = t * EPT + j;
      repeat[j] = !inserted;
      if (!inserted) s_dup = 1;
    }
  }
  int32_t wunit[LPT];
#pragma unroll
  for (int j = 0; j < LPT; ++j) {
    const int l = t * LPT + j;
    wunit[j] = (l < C && wslot[j] >= 0 && wslot[j] < C) ? s_su[wslot[j]] : -1;
  }
  __syncthreads();
  if (s_dup) {                        // block-uniform
#pragma unroll
    for (int j = 0; j < EPT; ++j)
      if (repeat[j]) atomicMin(&s_first[hk[j]], t * EPT + j);
    __syncthreads();
  }

  // ---- 2. the walk: a slot is a hit when its unit is selected; the unit learns its slot ----
  bool hit[LPT];
  int hits_local = 0;
#pragma unroll
  for (int j = 0; j < LPT; ++j) {
    const int l = t * LPT + j;
    hit[j] = false;
    if (l < C && wunit[j] >= 0 && wunit[j] < a.n_units) {
      const int h = hash_find(s_key, wunit[j], mask);
      if (h >= 0) {
        hit[j] = true;
        s_slot[h] = wslot[j];
      }
    }
    hits_local += hit[j];
  }
  __syncthreads();

  // ---- 3. counts: unique units, held ones, the newest unit --------------------------------
  bool first[EPT], held[EPT];
  int c_uniq = 0, c_held = 0;
#pragma unroll
  for (int j = 0; j < EPT; ++j) {
    first[j] = live[j] && s_first[hk[j]] == t * EPT + j;
    held[j] = live[j] && s_slot[hk[j]] >= 0;
    c_uniq += first[j];
    c_held += first[j] && held[j];
  }
  {
    const int lane = t & 31, w = t >> 5;
    const int r0 = __reduce_add_sync(kFull, c_uniq), r1 = __reduce_add_sync(kFull, c_held),
              r2 = __reduce_add_sync(kFull, newest_cnt);
    if (lane == 0) { s_red[0][w] = r0; s_red[1][w] = r1; s_red[2][w] = r2; }
  }
  __syncthreads();
  // every warp sums the warps' partial counts (lane w reads warp w's)
  const int lw = t & 31;
  const bool in = lw < (T >> 5);
  const int n_uniq = __reduce_add_sync(kFull, in ? s_red[0][lw] : 0);
  const int n_held = __reduce_add_sync(kFull, in ? s_red[1][lw] : 0);
  const int n_newest = __reduce_add_sync(kFull, in ? s_red[2][lw] : 0);
  const bool overflow = is_long && n_uniq > C;
  const bool do_long = is_long && n_uniq <= C && n_uniq > 0;
  const int n_hit = do_long ? n_held : 0;
  const int n_miss = do_long ? n_uniq - n_held : 0;
  const int n_evict = do_long ? C - n_hit : 0;

  // per walk lane: hits up to and including it (walk order), its rank among the evictables
  int unused;
  int hit_cum[LPT], ev_rank[LPT];
  {
    int hc = block_exclusive_scan(hits_local, s_warp, unused);
#pragma unroll
    for (int j = 0; j < LPT; ++j) {
      hc += hit[j];
      hit_cum[j] = hc;
      ev_rank[j] = t * LPT + j - hc;
    }
  }

  // ---- 4. the i-th miss (entry order) takes the i-th evictable slot (walk order) ---------
  if (n_miss > 0) {
    bool miss[EPT];
    int miss_local = 0;
#pragma unroll
    for (int j = 0; j < EPT; ++j) {
      miss[j] = first[j] && !held[j];
      miss_local += miss[j];
    }
    const int miss_before = block_exclusive_scan(miss_local, s_warp, unused);
    int32_t* s_ev = s_su;              // slot -> unit is no longer read
#pragma unroll
    for (int j = 0; j < LPT; ++j)
      if (t * LPT + j < C && !hit[j] && ev_rank[j] < n_miss) s_ev[ev_rank[j]] = wslot[j];
    __syncthreads();
    int mr = miss_before;
    int32_t* plan = a.plan + (int64_t)b * a.plan_stride;
    const int32_t* host_row = a.host_table + (int64_t)req * a.host_table_stride;
#pragma unroll
    for (int j = 0; j < EPT; ++j) {
      if (miss[j]) {
        const int32_t ms = s_ev[mr];
        s_slot[hk[j]] = ms;
        a.slot_unit[row + ms] = unit[j];
        const int32_t first_pos = unit[j] * UNIT;
        const int32_t host_page = host_row[first_pos / PAGE];
        plan[1 + mr] = host_page * PAGE + first_pos % PAGE;
        plan[1 + a.max_misses + mr] = base + ms * UNIT;
        ++mr;
      }
    }
    __syncthreads();
  }
  if (t == 0) a.plan[(int64_t)b * a.plan_stride] = n_miss;

  // ---- 5. new LRU: stale evictables, the misses' slots, the hits (walk order) -----------
  if (do_long) {
    const int n_kept = n_evict - n_miss;
#pragma unroll
    for (int j = 0; j < LPT; ++j) {
      const int l = t * LPT + j;
      const int new_at = hit[j] ? n_evict + hit_cum[j] - 1
                                : (ev_rank[j] < n_miss ? n_kept + ev_rank[j] : ev_rank[j] - n_miss);
      if (l < C && new_at != l) a.lru[row + new_at] = wslot[j];   // place l holds wslot[j]
    }
  }

  // ---- 6. each entry's device row -------------------------------------------------------
#pragma unroll
  for (int j = 0; j < EPT; ++j) {
    const int i = t * EPT + j;
    if (i >= K) continue;
    const int32_t slot = (live[j] && do_long) ? s_slot[hk[j]] : -1;
    int32_t res = base + max(slot, 0) * UNIT + pos[j] % UNIT;
    if (newest[j]) res = a.page_mode ? base + (int32_t)a.D + pos[j] % PAGE : base + (int32_t)a.D;
    if (overflow) res = -1;
    if (!is_long) res = base + pos[j];
    a.out[(int64_t)b * a.out_stride + i] = valid[j] ? res : -1;
  }

  // ---- 7. counts ----------------------------------------------------------------------
  if (t == 0) {
    const int64_t hits = is_long ? (overflow ? 0 : n_hit + (n_newest > 0)) : n_uniq;
    const int64_t tokens = (int64_t)n_miss * UNIT;
    int64_t* cnt = a.counts + (int64_t)b * a.counts_stride;
    cnt[0] = hits;
    cnt[1] = n_miss;
    cnt[2] = tokens;
    cnt[3] = a.page_mode ? n_miss : 0;
    cnt[4] = tokens * a.row_bytes;
    cnt[5] = overflow;
    cnt[6] = a.page_mode ? (is_long ? n_uniq : 0) : 0;
  }
}

template <int EPT, int LPT>
const void* kernel_ptr() { return reinterpret_cast<const void*>(resolve_upstream_kernel<EPT, LPT>); }

// EPT in {1, 2, 4, 8}, LPT in {1, 2, 4, 8, 16}: index (log2 EPT) * 5 + log2 LPT
const void* const kKernels[] = {
  kernel_ptr<1, 1>(), kernel_ptr<1, 2>(), kernel_ptr<1, 4>(), kernel_ptr<1, 8>(), kernel_ptr<1, 16>(),
  kernel_ptr<2, 1>(), kernel_ptr<2, 2>(), kernel_ptr<2, 4>(), kernel_ptr<2, 8>(), kernel_ptr<2, 16>(),
  kernel_ptr<4, 1>(), kernel_ptr<4, 2>(), kernel_ptr<4, 4>(), kernel_ptr<4, 8>(), kernel_ptr<4, 16>(),
  kernel_ptr<8, 1>(), kernel_ptr<8, 2>(), kernel_ptr<8, 4>(), kernel_ptr<8, 8>(), kernel_ptr<8, 16>(),
};

int log2_of(int v) { int r = 0; while ((1 << r) < v) ++r; return (1 << r) == v ? r : -1; }

int kernel_index(int ept, int lpt) {
  const int e = log2_of(ept), l = log2_of(lpt);
  return (e < 0 || e > 3 || l < 0 || l > 4) ? -1 : e * 5 + l;
}

// Dynamic shared memory each instance was opened up to (per process, per device: the
// attribute is set only when a launch needs more, so a launch inside CUDA-graph capture,
// after a warm-up call, makes no attribute call).
constexpr int kMaxDevices = 64;
int g_smem_set[kMaxDevices][20] = {};

}  // namespace

extern "C" {

int resolve_args_size() { return (int)sizeof(ResolveArgs); }

int resolve_dynamic_smem(int64_t hash_size, int64_t C) { return (int)((3 * hash_size + C) * 4); }

// One launch: `ept` entries and `lpt` walk lanes a thread, a.threads threads a block, a.batch
// blocks on a.stream. 0 or a cudaError_t; -1 for an (ept, lpt) not compiled.
int resolve_launch(const ResolveArgs* a, int ept, int lpt, int device) {
  const int idx = kernel_index(ept, lpt);
  if (idx < 0 || device < 0 || device >= kMaxDevices) return -1;
  const void* k = kKernels[idx];
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return (int)e;
  const int smem = resolve_dynamic_smem(a->hash_size, a->C);
  if (smem > 48 * 1024 && smem > g_smem_set[device][idx]) {
    e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    g_smem_set[device][idx] = smem;
  }
  void* params[] = {const_cast<ResolveArgs*>(a)};
  e = cudaLaunchKernel(k, dim3((unsigned)a->batch), dim3((unsigned)a->threads), params,
                       (size_t)smem, static_cast<cudaStream_t>(a->stream));
  return (int)e;
}

// numRegs, static smem, local bytes, max threads a block of one instance; 0 or a cudaError_t
int resolve_kernel_attrs(int ept, int lpt, int64_t* out) {
  const int idx = kernel_index(ept, lpt);
  if (idx < 0) return -1;
  const void* k = kKernels[idx];
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, k);
  if (e != cudaSuccess) return (int)e;
  out[0] = attr.numRegs;
  out[1] = (int64_t)attr.sharedSizeBytes;
  out[2] = (int64_t)attr.localSizeBytes;
  out[3] = attr.maxThreadsPerBlock;
  return 0;
}

const char* resolve_error_string(int code) {
  return code == -1 ? "no kernel compiled for this (entries, lanes) a thread, or device index"
                      " out of range"
                    : cudaGetErrorString((cudaError_t)code);
}

}  // extern "C"
