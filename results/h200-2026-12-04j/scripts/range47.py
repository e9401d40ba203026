"""fp8_ds_mla tiles whose scale is 2^8 or more (tile maxima from 448 x 2^8 = 114688): does each
decode stay finite? Ours (Triton: float32 dequantization; ws: bf16 dequantization by bit moves,
the scale x 2^120 as bf16) and FlashMLA (same process) against the float32 reference, rows of
about base x (1 + N(0, 0.1)) with the scores kept by sm_scale. Prints one line a kernel a base."""
import torch

from backends.kernels.kv_format import make_kv_cache
from backends.kernels.sparse_mla_decode import sparse_mla_decode
from harness.reference import sparse_mla_decode_ref

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(47)
b, h, k, n = 2, 128, 1024, 8192
q = torch.randn(b, h, 576, generator=g, device=dev).to(torch.bfloat16)
noise = torch.randn(n, 576, generator=g, device=dev) * 0.1
idx = torch.randint(0, n, (b, k), generator=g, device=dev, dtype=torch.int32)
kernels = {"triton": lambda *a: sparse_mla_decode(*a),
           "ws_f32p": lambda *a: sparse_mla_decode(*a, kernel="ws"),
           "ws_f16p": lambda *a: sparse_mla_decode(*a, kernel="ws", split_partials="float16")}
try:
    from backends.kernels.flashmla_peer import flashmla_attention
    kernels["flashmla"] = flashmla_attention(dev)
except Exception as e:      # the peer is optional
    print("flashmla unavailable:", e)
for log2_base in (14, 16, 17, 18, 20):
    base = 2.0 ** log2_base
    rows = ((1.0 + noise) * base).to(torch.bfloat16)
    cache = make_kv_cache(rows, "fp8_ds_mla", d_nope=512)
    scale_max = cache[:, 512:528].contiguous().view(torch.float32).max().item()
    sm = 576 ** -0.5 / base
    ref, _ = sparse_mla_decode_ref(q, cache, idx, sm, 512)
    for name, fn in kernels.items():
        try:
            out, _ = fn(q, cache, idx, sm, 512)
            o = out.float()
            fin = torch.isfinite(o).float().mean().item()
            err = ((torch.nan_to_num(o) - ref).norm() / ref.norm()).item()
            print(f"base 2^{log2_base} scale_max {scale_max:.4g} {name}: finite {fin:.3f} rel_err {err:.3g}")
        except Exception as e:
            print(f"base 2^{log2_base} {name}: error {type(e).__name__}: {e}")
