"""``peers``: each kernel beside its upstream peer, measured in the same process; our row's
``peer`` names the upstream row and ``ratio_to_peer`` = ours / theirs.

* attention: ``sparse_mla_decode`` vs ``flashmla`` (``sgl-flash-mla``: the V3.2 fp8 sparse
  decode for ``fp8_ds_mla`` rows, ``flash_mla_sparse_fwd`` for bf16 rows) on the same queries,
  KV pool and slot table (the ``attention`` bench's pools and sizes, default variant); both
  checked against ``harness.reference.sparse_mla_decode_ref`` (``max_rel_err`` of the output;
  ours also its lse).
* index conversion: ``convert_req_index_to_global_index`` vs vLLM's own Triton kernel
  (``sparse_mla_index_remap_kernel``, staged from the vllm wheel into ``.peer_build/vllm`` by
  ``python -m backends.kernels.vllm_peer stage``; unavailable rows when not staged), B=128,
  top_k=2048, page 64 (``max_rel_err`` = fraction of wrong slots).
* swap-in: our coordinator vs SGLang's own kernel alone on identical pools and selections;
  SGLang's call through our adapter (canonicalising sort + kernel) is a second row, compared
  with the kernel too (``harness/bench/swap_in_peer.py``).

Rows are timed as Python calls (the timer hides launch overhead behind a GPU spin). A peer
that is not installed or has no GPU gives rows with ``status`` unavailable, a shape it does
not support ``invalid``. With ``--quick`` (the only mode without CUDA) the sizes are tiny and SGLang's
kernel is replaced by the Python model of it (``harness.sglang_model.modelled_peer``; kernel
names ``sglang_model_*``): a smoke run of the comparison, not a timing.
"""
from __future__ import annotations

import torch

from backends.kernels.flashmla_peer import flashmla_attention
from backends.kernels.index_convert import convert_req_index_to_global_index
from backends.kernels.kv_format import KV_DTYPES
from backends.kernels.sglang_peer import SGLangHiSparsePeer
from backends.kernels.sparse_mla_decode import sparse_mla_decode
from backends.kernels.vllm_peer import vllm_convert_req_index_to_global_index
from harness.bench import attention, swap_in
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.bench.measure import BenchRun, exact
from harness.bench.registry import register
from harness.bench.swap_in_peer import swap_in_peers
from harness.reference import convert_req_index_to_global_index_ref
from harness.sglang_model import modelled_peer

REL_TOL = 1e-2


def attention_peers(run: BenchRun) -> None:
    sz = attention.QUICK if run.quick else attention.FULL
    # full sizes: also TP8 (16 heads per GPU; FlashMLA's call pads them to 64, as vLLM does)
    shapes = sz.shapes if run.quick else sz.shapes + (
        attention.Shape("B128_H16_k2048", 128, 16, 2048, ("default",)),)
    for fmt in KV_DTYPES:
        pool = Pool(max(s.batch for s in shapes), sz.pool_tokens, sz.page_size, sz.d_qk,
                    sz.d_v, fmt, run.device, seed=1)
        for s in shapes:
            prob = DecodeProblem.draw(pool, s.batch, s.heads, s.top_k, seed=s.batch * 7 + s.top_k)
            cols = {**prob.columns(), "case": s.name}
            ours = run.measure(
                lambda: sparse_mla_decode(prob.q, pool.cache, prob.indices, SM_SCALE, pool.d_v),
                check=lambda out: prob.check_attention(out, REL_TOL, LSE_TOL[fmt]),
                kernel="sparse_mla_decode", variant="default", **cols)
            theirs = run.measure(
                lambda: flashmla_attention(run.device)(prob.q, pool.cache, prob.indices,
                                                       SM_SCALE, d_v=pool.d_v),
                check=lambda out: prob.check_attention(out, REL_TOL, None),
                kernel="flashmla", **cols)
            run.compare(ours, theirs)
            del prob
        del pool
        if run.cuda:
            torch.cuda.empty_cache()


def convert_peers(run: BenchRun) -> None:
    """Request-local positions -> global slots at B=128, top_k=2048, page 64 (quick: 2, 128, 16;
    vLLM's kernel takes top_k in 128-column tiles)."""
    B, K, P, pages = (2, 128, 16, 16) if run.quick else (128, 2048, 64, 512)
    dev = run.device
    g = torch.Generator(device=dev).manual_seed(0)
    bt = torch.randperm(B * pages, generator=g, device=dev).to(torch.int32).view(B, pages)
    req = torch.arange(B, dtype=torch.int32, device=dev)
    tok = torch.randint(0, pages * P, (B, K), generator=g, device=dev, dtype=torch.int32)
    ref = convert_req_index_to_global_index_ref(req, bt, tok, P)
    cols = {"batch_size": B, "top_k": K, "page_size": P, "context_len": pages * P}
    ours = run.measure(lambda: convert_req_index_to_global_index(req, bt, tok, P),
                       check=lambda out: exact((out != ref).float().mean().item()),
                       kernel="convert_req_index_to_global_index", **cols)
    theirs = run.measure(lambda: vllm_convert_req_index_to_global_index(req, bt, tok, P),
                         check=lambda out: exact((out != ref).float().mean().item()),
                         kernel="vllm_convert_req_index_to_global_index", **cols)
    run.compare(ours, theirs)


@register("peers", "each kernel beside its upstream peer: attention vs FlashMLA, index "
          "conversion vs vLLM, swap-in vs SGLang's kernel")
def peers(run: BenchRun) -> None:
    attention_peers(run)
    convert_peers(run)
    if run.quick:
        swap_in_peers(run, swap_in.QUICK, modelled_peer, "sglang_model")
    else:
        swap_in_peers(run, swap_in.FULL, SGLangHiSparsePeer, "sglang")
