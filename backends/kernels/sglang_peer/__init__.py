"""SGLang's own HiSparse swap-in kernel as a peer of our coordinator (``coordinator=sglang``).

Upstream's kernel is ``load_cache_to_device_buffer_kernel`` in ``kvcacheio/hisparse.cuh`` of the
``sglang`` package (0.5.23: ``sglang/kernels/jit/csrc/kvcacheio/hisparse.cuh``; older releases:
``sglang/jit_kernel/csrc/hisparse.cuh``). SGLang JIT-builds it through a generated
``TVM_FFI_DLL_EXPORT_TYPED_FUNC`` wrapper linked against ``libtvm_ffi``. We do not: the header is
taken out of the installed package or the downloaded wheel at build time (it is never part of
this repository), staged with the headers it includes (``sgl_kernel/*`` from the same package,
``tvm/ffi/*`` and ``dlpack`` from an ``apache-tvm-ffi`` wheel: headers only) and compiled with
``nvcc`` together with our launcher (``launcher.cu``, in this package), which instantiates the
``__global__`` kernel template itself and exposes plain ``extern "C"`` functions. The result is a
shared library loaded with ``ctypes``: it needs neither tvm-ffi nor sglang at run time, links
the CUDA runtime statically, and runs under any Python.

Flags mirror SGLang's JIT build for the GPU it runs on: ``-std=c++20 -O3
--expt-relaxed-constexpr -DSGL_CUDA_ARCH=900 -gencode=arch=compute_90a,code=sm_90a -Xcompiler
-fPIC`` (H100/H200), plus ``-shared -Xptxas -v`` (register use goes to the build log).

Instantiation: ``<BLOCK, TOP_K, HOT_BUFFER, IsMLA=true, IsDsv4Layout=false, SPARSE_BLOCK_SIZE=1,
TopKIsBlocks=false, RecordMissPlan, SkipIO, SeqLensT, ReqPoolIndicesT>``, i.e. what
``load_cache_to_device_buffer_mla`` (``sglang/kernels/ops/kvcache/hisparse.py``) builds; the
coordinator's default block is 960 threads (``swap_in_block_size``). ``RecordMissPlan=true``
gives the per-request miss count (used for counts); ``SkipIO`` is upstream's timing probe.

Upstream state (one layer) and how ours maps onto it (token mode only: upstream is per token)
--------------------------------------------------------------------------------------------
============================  ====================================  ============================
upstream buffer               dtype / shape                         ours
============================  ====================================  ============================
``device_buffer_tokens``      int32 ``[R, D + P]``                  ``slot_unit[layer]`` (cols
                                                                    ``D..`` = -1, never read)
``device_buffer_locs``        int32 ``[R, D + P]`` (same stride)    ``r * (D + P) + s``
``lru_slots``                 int16 ``[R, D]`` LRU first            ``lru[layer]`` (int32)
``host_cache_locs``           int64 ``[R, max_ctx]`` pos -> host    ``host_page_table * P + p%P``
``host_cache`` / device pool  bytes, ``row_bytes`` a row            ``host_kv[l]`` / ``device_kv[l]``
``top_k_device_locs``         int32 ``[B, K]`` (output)             ``swap_in_selected_pages``
``miss_src/dst/count``        int64/int32 ``[B, K]``, int32 ``[B]``  miss plan / ``misses``
============================  ====================================  ============================

Semantics of the upstream kernel (read from the 0.5.23 source; ``UpstreamHotBuffer`` in
``harness/sglang_model.py`` models them in pure Python) and how they relate to ours
(``harness/lru_model.py``):

* short request (``seq_len <= D``): ``out[i] = locs[pos]`` for ``i < min(seq_len, K)`` and
  ``pos >= 0``, else -1 (entries are assumed compacted to the front; no ``pos < seq_len`` check);
* long request: the newest token (``seq_len - 1``) maps to ``locs[D]`` and is not tracked; every
  other entry goes into a shared-memory hash; the hot slots are walked in LRU order, a resident
  selected token is a hit; the i-th miss *in selection order* takes the i-th least recently used
  non-hit slot; new LRU order = untouched non-hit slots, then the misses' slots (selection order),
  then the hit slots **in their previous LRU order**. That is ours in the default
  ``lru_order=upstream``; ``lru_order=position`` (the harness's earlier order) takes misses and
  hits in ascending position instead. -1 entries of a long request are skipped and their output is
  left as it was (we fill the output with -1 first); duplicates race in the hash (an entry can be
  loaded twice) and positions ``>= seq_len`` are not checked, so ``swap_in`` feeds the kernel a
  canonical selection (``canonical_selection``: valid, distinct, ascending, -1 at the end) and
  maps the output back to the caller's order. On the same selection in the same entry order, ours
  in ``upstream`` order and the kernel agree exactly, the LRU order included, in lockstep and free
  running (checked by
  ``tests/test_sglang_peer.py::test_gpu_free_running_50_steps_equal_sglang_kernel``: 50 steps,
  ``swap_in_direct``; on the CPU against ``UpstreamHotBuffer``). In ``position`` order hits,
  misses, slot assignment, output slots and copied bytes still agree in lockstep on the canonical
  selection, but the hit slots' LRU order differs, so free-running traces can diverge
  (``tests/test_sglang_peer.py`` has a four-step example). ``swap_in`` (any selection) pays for
  that canonicalising sort; ``swap_in_direct`` passes a selection that already meets upstream's
  contract (``selection_contract_error``; an indexer's top-k does) straight to the kernel, as
  SGLang does, and is what ``hisparse.coordinator=sglang`` runs.
* no counts: misses come from ``miss_count`` (RecordMissPlan), hits are derived
  (distinct valid selections - misses, the newest token counted as a hit, as ours).
* copies: one warp per miss, 16-byte ``ld.global.nc.v2.b64`` from pinned host memory (UVA) with
  ``st.global.cg``, 8-byte tail: ``row_bytes`` must be a multiple of 16 (656 and 1152 are).

Everything that needs a GPU raises ``PeerUnavailable`` without CUDA; shapes upstream does not
support raise ``PeerUnsupported``. CLI (set-up, no GPU needed)::

    python -m backends.kernels.sglang_peer stage --sglang SGLANG.whl --tvm-ffi TVM_FFI.whl
    python -m backends.kernels.sglang_peer build --top-k 2048 --hot 4096 [--block 960]
    python -m backends.kernels.sglang_peer info

Modules, one job each: ``staging`` (upstream's headers out of the wheels into ``.peer_build/``),
``build`` (the nvcc build of ``launcher.cu``), ``binding`` (ctypes: ``SGLangSwapInKernel``),
``state`` (our state <-> upstream's, the selection contract), ``peer`` (``SGLangHiSparsePeer``),
``__main__`` (the CLI). The model of upstream's kernel and the lockstep comparison are test and
bench support: ``harness/sglang_model.py``.
"""
from backends.kernels.sglang_peer.binding import SGLangSwapInKernel
from backends.kernels.sglang_peer.build import (DEFAULT_ARCH, DEFAULT_BLOCK_SIZE, LAUNCHER_CU,
                                                MAX_DYNAMIC_SMEM, KernelConfig, build_library,
                                                instance_label, library_path, nvcc_command,
                                                ptxas_usage, smem_bytes)
from backends.kernels.sglang_peer.peer import SGLangHiSparsePeer
from backends.kernels.sglang_peer.staging import (DEFAULT_BUILD_DIR, EXPECTED_PARAMS,
                                                  EXPECTED_TEMPLATE, HEADER_LAYOUTS, KERNEL_NAME,
                                                  UpstreamSources, check_kernel_contract,
                                                  kernel_signature, stage_sources,
                                                  staged_sources)
from backends.kernels.sglang_peer.state import (INT16_MAX, canonical_selection,
                                                device_buffer_locs, from_upstream_state,
                                                host_cache_locs, selection_contract_error,
                                                to_upstream_state, uncanonical)

__all__ = [
    "DEFAULT_ARCH", "DEFAULT_BLOCK_SIZE", "DEFAULT_BUILD_DIR", "EXPECTED_PARAMS",
    "EXPECTED_TEMPLATE", "HEADER_LAYOUTS", "INT16_MAX", "KERNEL_NAME", "LAUNCHER_CU",
    "MAX_DYNAMIC_SMEM", "KernelConfig", "SGLangHiSparsePeer", "SGLangSwapInKernel",
    "UpstreamSources", "build_library", "canonical_selection", "check_kernel_contract",
    "device_buffer_locs", "from_upstream_state", "host_cache_locs", "instance_label",
    "kernel_signature", "library_path", "nvcc_command", "ptxas_usage", "selection_contract_error",
    "smem_bytes", "stage_sources", "staged_sources", "to_upstream_state", "uncanonical",
]
