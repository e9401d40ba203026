"""Each Triton kernel beside its upstream peer, measured in the same process
(``python -m harness.bench.peers``).

* attention: ``sparse_mla_decode`` (ours) vs FlashMLA (``sgl-flash-mla``: the V3.2 fp8 sparse
  decode for ``fp8_ds_mla`` rows, ``flash_mla_sparse_fwd`` for bf16 rows) on the same queries,
  KV pool and slot table; both checked against ``harness.reference.sparse_mla_decode_ref``.
* index conversion: ``convert_req_index_to_global_index`` vs vLLM's Triton kernel where
  ``vllm`` is importable (it is not on the GPU machine here: its wheel needs torch 2.14);
  ``rel_err`` there is the fraction of wrong slots.
* HiSparse swap-in: our coordinator vs SGLang's own kernel on identical pools and selections
  (``harness/bench/swap_in_peer.py``: all misses, all hits, steady state in lockstep);
  ``rel_err`` there is the fraction of selected rows whose device bytes are wrong. ``--quick``
  (or no GPU) runs only this part, at tiny sizes, with the pure-Python model of upstream's
  kernel standing in (a smoke run of the comparison, not a timing).

Timing: ``harness.timing.time_fn`` (CUDA events, cold L2, launch overhead hidden behind a GPU
spin, median of ``--repeats``). Prints a table last; JSON to ``$OUT/peers_bench.json``.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Dict, List, Optional

import torch

if not torch.cuda.is_available():                 # before any Triton kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported, flashmla_attention
from backends.kernels.index_convert import convert_req_index_to_global_index
from backends.kernels.sparse_mla_decode import sparse_mla_decode
from harness.bench.attention import Pool, _topk_local, flops
from harness.bench.swap_in import QUICK, BenchSizes
from harness.bench.swap_in_peer import swap_in_peer_rows
from backends.kernels.kv_format import KV_DTYPES
from harness.sglang_model import modelled_peer
from backends.kernels.vllm_peer import vllm_convert_kernel, vllm_convert_req_index_to_global_index
from harness.reference import convert_req_index_to_global_index_ref, sparse_mla_decode_ref
from harness.timing import time_fn

SHAPES = [(128, 128, 2048), (8, 128, 2048), (64, 64, 512)]
SM_SCALE = 192 ** -0.5


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def attention_rows(repeats: int) -> List[Dict]:
    dev = torch.device("cuda")
    try:
        peer = flashmla_attention(dev)
        why = ""
    except PeerUnavailable as e:
        peer, why = None, str(e)
    rows = []
    for fmt in KV_DTYPES:
        pool = Pool(max(b for b, _, _ in SHAPES), 32768, 64, 576, 512, fmt, dev, seed=1)
        for b, h, k in SHAPES:
            g = torch.Generator(device=dev).manual_seed(b * 7 + k)
            q = torch.randn((b, h, 576), generator=g, device=dev).to(torch.bfloat16)
            local = _topk_local(b, pool.pool_tokens, k, g, dev)
            idx = convert_req_index_to_global_index(torch.arange(b, dtype=torch.int32, device=dev),
                                                    pool.block_table[:b], local, 64)
            ref_out, _ = sparse_mla_decode_ref(q, pool.cache, idx, SM_SCALE, d_v=512)
            fl = flops(b, h, k, 576, 512)
            row = {"kernel": "attention", "kv_dtype": fmt, "B": b, "H": h, "top_k": k}
            ours = lambda: sparse_mla_decode(q, pool.cache, idx, SM_SCALE, d_v=512)  # noqa: E731
            row["ours_rel_err"] = _rel(ours()[0], ref_out)
            row["ours_us"] = time_fn(ours, dev, repeats=repeats).median_us
            row["ours_tflops"] = fl / row["ours_us"] / 1e6
            if peer is None:
                row["peer"] = f"unavailable: {why}"
            else:
                theirs = lambda: peer(q, pool.cache, idx, SM_SCALE, d_v=512)  # noqa: E731
                try:
                    row["peer_rel_err"] = _rel(theirs()[0], ref_out)
                    row["peer_us"] = time_fn(theirs, dev, repeats=repeats).median_us
                    row["peer_tflops"] = fl / row["peer_us"] / 1e6
                    row["ours_over_peer"] = row["ours_us"] / row["peer_us"]
                    row["peer"] = "flashmla"
                except PeerUnsupported as e:
                    row["peer"] = f"unsupported: {e}"
            rows.append(row)
        del pool
        torch.cuda.empty_cache()
    return rows


def convert_rows(repeats: int) -> List[Dict]:
    """Our conversion kernel vs vLLM's at B=128, top_k=2048, page 64 (where vllm imports)."""
    dev = torch.device("cuda")
    row = {"kernel": "convert_req_index_to_global_index", "B": 128, "top_k": 2048}
    g = torch.Generator(device=dev).manual_seed(0)
    bt = torch.randperm(128 * 512, generator=g, device=dev).to(torch.int32).view(128, 512)
    req = torch.arange(128, dtype=torch.int32, device=dev)
    tok = torch.randint(0, 512 * 64, (128, 2048), generator=g, device=dev, dtype=torch.int32)
    ref = convert_req_index_to_global_index_ref(req, bt, tok, 64)
    ours = lambda: convert_req_index_to_global_index(req, bt, tok, 64)  # noqa: E731
    row["ours_rel_err"] = float((ours() != ref).float().mean())
    row["ours_us"] = time_fn(ours, dev, repeats=repeats).median_us
    try:
        vllm_convert_kernel()
    except PeerUnavailable as e:
        row["peer"] = f"unavailable: {str(e)[:80]}"
        return [row]
    theirs = lambda: vllm_convert_req_index_to_global_index(req, bt, tok, 64)  # noqa: E731
    row["peer_rel_err"] = float((theirs() != ref).float().mean())
    row["peer_us"] = time_fn(theirs, dev, repeats=repeats).median_us
    row["ours_over_peer"] = row["ours_us"] / row["peer_us"]
    row["peer"] = "vllm"
    return [row]


def swap_in_rows(quick: bool) -> List[Dict]:
    """Our swap-in vs SGLang's kernel (the model of it when ``quick``)."""
    if quick:
        rows = swap_in_peer_rows(QUICK, torch.device("cpu"), modelled_peer)
        return [{**r, "peer": "sglang (Python model: not a timing)"} for r in rows]
    try:
        return swap_in_peer_rows(BenchSizes(), torch.device("cuda"))
    except (PeerUnavailable, PeerUnsupported) as e:
        return [{"kernel": "swap_in", "peer": f"unavailable: {str(e)[:120]}"}]


def _fmt(rows: List[Dict]) -> str:
    cols = ["kernel", "kv_dtype", "B", "H", "top_k", "ours_us", "peer_us", "peer_kernel_us",
            "ours_over_peer", "ours_tflops", "peer_tflops", "misses_per_req", "ours_rel_err",
            "peer_rel_err", "peer"]
    out = [" | ".join(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cells.append(f"{v:.4g}" if isinstance(v, float) else str(v))
        out.append(" | ".join(cells))
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> List[Dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--quick", action="store_true",
                    help="CPU smoke run of the swap-in comparison only (model of upstream's kernel)")
    args = ap.parse_args(argv)
    if args.quick or not torch.cuda.is_available():
        print("peers bench: attention and conversion peers need CUDA; swap-in comparison only, "
              "tiny sizes, upstream's kernel modelled in Python")
        rows = swap_in_rows(quick=True)
    else:
        rows = attention_rows(args.repeats) + convert_rows(args.repeats) + swap_in_rows(False)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "peers_bench.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print(_fmt(rows))
    return rows


if __name__ == "__main__":
    main()
