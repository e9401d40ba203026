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

``--tune``: instead of the rows above, a grid of launch variants per tuning shape (``TUNE``:
B=128/H=128, the TP8 B=128/H=16 and the TP4 B=128/H=32 at top_k 2048, and B=1, 2, 4, 8 at
H=128) beside FlashMLA (``backends/kernels/flashmla_peer.py``; H=16 and 32 padded to its 64
heads outside the timed call, as an engine pads them) on the same queries and pool, each checked against the reference first,
each timed as a Python call (launch overhead hidden, cold L2) and, on a GPU unless
``--no-graph``, as a CUDA-graph replay (how engines run decode steps; the two kernels of a
split call then launch without the Python call between them). Our rows carry the resolved launch
(``launch_config``: every keyword argument, the split count actually launched included), the
compiled kernel's ``n_regs`` / ``n_spills`` / ``smem_bytes``, and ``ratio_to_peer`` against
FlashMLA in the same mode. The run prints, per shape, format and mode, the fastest correct
variant beside FlashMLA (:func:`tune_summary`); ``python -m harness.bench.attention summary DIR`` prints that table for
stored rows. With ``--quick``: ``TUNE_QUICK``, a smoke run (FlashMLA unavailable on the CPU).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import pandas as pd
import torch
from triton import OutOfResources

from backends.kernels.flashmla_peer import flashmla_attention, padded_heads
from backends.kernels.index_convert import convert_req_index_to_global_index
from backends.kernels.kv_format import KV_DTYPES, make_kv_cache, row_bytes
from backends.kernels.sparse_mla_decode import sparse_mla_decode, sparse_mla_decode_with_info
from backends.kernels.sparse_mla_decode_ws import ws_supported
from harness.bench.measure import BenchRun, Check, exact
from harness.bench.registry import register
from harness.bench.table import format_table
from harness.reference import convert_req_index_to_global_index_ref, sparse_mla_decode_ref

#: launch variants: name -> keyword arguments of sparse_mla_decode
VARIANTS: Dict[str, dict] = {
    "default": {},                          # split_scores at 64 heads, 2 stages (fp8 3), prefetch "index"
    "replicated": {"split_scores": False},  # every warpgroup computes all of S (fp8: 3 stages)
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
    Shape("B128_H128_k2048", 128, 128, 2048, ("default", "replicated", "pf_none", "n32")),
    Shape("B8_H128_k2048", 8, 128, 2048, ("default", "replicated", "nosplit", "split16")),
    Shape("B64_H64_k512", 64, 64, 512, ("default", "nosplit"))))
QUICK = Sizes(320, 256, 256, 16, (Shape("quick_B2_H16_k96", 2, 16, 96, ("default", "split3_n32")),))


#: kv formats a tuning variant applies to
ALL = tuple(KV_DTYPES)
FP8 = ("fp8_ds_mla",)
#: the warp-specialised Gluon kernel (backends/kernels/sparse_mla_decode_ws.py: Hopper)
_WS = (("ws", {"kernel": "ws"}, ALL),
       ("ws_f16p", {"kernel": "ws", "split_partials": "float16"}, ALL),
       ("ws_bf16p", {"kernel": "ws", "split_partials": "bfloat16"}, ALL))


@dataclass(frozen=True)
class TuneShape:
    """One tuning shape: its size and ``variants``, (name, keyword arguments of
    ``sparse_mla_decode``, kv formats it runs for). ``default`` (no arguments) is always one."""

    name: str
    batch: int
    heads: int
    top_k: int
    variants: Tuple[Tuple[str, dict, Tuple[str, ...]], ...]


# B=128, H=128: the gather of tile t+1 overlaps tile t's compute only with >= 3 pipeline stages
# (at 2 it is issued after tile t's MMAs), and a 64-token bf16 tile leaves room for 2 beside the
# 72 KB of q in shared memory (fp8_ds_mla rows 3, their default: `split_s3`; `split_s2` is the
# same launch at 2 stages, the default until the rope part of K went through registers to fit 3);
# smaller tiles fit deeper pipelines.
_SPLIT_STAGES = (("split_s2", {"num_stages": 2}, FP8),
                 ("split_s3", {"num_stages": 3}, FP8))
_BIG = (("default", {}, ALL),
        *_SPLIT_STAGES,
        ("replicated", {"split_scores": False}, ALL),   # every warpgroup computes all of S
        ("n32_s3", {"block_n": 32, "num_stages": 3}, ALL),
        ("n32_s4", {"block_n": 32, "num_stages": 4}, ALL),
        ("n32_s5", {"block_n": 32, "num_stages": 5}, FP8),
        ("n16_s6", {"block_n": 16, "num_stages": 6}, ALL),
        *_WS)
# TP8, H=16: 16-head programs (mma.sync), or 64 padded heads (wgmma) as FlashMLA runs them
_TP8 = (("default", {}, ALL),
        ("w4", {"num_warps": 4}, ALL),
        ("n32_s4", {"block_n": 32, "num_stages": 4}, ALL),
        ("n32_s4_w4", {"block_n": 32, "num_stages": 4, "num_warps": 4}, ALL),
        ("n32_s6", {"block_n": 32, "num_stages": 6}, FP8),
        ("n32_s4_split2", {"block_n": 32, "num_stages": 4, "num_splits": 2}, ALL),
        ("h64", {"block_h": 64}, ALL),
        ("h64_replicated", {"block_h": 64, "split_scores": False}, ALL),
        ("h64_n32_s4", {"block_h": 64, "block_n": 32, "num_stages": 4}, ALL),
        *_WS)


def _small(batch: int, auto_splits: int) -> TuneShape:
    """B <= 8 at H=128, top_k 2048: half and twice the heuristic's split count (twice with
    32-token tiles where 64-token ones run out: 32 tiles), and 32-token tiles."""
    double = ({"num_splits": auto_splits * 2} if auto_splits * 2 <= 32
              else {"num_splits": auto_splits * 2, "block_n": 32, "num_stages": 3})
    return TuneShape(f"B{batch}_H128_k2048", batch, 128, 2048, (
        ("default", {}, ALL),
        *_SPLIT_STAGES,
        ("replicated", {"split_scores": False}, ALL),
        (f"split{auto_splits // 2}", {"num_splits": auto_splits // 2}, ALL),
        (f"split{auto_splits * 2}" + ("" if auto_splits * 2 <= 32 else "_n32_s3"), double, ALL),
        ("n32_s3", {"block_n": 32, "num_stages": 3}, ALL),
        ("n32_s4", {"block_n": 32, "num_stages": 4}, ALL),
        (f"split{auto_splits * 2}_n32_s4",
         {"num_splits": auto_splits * 2, "block_n": 32, "num_stages": 4}, ALL),
        *_WS))


#: the tuning grid (``--tune``); the small-batch split counts bracket ``choose_num_splits``'s
#: choice at 64-token tiles on 132 SMs (32, 16, 16, 8 for B = 1, 2, 4, 8; a split count past
#: the 32 tiles is clamped to one tile per split); B16 / B32 at H128 and B4 / B8 at H16 (split
#: calls) for the ws kernel with float32 (its default), scaled fp16 (``ws_f16p``) and bf16
#: (``ws_bf16p``) partials
TUNE = (TuneShape("B128_H128_k2048", 128, 128, 2048, _BIG),
        TuneShape("B128_H16_k2048", 128, 16, 2048, _TP8),
        TuneShape("B128_H32_k2048", 128, 32, 2048, (("default", {}, ALL),
                                                     ("h64", {"block_h": 64}, ALL), *_WS)),
        _small(1, 32), _small(2, 16), _small(4, 16), _small(8, 8),
        *(TuneShape(f"B{b}_H{h}_k2048", b, h, 2048, (("default", {}, ALL), *_WS))
          for b, h in ((16, 128), (32, 128), (4, 16), (8, 16))))
TUNE_QUICK = (TuneShape("quick_B2_H16_k96", 2, 16, 96, (
    ("default", {}, ALL),
    ("n16", {"block_n": 16}, ALL),
    ("split3_n32", {"num_splits": 3, "block_n": 32}, ALL))),)


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
    shapes = list(dict.fromkeys(s.name for s in FULL.shapes + QUICK.shapes + TUNE + TUNE_QUICK))
    variants = sorted(set(VARIANTS) | {v[0] for t in TUNE + TUNE_QUICK for v in t.variants})
    p.add_argument("--formats", type=_names(KV_DTYPES, "KV format"), default=list(KV_DTYPES),
                   help=f"comma list of KV formats ({', '.join(KV_DTYPES)})")
    p.add_argument("--variants", type=_names(variants, "variant"), default=[],
                   help=f"comma list: only these variants ({', '.join(variants)})")
    p.add_argument("--shapes", type=_names(shapes, "shape"), default=[],
                   help=f"comma list: only these sizes ({', '.join(shapes)})")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timing")
    p.add_argument("--tune", action="store_true",
                   help="the tuning grid beside FlashMLA instead (TUNE; --formats and --variants "
                        "apply, --shapes takes the tuning shapes' names), then the best variant "
                        "per shape")
    p.add_argument("--rel-tol", type=float, default=1e-2)
    p.add_argument("--lse-tol", type=float, default=None,
                   help="max |lse - ref| (default 1e-3 for bf16 rows, 2e-2 for fp8_ds_mla rows, whose "
                        "logits use bf16-rounded dequantized K)")


@register("attention", "Triton sparse MLA decode: launch variants x KV formats x sizes, "
          "Python call and CUDA-graph replay", options=_options)
def attention(run: BenchRun) -> None:
    args = run.args
    if args.tune:
        tune(run)
        return
    sz = QUICK if run.quick else FULL
    shapes = [s for s in sz.shapes if not args.shapes or s.name in args.shapes]
    for fi, kv_dtype, lse_tol, shape, prob, cols in _problems(run, shapes, seed=1000):
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
                run.measure(lambda: sparse_mla_decode(prob.q, prob.pool.cache, prob.indices,
                                                      SM_SCALE, prob.pool.d_v, **kwargs),
                            check=lambda out: prob.check_attention(out, args.rel_tol, lse_tol),
                            graph=graph, kernel="sparse_mla_decode", variant=variant,
                            launch_config=json.dumps(kwargs, sort_keys=True), **cols)


def _problems(run: BenchRun, shapes, seed: int):
    """For each KV format of ``--formats`` (one pool of ``seed + i``, shared by its shapes) and
    each shape (a problem of fresh queries and selections): ``(format index, kv_dtype, lse
    tolerance, shape, problem, row columns)``. Pools and problems are freed as it moves on."""
    args = run.args
    sz = QUICK if run.quick else FULL
    b_max = max((s.batch for s in shapes), default=1)
    for fi, kv_dtype in enumerate(args.formats):
        pool = Pool(b_max, sz.pool_tokens, sz.page_size, sz.d_qk, sz.d_v, kv_dtype, run.device,
                    seed=seed + fi)
        lse_tol = LSE_TOL[kv_dtype] if args.lse_tol is None else args.lse_tol
        for si, shape in enumerate(shapes):
            prob = DecodeProblem.draw(pool, shape.batch, shape.heads, shape.top_k,
                                      seed=10 * seed * (fi + 1) + 100 * si)
            yield fi, kv_dtype, lse_tol, shape, prob, {**prob.columns(), "case": shape.name}
            del prob
        del pool
        if run.cuda:
            torch.cuda.empty_cache()


def tune(run: BenchRun) -> None:
    """The ``--tune`` rows (module doc), then the summary table (:func:`tune_summary`)."""
    args = run.args
    grid = [t for t in (TUNE_QUICK if run.quick else TUNE) if not args.shapes or t.name in args.shapes]
    for _, kv_dtype, lse_tol, shape, prob, cols in _problems(run, grid, seed=2000):
        for graph in run.graph_modes(not args.no_graph):
            peer = _flashmla_row(run, prob, cols, args.rel_tol, graph)
            for name, kwargs, formats in shape.variants:
                if kv_dtype not in formats or (args.variants and name not in args.variants):
                    continue
                row = _tuned_row(run, prob, name, kwargs, cols, args.rel_tol, lse_tol, graph)
                run.compare(row, peer)
    print(f"\n== attention --tune: fastest correct variant per shape ==\n"
          f"{format_table(tune_summary(run.rows), SUMMARY_TABLE)}", flush=True)


def _flashmla_row(run: BenchRun, prob: DecodeProblem, cols: Dict, rel_tol: float,
                  graph: bool) -> Dict:
    """FlashMLA on ``prob``: heads padded to its count before timing, its first H checked;
    ``graph``: timed as a CUDA-graph replay."""
    b, h, d_qk = prob.q.shape
    try:
        hp = padded_heads(h)
    except ValueError as e:               # PeerUnsupported: more heads than FlashMLA takes
        return run.skip("invalid", str(e), kernel="flashmla", **cols)
    q = prob.q
    if hp != h:
        q = prob.q.new_zeros((b, hp, d_qk))
        q[:, :h] = prob.q
    pool = prob.pool
    return run.measure(
        lambda: flashmla_attention(run.device)(q, pool.cache, prob.indices, SM_SCALE, d_v=pool.d_v),
        check=lambda out: prob.check_attention((out[0][:, :h], out[1][:, :h]), rel_tol, None),
        graph=graph, kernel="flashmla", variant=f"heads{hp}" if hp != h else None, **cols)


def _tuned_row(run: BenchRun, prob: DecodeProblem, name: str, kwargs: dict, cols: Dict,
               rel_tol: float, lse_tol: float, graph: bool) -> Dict:
    """One variant: launched once for its resolved configuration and compiled resources, then
    checked and timed like every row (``graph``: as a CUDA-graph replay)."""
    pool = prob.pool
    if kwargs.get("kernel") == "ws":      # Hopper and DeepSeek-V3.2's widths only: a skip elsewhere
        why = ws_supported(prob.q, pool.cache, pool.d_v)
        if why is not None:
            return run.skip("invalid", f"sparse_mla_decode_ws {why}", kernel="sparse_mla_decode",
                            variant=name, launch_config=json.dumps(kwargs, sort_keys=True), **cols)
    try:
        _, _, info = sparse_mla_decode_with_info(prob.q, pool.cache, prob.indices, SM_SCALE,
                                                 pool.d_v, **kwargs)
        compiled = {"launch_config": json.dumps(info.launch_kwargs(), sort_keys=True),
                    "n_regs": info.n_regs, "n_spills": info.n_spills, "smem_bytes": info.smem_bytes}
    except OutOfResources as e:  # does not fit this GPU (e.g. shared memory): the rest run
        return run.skip("invalid", str(e), kernel="sparse_mla_decode", variant=name,
                        launch_config=json.dumps(kwargs, sort_keys=True), **cols)
    except Exception:  # measure below repeats the call and records the error with its traceback
        compiled = {"launch_config": json.dumps(kwargs, sort_keys=True)}
    return run.measure(
        lambda: sparse_mla_decode(prob.q, pool.cache, prob.indices, SM_SCALE, pool.d_v, **kwargs),
        check=lambda out: prob.check_attention(out, rel_tol, lse_tol),
        graph=graph, kernel="sparse_mla_decode", variant=name, **compiled, **cols)


#: the summary's columns: (header, key of a :func:`tune_summary` row, format)
SUMMARY_TABLE = [("shape", "case", "s"), ("kv", "kv_dtype", "s"), ("mode", "mode", "s"),
                 ("best", "variant", "s"),
                 ("splits", "num_splits", "d"), ("ours_us", "ours_us", ".1f"),
                 ("default_us", "default_us", ".1f"), ("flashmla_us", "flashmla_us", ".1f"),
                 ("ratio", "ratio", ".2f"), ("TFLOP/s", "tflops", ".0f"),
                 ("n_regs", "n_regs", "d"), ("n_spills", "n_spills", "d"),
                 ("smem_KB", "smem_kb", ".0f"), ("variants_ok", "n_ok", "d"),
                 ("not_ok", "not_ok", "s")]


def tune_summary(rows: Union[pd.DataFrame, Iterable[Mapping]]) -> List[Dict]:
    """Per (case, kv_dtype, mode: ``eager`` or ``graph`` from ``cuda_graph``): the fastest
    ``sparse_mla_decode`` row with status ``ok``
    (``variant``, its ``ours_us`` median and ``tflops``, compiled ``n_regs`` / ``n_spills`` /
    ``smem_kb``, launched ``num_splits``), the ``default`` variant's median (``default_us``),
    the same mode's ``flashmla`` row's median when ok (``flashmla_us``), ``ratio`` = ours_us / flashmla_us
    (NaN without an ok FlashMLA row), ``n_ok`` (variants ok) and ``not_ok`` (the others,
    ``variant:status``). Cases in first-seen order; a case without an ok variant shows NaN."""
    records = rows.to_dict("records") if isinstance(rows, pd.DataFrame) else [dict(r) for r in rows]
    groups: Dict[Tuple[str, str, str], List[Dict]] = {}
    for r in records:
        if r.get("kernel") in ("sparse_mla_decode", "flashmla") and r.get("case"):
            mode = "graph" if _value(r.get("cuda_graph")) else "eager"
            groups.setdefault((r["case"], r["kv_dtype"], mode), []).append(r)
    nan = float("nan")
    out = []
    for (case, kv, mode), rs in groups.items():
        ours = [r for r in rs if r["kernel"] == "sparse_mla_decode"]
        ok = [r for r in ours if r.get("status") == "ok"]
        theirs = [r for r in rs if r["kernel"] == "flashmla" and r.get("status") == "ok"]
        default = [r for r in ok if r.get("variant") == "default"]
        best = min(ok, key=lambda r: r["latency_us_median"]) if ok else {}
        flash_us = theirs[0]["latency_us_median"] if theirs else nan
        ours_us = best.get("latency_us_median", nan)
        launch = json.loads(best["launch_config"]) if best.get("launch_config") else {}
        smem = _value(best.get("smem_bytes"))
        out.append({"case": case, "kv_dtype": kv, "mode": mode, "variant": best.get("variant"),
                    "num_splits": launch.get("num_splits"), "ours_us": ours_us,
                    "default_us": default[0]["latency_us_median"] if default else nan,
                    "flashmla_us": flash_us,
                    "ratio": ours_us / flash_us if theirs and ok else nan,
                    "tflops": best.get("tflops", nan), "n_regs": _value(best.get("n_regs")),
                    "n_spills": _value(best.get("n_spills")),
                    "smem_kb": nan if smem is None else smem / 1024, "n_ok": len(ok),
                    "not_ok": " ".join(f"{r.get('variant')}:{r.get('status')}" for r in ours
                                       if r.get("status") != "ok")})
    return out


def _value(v):
    """None for a missing value (None, NaN, pandas NA), else ``v``."""
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return None
    return v


if __name__ == "__main__":
    import sys
    if sys.argv[1:2] == ["summary"]:     # python -m harness.bench.attention summary DIR
        if len(sys.argv) != 3:
            print("usage: python -m harness.bench.attention summary DIR", file=sys.stderr)
            raise SystemExit(2)
        from harness import results
        print(format_table(tune_summary(results.load(sys.argv[2])), SUMMARY_TABLE))
        raise SystemExit(0)
    from harness.bench.__main__ import main   # the older spelling: python -m harness.bench.attention
    raise SystemExit(main(["run", "attention", *sys.argv[1:]]))
