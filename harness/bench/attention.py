"""Benchmark of the Triton sparse MLA decode kernel (``python -m harness.bench.attention``).

For each problem size (default: DeepSeek-V3.2 decode, d_qk 576, d_v 512; B=128/H=128/top_k=2048,
B=8/H=128/top_k=2048 and B=64/H=64/top_k=512), each KV row format (bf16, fp8_ds_mla) and each
kernel variant (tunables of ``sparse_mla_decode``), it

1. builds a KV pool of ``pool_tokens`` (32K) tokens per request, in pages of 64 tokens whose
   order is shuffled over the whole pool (a random block table),
2. draws fresh random queries and distinct request-local top-k positions, converts them to
   global slot ids with the Triton converter (checked against its torch reference),
3. runs the kernel and checks it against ``harness.reference.sparse_mla_decode_ref``
   (rel err = ||out - ref|| / ||ref||, lse = max |lse - lse_ref|),
4. times it with ``harness.timing.time_fn`` (cold L2, median): ``us`` is the public Python
   call (launch overhead included); ``graph_us`` replays the same call captured in a CUDA graph
   (close to kernel time, the figure FlashMLA's 228 us compares with). TFLOP/s uses
   ``graph_us`` when there is one: FLOPs = B * 2 * H * top_k * (d_qk + d_v).

The table is printed last; with ``$OUT`` set, the rows are also written to
``$OUT/attention_bench.json``. ``--quick`` runs tiny sizes on the CPU (Triton interpreter) as a
smoke test.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from typing import Dict, List, Optional

import torch

if not torch.cuda.is_available():          # the CPU smoke run needs the Triton interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from backends.kernels.index_convert import convert_req_index_to_global_index  # noqa: E402
from backends.kernels.sparse_mla_decode import choose_num_splits, sparse_mla_decode  # noqa: E402
from backends.kernels.kv_format import KV_DTYPES, make_kv_cache, row_bytes  # noqa: E402
from harness.reference import (convert_req_index_to_global_index_ref,  # noqa: E402
                               sparse_mla_decode_ref)
from harness.timing import capture_graph, time_fn  # noqa: E402

#: kernel variants: name -> keyword arguments of sparse_mla_decode
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

#: (name, B, H, top_k, variants run at that size)
SHAPES = [
    ("B128_H128_k2048", 128, 128, 2048, ["default", "stages2", "pf_none", "n32"]),
    ("B8_H128_k2048", 8, 128, 2048, ["default", "nosplit", "split16"]),
    ("B64_H64_k512", 64, 64, 512, ["default", "nosplit"]),
]

#: default max |lse - lse_ref| per KV format (see tests/test_sparse_mla_decode.py for the reasoning)
LSE_TOL = {"bf16": 1e-3, "fp8_ds_mla": 2e-2}

QUICK_SHAPES = [
    ("quick_B2_H16_k96", 2, 16, 96, ["default", "split3_n32"]),
]


def flops(b: int, h: int, top_k: int, d_qk: int, d_v: int) -> float:
    return float(b) * 2.0 * h * top_k * (d_qk + d_v)


class Pool:
    """A paged KV pool: ``b_max`` requests x ``pool_tokens`` tokens, pages shuffled."""

    def __init__(self, b_max: int, pool_tokens: int, page_size: int, d_qk: int, d_v: int,
                 kv_dtype: str, device: torch.device, seed: int):
        g = torch.Generator(device=device).manual_seed(seed)
        self.page_size = page_size
        self.pool_tokens = pool_tokens
        pages_per_req = pool_tokens // page_size
        num_pages = b_max * pages_per_req
        perm = torch.randperm(num_pages, generator=g, device=device).to(torch.int32)
        self.block_table = perm.view(b_max, pages_per_req).contiguous()
        kv = torch.randn((num_pages * page_size, d_qk), generator=g, device=device,
                         dtype=torch.float32).to(torch.bfloat16)
        self.cache = make_kv_cache(kv, kv_dtype, d_nope=d_v)
        del kv


def _topk_local(b: int, pool_tokens: int, top_k: int, g: torch.Generator, device) -> torch.Tensor:
    """Distinct random request-local positions ``[b, top_k]`` int32."""
    return torch.rand((b, pool_tokens), generator=g, device=device).topk(top_k, dim=1).indices.to(torch.int32)


def run_case(pool: Pool, shape: str, b: int, h: int, top_k: int, d_qk: int, d_v: int,
             kv_dtype: str, variant: str, kwargs: dict, device: torch.device, seed: int,
             repeats: int, use_graph: bool) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn((b, h, d_qk), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    local = _topk_local(b, pool.pool_tokens, top_k, g, device)
    req_id = torch.arange(b, dtype=torch.int32, device=device)
    bt = pool.block_table[:b]
    indices = convert_req_index_to_global_index(req_id, bt, local, pool.page_size)
    idx_ok = torch.equal(indices, convert_req_index_to_global_index_ref(req_id, bt, local, pool.page_size))
    conv_us = time_fn(lambda: convert_req_index_to_global_index(req_id, bt, local, pool.page_size), device,
                      warmup=2, repeats=max(3, repeats // 2)).median_us
    sm_scale = 192 ** -0.5          # DeepSeek-V3.2: qk_head_dim (128 + 64) ** -0.5

    row = {"shape": shape, "B": b, "H": h, "top_k": top_k, "kv_dtype": kv_dtype, "variant": variant,
           "kwargs": kwargs, "index_convert_ok": bool(idx_ok), "index_convert_us": conv_us,
           "num_splits_auto": choose_num_splits(b, h, top_k, block_h=kwargs.get("block_h", 64 if h >= 64 else 16),
                                                block_n=kwargs.get("block_n", 64),
                                                num_sms=(torch.cuda.get_device_properties(device).multi_processor_count
                                                         if device.type == "cuda" else 132))}
    fn = lambda: sparse_mla_decode(q, pool.cache, indices, sm_scale, d_v, **kwargs)  # noqa: E731
    seen = _compiled_keys()
    t0 = time.perf_counter()
    out, lse = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    row["first_call_s"] = time.perf_counter() - t0        # includes compilation
    row["compiled"] = _compiled_resources(exclude=seen)
    ref_out, ref_lse = sparse_mla_decode_ref(q, pool.cache, indices, sm_scale, d_v)
    row["rel_err"] = float((out.float() - ref_out).norm() / ref_out.norm())
    row["lse_err"] = float((lse - ref_lse).abs().max())
    row["finite"] = bool(torch.isfinite(out).all() and torch.isfinite(lse).all())
    del ref_out, ref_lse

    st = time_fn(fn, device, warmup=3, repeats=repeats)
    row.update(us=st.median_us, p10_us=st.p10_us, p90_us=st.p90_us)
    row["graph_us"] = float("nan")
    if use_graph and device.type == "cuda":
        graph, (g_out, g_lse) = capture_graph(fn)
        graph.replay()
        torch.cuda.synchronize()
        row["graph_matches"] = bool(torch.equal(g_out, out) and torch.equal(g_lse, lse))
        gst = time_fn(graph.replay, device, warmup=3, repeats=repeats)
        row["graph_us"] = gst.median_us
        del graph
    # steady-state cost per call of back-to-back calls: max(CPU launch cost, GPU time)
    n_loop = 3 if device.type == "cpu" else 50
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n_loop):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    row["loop_us"] = (time.perf_counter() - t0) / n_loop * 1e6
    t_kernel = row["graph_us"] if row["graph_us"] == row["graph_us"] else row["us"]
    row["tflops"] = flops(b, h, top_k, d_qk, d_v) / (t_kernel * 1e-6) / 1e12
    row["gbps_kv"] = b * top_k * pool.cache.shape[1] * pool.cache.element_size() / (t_kernel * 1e-6) / 1e9
    return row


def _kernel_caches():
    from backends.kernels import sparse_mla_decode as mod
    for fn in (mod._sparse_mla_decode_fwd, mod._sparse_mla_decode_combine):
        for cache in getattr(fn, "device_caches", {}).values():
            kc = cache[0] if isinstance(cache, tuple) else cache
            if isinstance(kc, dict):
                for key, k in kc.items():
                    yield fn.__name__, key, k


def _compiled_keys() -> set:
    try:
        return {(n, str(k)) for n, k, _ in _kernel_caches()}
    except Exception:
        return set()


def _compiled_resources(exclude: set) -> list:
    """Registers / spills / shared memory of the kernels compiled since ``exclude`` was taken."""
    res = []
    try:
        for name, key, k in _kernel_caches():
            if (name, str(key)) in exclude:
                continue
            md = getattr(k, "metadata", None)
            res.append({"kernel": name, "n_regs": getattr(k, "n_regs", None),
                        "n_spills": getattr(k, "n_spills", None),
                        "shared": getattr(md, "shared", None), "num_warps": getattr(md, "num_warps", None),
                        "num_stages": getattr(md, "num_stages", None)})
    except Exception as e:  # diagnostics only
        res.append({"error": repr(e)})
    return res


def _fmt(rows: List[dict]) -> str:
    hdr = (f"{'shape':<18} {'kv':<10} {'variant':<12} {'us':>8} {'loop_us':>8} {'graph_us':>8} "
           f"{'TFLOP/s':>8} {'rel_err':>9} {'lse_err':>9} {'ok':>3}")
    lines = [hdr, "-" * len(hdr)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['shape']:<18} {r['kv_dtype']:<10} {r['variant']:<12} FAILED: {r['error'][:60]}")
            continue
        lines.append(f"{r['shape']:<18} {r['kv_dtype']:<10} {r['variant']:<12} {r['us']:>8.1f} "
                     f"{r['loop_us']:>8.1f} {r['graph_us']:>8.1f} {r['tflops']:>8.1f} {r['rel_err']:>9.2e} {r['lse_err']:>9.2e} "
                     f"{'y' if r['pass'] else 'N':>3}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> List[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes: a smoke run (on the CPU through the Triton interpreter without a GPU)")
    ap.add_argument("--formats", default=",".join(KV_DTYPES), help="comma list of KV formats")
    ap.add_argument("--variants", default="", help="comma list: restrict the variants run")
    ap.add_argument("--shapes", default="", help="comma list: restrict the shapes run")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timing")
    ap.add_argument("--rel-tol", type=float, default=1e-2)
    ap.add_argument("--lse-tol", type=float, default=None,
                    help="max |lse - ref| (default 1e-3 for bf16 rows, 2e-2 for fp8_ds_mla rows, whose "
                         "logits use bf16-rounded dequantized K)")
    args = ap.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.quick:
        print("no CUDA device: running the --quick sizes on the CPU", file=sys.stderr)
        args.quick = True
    d_qk, d_v = (576, 512) if not args.quick else (320, 256)
    pool_tokens, page_size = (32768, 64) if not args.quick else (256, 16)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        keep = set(args.shapes.split(","))
        shapes = [s for s in shapes if s[0] in keep]
    formats = [f for f in args.formats.split(",") if f]
    for f in formats:
        if f not in KV_DTYPES:
            raise SystemExit(f"--formats: unknown KV format {f!r}; allowed {KV_DTYPES}")
    only = set(v for v in args.variants.split(",") if v)
    repeats = 3 if args.quick else args.repeats
    b_max = max(s[1] for s in shapes) if shapes else 1

    rows: List[dict] = []
    t_start = time.perf_counter()
    for fi, kv_dtype in enumerate(formats):
        pool = Pool(b_max, pool_tokens, page_size, d_qk, d_v, kv_dtype, device, seed=1000 + fi)
        for si, (shape, b, h, top_k, variants) in enumerate(shapes):
            for vi, variant in enumerate(variants):
                if only and variant not in only:
                    continue
                kwargs = VARIANTS[variant]
                seed = 10_000 * (fi + 1) + 100 * si + vi
                try:
                    r = run_case(pool, shape, b, h, top_k, d_qk, d_v, kv_dtype, variant, kwargs,
                                 device, seed, repeats, use_graph=not args.no_graph)
                    lse_tol = args.lse_tol if args.lse_tol is not None else LSE_TOL[kv_dtype]
                    r["pass"] = bool(r["finite"] and r["index_convert_ok"] and r["rel_err"] <= args.rel_tol
                                     and r["lse_err"] <= lse_tol)
                except Exception as e:  # a variant that does not compile (e.g. shared memory) is reported
                    traceback.print_exc()
                    r = {"shape": shape, "B": b, "H": h, "top_k": top_k, "kv_dtype": kv_dtype,
                         "variant": variant, "kwargs": kwargs, "error": f"{type(e).__name__}: {e}",
                         "pass": False}
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                rows.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "kwargs"}), flush=True)
        del pool
        if device.type == "cuda":
            torch.cuda.empty_cache()

    env = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
           "torch": torch.__version__, "triton": __import__("triton").__version__,
           "python": platform.python_version(), "quick": args.quick, "d_qk": d_qk, "d_v": d_v,
           "pool_tokens": pool_tokens, "page_size": page_size, "wall_s": time.perf_counter() - t_start}
    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "attention_bench.json"), "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1, default=str)
    print(f"\n# sparse MLA decode, d_qk={d_qk}, d_v={d_v}, {env['device']}, "
          f"torch {env['torch']}, triton {env['triton']}, {env['wall_s']:.0f} s")
    print(_fmt(rows))
    return rows


if __name__ == "__main__":
    main()
