"""Float32 per-token reference of ``RestOfLayer.run`` (``harness/rest_of_layer.py``).

Written from the layer's definition, one token at a time with plain matrix-vector products on
the dequantised float32 weights: no fused GEMM, no batching, no gather / scatter. It keeps the
layer's dtype contract: every GEMM's output, the SiLU and the SiLU x up product are rounded to
bf16 (the layer's activations), and where a matrix is stored in fp8 the GEMM's input is
rounded to e4m3 per token (scale ``amax / 448``), as ``torch._scaled_mm``'s input is. So the
two agree to float32-vs-tensor-core accumulation (and the bf16 combine of the routed outputs).
"""
from __future__ import annotations

from typing import Dict, List

import torch
import torch.nn.functional as F


def _fp8_round(v: torch.Tensor) -> torch.Tensor:
    """A float32 vector rounded to e4m3 with one scale ``amax / 448`` (float32 out)."""
    s = v.abs().max().clamp_min(1e-12) / 448.0
    return (v / s).to(torch.float8_e4m3fn).float() * s


def _bf16(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.bfloat16).float()


def rest_of_layer_ref(layer, x: torch.Tensor, attn_latent: torch.Tensor, routing,
                      tokens: List[int]) -> Dict[str, torch.Tensor]:
    """Float32 outputs of ``layer.run(x, attn_latent)`` for the local tokens ``tokens``.

    ``x`` ``[B, hidden]``, ``attn_latent`` ``[B, H, d_nope]``; ``routing``: the layer's
    ``Routing`` of batch B. Returns the ``RestOfLayerOutput`` fields, each stacked over
    ``tokens`` (``routed_out``: over the received rows ``r`` with ``r mod B`` in ``tokens``,
    ascending).
    """
    m, batch = layer.model, x.shape[0]

    def linear(lin, shape_name: str, v: torch.Tensor) -> torch.Tensor:
        if layer.shapes[shape_name].fp8:
            v = _fp8_round(v)
        return _bf16(lin.float32() @ v)

    def mlp(gate_up, down, prefix: str, v: torch.Tensor) -> torch.Tensor:
        gu = linear(gate_up, f"{prefix}_gate_up", v)
        width = gu.shape[0] // 2
        return linear(down, f"{prefix}_down", _bf16(_bf16(F.silu(gu[:width])) * gu[width:]))

    out: Dict[str, list] = {k: [] for k in ("q_attn", "kv_row", "index_q", "index_k",
                                            "index_weights", "attn_out", "router_logits",
                                            "shared_out", "routed_out")}
    attn_of = {}
    for t in tokens:
        xt = x[t].float()
        qkv = linear(layer.qkv_a, "qkv_a", xt)
        c_q, kv_row = qkv[:m.q_lora_rank], qkv[m.q_lora_rank:]
        q = linear(layer.q_b, "q_b", c_q).view(layer.heads, m.qk_nope_head_dim + m.d_rope)
        w_uk = layer.w_uk.float32()                                  # [H, nope, d_nope]
        absorbed = torch.stack([_bf16(q[h, :m.qk_nope_head_dim] @ w_uk[h])
                                for h in range(layer.heads)])
        out["q_attn"].append(torch.cat([absorbed, q[:, m.qk_nope_head_dim:]], dim=1))
        out["kv_row"].append(kv_row)
        out["index_q"].append(linear(layer.index_q_b, "index_q_b", c_q).view(m.index_heads, m.index_dim))
        out["index_k"].append(linear(layer.index_k, "index_k", xt))
        out["index_weights"].append(linear(layer.index_weights, "index_weights", xt))
        w_uv = layer.w_uv.float32()                                  # [H, d_nope, v_head]
        v = torch.cat([_bf16(attn_latent[t, h].float() @ w_uv[h]) for h in range(layer.heads)])
        attn = linear(layer.o_proj, "o_proj", v)
        attn_of[t] = attn
        out["attn_out"].append(attn)
        out["router_logits"].append(linear(layer.gate, "gate", attn))
        out["shared_out"].append(mlp(layer.shared_gate_up, layer.shared_down, "shared", attn))
    for r in range(routing.experts.shape[0]):
        if r % batch not in attn_of:
            continue
        y = torch.zeros(m.hidden_size, device=x.device)
        for e, w in zip(routing.experts[r].tolist(), routing.weights[r].tolist()):
            if e < routing.n_local:
                gate_up, down = layer.experts[e]
                y += w * mlp(gate_up, down, "expert", attn_of[r % batch])
        out["routed_out"].append(y)
    return {k: torch.stack(v) for k, v in out.items()}
