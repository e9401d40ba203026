"""``attention``: the Triton sparse MLA decode kernel (``sparse_mla_decode``) per problem size,
KV row format and launch variant.

For each KV format (bf16, fp8_ds_mla) a pool of ``pool_tokens`` (32K) tokens per request in
64-token pages shuffled over the whole pool (a random block table); per problem size (default
DeepSeek-V3.2 decode, d_qk 576, d_v 512: B=128/H=128/top_k=2048, B=8/H=128/top_k=2048,
B=64/H=64/top_k=512) fresh random queries and distinct request-local top-k positions. Rows:

* ``convert_req_index_to_global_index`` (once per size): the positions -> global slot ids,
  checked equal to ``harness.reference.convert_req_index_to_global_index_ref``
  (``max_rel_err`` = fraction of wrong slots);
* ``sparse_mla_decode`` per launch variant (``variant`` names keyword arguments of the kernel,
  recorded in ``launch_config``): checked against ``harness.reference.sparse_mla_decode_ref``
  (``max_rel_err`` = ||out - ref|| / ||ref||, ``max_lse_err`` = max |lse - lse_ref|), timed as
  the Python call (``cuda_graph`` false; the timer hides launch overhead behind a GPU spin) and
  as a CUDA-graph replay (``cuda_graph`` true, close to kernel time). ``flops`` =
  B * 2 * H * top_k * (d_qk + d_v); ``bytes_hbm_read`` = the gathered KV rows, B * top_k * row
  bytes.

``--quick``: d_qk 320 / d_v 256, a 256-token pool in 16-token pages, B=2/H=16/top_k=96.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from backends.kernels.index_convert import convert_req_index_to_global_index
from backends.kernels.kv_format import KV_DTYPES, make_kv_cache, row_bytes
from backends.kernels.sparse_mla_decode import sparse_mla_decode
from harness.bench.measure import BenchRun, Check, exact
from harness.bench.registry import register
from harness.reference import convert_req_index_to_global_index_ref, sparse_mla_decode_ref

#: launch variants: name -> keyword arguments of sparse_mla_decode
VARIANTS: Dict[str, dict] = {
    "default": {},                          # bf16: stages 2; fp8: stages 3; prefetch "index"
    "stages2": {"num_stages": 2},
    "stages3": {"num_stages": 3},           # the fp8 default; does not fit shared memory for bf16
    "pf_none": {"prefetch": "none"},
    "pf_rows": {"prefetch": "rows"},        # spills registers at d_v=512 (slow): kept for the record
    "n32": {"block_n": 32},
    "h32_w4": {"block_h": 32, "num_warps": 4},
    "nosplit": {"num_splits": 1},
    "split16": {"num_splits": 16},
    "split3_n32": {"num_splits": 3, "block_n": 32},
}

#: default max |lse - lse_ref| per KV format (see tests/test_sparse_mla_decode.py for the reasoning)
LSE_TOL = {"bf16": 1e-3, "fp8_ds_mla": 2e-2}

#: DeepSeek-V3.2's softmax scale: qk_head_dim (128 + 64) ** -0.5
SM_SCALE = 192 ** -0.5


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    heads: int
    top_k: int
    variants: Tuple[str, ...]


@dataclass(frozen=True)
class Sizes:
    d_qk: int
    d_v: int
    pool_tokens: int            # tokens per request in the pool
    page_size: int
    shapes: Tuple[Shape, ...]


FULL = Sizes(576, 512, 32768, 64, (
    Shape("B128_H128_k2048", 128, 128, 2048, ("default", "stages2", "pf_none", "n32")),
    Shape("B8_H128_k2048", 8, 128, 2048, ("default", "nosplit", "split16")),
    Shape("B64_H64_k512", 64, 64, 512, ("default", "nosplit"))))
QUICK = Sizes(320, 256, 256, 16, (Shape("quick_B2_H16_k96", 2, 16, 96, ("default", "split3_n32")),))


def flops(b: int, h: int, top_k: int, d_qk: int, d_v: int) -> float:
    return float(b) * 2.0 * h * top_k * (d_qk + d_v)


class Pool:
    """A paged KV pool: ``b_max`` requests x ``pool_tokens`` tokens, pages shuffled;
    ``cache`` rows in ``kv_dtype`` (``backends.kernels.kv_format``), ``block_table`` int32
    ``[b_max, pool_tokens / page_size]``."""

    def __init__(self, b_max: int, pool_tokens: int, page_size: int, d_qk: int, d_v: int,
                 kv_dtype: str, device: torch.device, seed: int):
        g = torch.Generator(device=device).manual_seed(seed)
        self.kv_dtype = kv_dtype
        self.page_size = page_size
        self.pool_tokens = pool_tokens
        self.d_qk, self.d_v = d_qk, d_v
        self.row_bytes = row_bytes(kv_dtype, d_v, d_qk - d_v)
        pages_per_req = pool_tokens // page_size
        num_pages = b_max * pages_per_req
        perm = torch.randperm(num_pages, generator=g, device=device).to(torch.int32)
        self.block_table = perm.view(b_max, pages_per_req).contiguous()
        kv = torch.randn((num_pages * page_size, d_qk), generator=g, device=device,
                         dtype=torch.float32).to(torch.bfloat16)
        self.cache = make_kv_cache(kv, kv_dtype, d_nope=d_v)
        del kv

    def columns(self) -> Dict[str, object]:
        """The result columns this pool fixes."""
        return {"kv_dtype": self.kv_dtype, "page_size": self.page_size,
                "context_len": self.pool_tokens, "head_dim": self.d_qk, "head_dim_v": self.d_v,
                "kv_row_bytes": self.row_bytes}


@dataclass
class DecodeProblem:
    """One decode batch over a ``Pool``: ``q`` bf16 ``[B, H, d_qk]``; ``local`` int32
    ``[B, top_k]`` distinct request-local positions, ``req_id`` int32 ``[B]``, ``block_table``
    int32 ``[B, pages]``; ``indices`` int32 ``[B, top_k]`` their global slots; ``ref_out``
    float32 ``[B, H, d_v]`` and ``ref_lse`` float32 ``[B, H]`` the reference attention."""

    pool: Pool
    q: torch.Tensor
    local: torch.Tensor
    req_id: torch.Tensor
    block_table: torch.Tensor
    indices: torch.Tensor
    ref_out: torch.Tensor
    ref_lse: torch.Tensor

    @classmethod
    def draw(cls, pool: Pool, b: int, h: int, top_k: int, seed: int) -> "DecodeProblem":
        dev = pool.cache.device
        g = torch.Generator(device=dev).manual_seed(seed)
        q = torch.randn((b, h, pool.d_qk), generator=g, device=dev).to(torch.bfloat16)
        local = torch.rand((b, pool.pool_tokens), generator=g, device=dev).topk(
            top_k, dim=1).indices.to(torch.int32)
        req_id = torch.arange(b, dtype=torch.int32, device=dev)
        bt = pool.block_table[:b]
        indices = convert_req_index_to_global_index_ref(req_id, bt, local, pool.page_size)
        ref_out, ref_lse = sparse_mla_decode_ref(q, pool.cache, indices, SM_SCALE, pool.d_v)
        return cls(pool, q, local, req_id, bt, indices, ref_out, ref_lse)

    def columns(self) -> Dict[str, object]:
        b, h, _ = self.q.shape
        k = self.local.shape[1]
        return {**self.pool.columns(), "batch_size": b, "num_heads": h, "top_k": k,
                "flops": flops(b, h, k, self.pool.d_qk, self.pool.d_v),
                "bytes_hbm_read": b * k * self.pool.row_bytes}

    def convert(self) -> torch.Tensor:
        return convert_req_index_to_global_index(self.req_id, self.block_table, self.local,
                                                 self.pool.page_size)

    def check_slots(self, slots: torch.Tensor) -> Check:
        return exact((slots != self.indices).float().mean().item())

    def check_attention(self, out: Tuple[torch.Tensor, torch.Tensor], rel_tol: float,
                        lse_tol: Optional[float]) -> Check:
        """``out`` = (out, lse) against the reference; ``lse_tol`` None: lse not checked."""
        o, lse = out
        rel = ((o.float() - self.ref_out).norm() / self.ref_out.norm()).item()
        lse_err = (lse.float() - self.ref_lse).abs().max().item()
        finite = bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
        return Check(rel, rel_tol, lse_err, float("nan") if lse_tol is None else lse_tol,
                     mismatch="" if finite else "non-finite output")


def _names(allowed: Sequence[str], what: str):
    def parse(text: str) -> List[str]:
        names = [n for n in text.split(",") if n]
        bad = [n for n in names if n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad}; allowed: {', '.join(allowed)}")
        return names
    return parse


def _options(p: argparse.ArgumentParser) -> None:
    shapes = [s.name for s in FULL.shapes + QUICK.shapes]
    p.add_argument("--formats", type=_names(KV_DTYPES, "KV format"), default=list(KV_DTYPES),
                   help=f"comma list of KV formats ({', '.join(KV_DTYPES)})")
    p.add_argument("--variants", type=_names(list(VARIANTS), "variant"), default=[],
                   help=f"comma list: only these variants ({', '.join(VARIANTS)})")
    p.add_argument("--shapes", type=_names(shapes, "shape"), default=[],
                   help=f"comma list: only these sizes ({', '.join(shapes)})")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timing")
    p.add_argument("--rel-tol", type=float, default=1e-2)
    p.add_argument("--lse-tol", type=float, default=None,
                   help="max |lse - ref| (default 1e-3 for bf16 rows, 2e-2 for fp8_ds_mla rows, whose "
                        "logits use bf16-rounded dequantized K)")


@register("attention", "Triton sparse MLA decode: launch variants x KV formats x sizes, "
          "Python call and CUDA-graph replay", options=_options)
def attention(run: BenchRun) -> None:
    args = run.args
    sz = QUICK if run.quick else FULL
    shapes = [s for s in sz.shapes if not args.shapes or s.name in args.shapes]
    b_max = max((s.batch for s in shapes), default=1)
    for fi, kv_dtype in enumerate(args.formats):
        pool = Pool(b_max, sz.pool_tokens, sz.page_size, sz.d_qk, sz.d_v, kv_dtype, run.device,
                    seed=1000 + fi)
        lse_tol = LSE_TOL[kv_dtype] if args.lse_tol is None else args.lse_tol
        for si, shape in enumerate(shapes):
            prob = DecodeProblem.draw(pool, shape.batch, shape.heads, shape.top_k,
                                      seed=10_000 * (fi + 1) + 100 * si)
            cols = {**prob.columns(), "case": shape.name}
            if fi == 0:
                run.measure(prob.convert, check=prob.check_slots,
                            kernel="convert_req_index_to_global_index",
                            **{k: cols[k] for k in ("case", "batch_size", "top_k", "page_size",
                                                    "context_len")})
            for variant in shape.variants:
                if args.variants and variant not in args.variants:
                    continue
                kwargs = VARIANTS[variant]
                for graph in run.graph_modes(not args.no_graph):
                    run.measure(lambda: sparse_mla_decode(prob.q, pool.cache, prob.indices,
                                                          SM_SCALE, pool.d_v, **kwargs),
                                check=lambda out: prob.check_attention(out, args.rel_tol, lse_tol),
                                graph=graph, kernel="sparse_mla_decode", variant=variant,
                                launch_config=json.dumps(kwargs, sort_keys=True), **cols)
            del prob
        del pool
        if run.cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":   # the older spelling: python -m harness.bench.attention
    from harness.bench.__main__ import main
    raise SystemExit(main(["run", "attention", *__import__("sys").argv[1:]]))
