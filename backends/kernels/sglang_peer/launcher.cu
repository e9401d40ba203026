// dsa-harness: plain C launcher for SGLang's HiSparse swap-in kernel (our code; the upstream
// header is staged from the sglang package at build time and included unchanged).
// build.py copies this file next to the library and compiles it with the staged headers;
// PEER_BLOCK_SIZE, PEER_TOP_K and PEER_HOT_BUFFER come from its -D flags.
#include "kvcacheio/hisparse.cuh"

#include <cuda_runtime.h>
#include <cstdint>

// External linkage: the extern "C" entry point takes it (an anonymous-namespace type would
// give that entry point internal linkage and drop it from the library).
struct PeerArgs {
  const int32_t* top_k;
  int32_t* device_buffer_tokens;
  const int64_t* host_cache_locs;
  const int32_t* device_buffer_locs;
  const void* host_cache;      // host pointer of pinned memory (mapped below)
  void* device_buffer;
  int32_t* top_k_device_locs;
  const void* req_pool_indices;
  const void* seq_lens;
  int16_t* lru_slots;
  const int32_t* num_real_reqs;
  int64_t batch;
  int64_t buffer_stride_0;
  int64_t host_stride;
  int64_t lru_slot_stride_0;
  int64_t top_k_stride;
  int64_t top_k_device_locs_stride;
  int64_t item_size_bytes;
  int64_t* miss_src;
  int32_t* miss_dst;
  int32_t* miss_count;
  int64_t plan_stride;
  void* stream;
};

namespace {
constexpr int kBlock = PEER_BLOCK_SIZE;
constexpr int kTopK = PEER_TOP_K;
constexpr int kHot = PEER_HOT_BUFFER;
constexpr size_t kSmem = sglang::SmemLayout<kTopK, kHot>::BYTES;

template <bool Record, bool SkipIO, typename SeqT, typename RidT>
constexpr auto kernel_of() {
  return sglang::load_cache_to_device_buffer_kernel<kBlock, kTopK, kHot, /*IsMLA=*/true,
      /*IsDsv4Layout=*/false, /*SPARSE_BLOCK_SIZE=*/1, /*TopKIsBlocks=*/false, Record, SkipIO,
      SeqT, RidT>;
}

const void* host_to_device(const void* host) {
  void* dev = nullptr;
  if (cudaHostGetDevicePointer(&dev, const_cast<void*>(host), 0) != cudaSuccess) {
    (void)cudaGetLastError();  // not mapped by this runtime: UVA identity, as our Triton copy
    return host;
  }
  return dev;
}

template <bool Record, bool SkipIO, typename SeqT, typename RidT>
int launch(const PeerArgs& a) {
  auto k = kernel_of<Record, SkipIO, SeqT, RidT>();
  if constexpr (kSmem > 48u * 1024u) {
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem);
    if (e != cudaSuccess) return (int)e;
  }
  k<<<(unsigned)a.batch, kBlock, kSmem, static_cast<cudaStream_t>(a.stream)>>>(
      a.top_k, a.device_buffer_tokens, a.host_cache_locs, a.device_buffer_locs,
      host_to_device(a.host_cache), nullptr, a.device_buffer, nullptr, a.top_k_device_locs,
      static_cast<const RidT*>(a.req_pool_indices), static_cast<const SeqT*>(a.seq_lens),
      a.lru_slots, a.num_real_reqs, a.buffer_stride_0, a.host_stride, a.lru_slot_stride_0,
      a.top_k_stride, a.top_k_device_locs_stride, /*page_size=*/1, a.item_size_bytes,
      a.miss_src, a.miss_dst, a.miss_count, a.plan_stride);
  return (int)cudaGetLastError();
}

template <bool Record, bool SkipIO>
int by_dtype(const PeerArgs& a, int seq64, int rid64) {
  if (seq64 && rid64) return launch<Record, SkipIO, int64_t, int64_t>(a);
  if (seq64) return launch<Record, SkipIO, int64_t, int32_t>(a);
  if (rid64) return launch<Record, SkipIO, int32_t, int64_t>(a);
  return launch<Record, SkipIO, int32_t, int32_t>(a);
}

template <bool Record, bool SkipIO>
const void* kernel_ptr(int seq64, int rid64) {
  if (seq64 && rid64) return reinterpret_cast<const void*>(kernel_of<Record, SkipIO, int64_t, int64_t>());
  if (seq64) return reinterpret_cast<const void*>(kernel_of<Record, SkipIO, int64_t, int32_t>());
  if (rid64) return reinterpret_cast<const void*>(kernel_of<Record, SkipIO, int32_t, int64_t>());
  return reinterpret_cast<const void*>(kernel_of<Record, SkipIO, int32_t, int32_t>());
}
}  // namespace

extern "C" {

// block, top_k, hot buffer, dynamic smem bytes, sizeof(PeerArgs) (checked against ctypes)
void peer_config(int64_t* out) {
  out[0] = kBlock;
  out[1] = kTopK;
  out[2] = kHot;
  out[3] = (int64_t)kSmem;
  out[4] = (int64_t)sizeof(PeerArgs);
}

int peer_set_device(int device) { return (int)cudaSetDevice(device); }

int peer_swap_in(int record, int skip_io, int seq64, int rid64, const PeerArgs* a) {
  if (record) return skip_io ? by_dtype<true, true>(*a, seq64, rid64) : by_dtype<true, false>(*a, seq64, rid64);
  return skip_io ? by_dtype<false, true>(*a, seq64, rid64) : by_dtype<false, false>(*a, seq64, rid64);
}

// numRegs, sharedSizeBytes (static), localSizeBytes, maxThreadsPerBlock, binaryVersion, dynamic smem
int peer_kernel_attrs(int record, int skip_io, int seq64, int rid64, int64_t* out) {
  const void* k = record ? (skip_io ? kernel_ptr<true, true>(seq64, rid64) : kernel_ptr<true, false>(seq64, rid64))
                         : (skip_io ? kernel_ptr<false, true>(seq64, rid64) : kernel_ptr<false, false>(seq64, rid64));
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, k);
  if (e != cudaSuccess) return (int)e;
  out[0] = attr.numRegs;
  out[1] = (int64_t)attr.sharedSizeBytes;
  out[2] = (int64_t)attr.localSizeBytes;
  out[3] = attr.maxThreadsPerBlock;
  out[4] = attr.binaryVersion;
  out[5] = (int64_t)kSmem;
  return 0;
}

const char* peer_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

}  // extern "C"
