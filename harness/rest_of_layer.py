"""The rest of a DeepSeek-V3.2 MoE decode layer on one GPU: every GEMM of the layer but attention.

Stage ``rest_of_layer`` of the capacity scenario: at decode a serving GPU spends most of each
layer streaming its share of the weights, a cost flat in batch. ``RestOfLayer`` allocates this
GPU's share of one layer's weights (fresh seeded random values) and runs the layer's
non-attention GEMMs for a batch of decode tokens; ``RestOfLayerPlan`` (its base) holds the
shapes, the routing and the byte / FLOP accounting without allocating anything.

Parallel layout (one GPU of ``ep_size`` serving the layer):

* attention is tensor-parallel over ``tp_size`` GPUs and data-parallel over
  ``dp_size = ep_size / tp_size`` groups (``tp_size=1``: DP attention, each GPU its own
  requests; ``tp_size = ep_size``: pure TP attention). vLLM's layout with expert parallelism
  (EP size = TP x DP) and DeepSeek's reference at world size ``ep_size``;
* ``wq_a`` and ``wkv_a`` (fused into one GEMM, as vLLM's ``fused_qkv_a_proj``) replicated;
  ``wq_b`` split over heads (``num_heads / tp_size`` per GPU); ``wkv_b``'s two halves absorbed
  (W_UK applied to ``q_nope``, W_UV to the attention's latent output) split over heads;
  ``wo`` split over its input (heads); its partial sums would be all-reduced over the TP group;
* the indexer's ``wq_b`` (q_lora -> index_heads x index_dim), ``wk`` (hidden -> index_dim)
  and ``weights_proj`` (hidden -> index_heads) replicated, as in DeepSeek's reference and
  vLLM / SGLang (``ReplicatedLinear``);
* MoE: router ``gate`` replicated; ``n_routed_experts / ep_size`` whole routed experts
  (gate and up fused as one ``gate_up`` GEMM, then ``down``); the shared expert split over
  the TP group like a dense MLP (whole when ``tp_size=1``);
* the MLA latent KV is replicated across the TP group (it is not a weight: nothing here).

Tokens. ``batch`` = B decode tokens whose attention this GPU runs (with TP the whole group
runs the same B). The EP group holds ``dp_size x B`` distinct tokens; each picks
``num_experts_per_tok`` distinct experts uniformly at random, seeded by ``(seed, batch)``, with
random combine weights that sum to 1. This GPU (rank 0 by symmetry: experts
``[0, n_routed / ep_size)``) computes the token-expert pairs that land on its experts: about
``B x num_experts_per_tok / tp_size`` of them. Received token ``r`` reads this GPU's row
``r mod B`` (stand-ins for other groups' tokens). The routing is synthetic: the gate GEMM runs
for its cost but its logits do not pick experts, so one batch size always routes the same way
and a step is capturable in a CUDA graph. No communication is modelled or timed (the MoE
all-to-all dispatch / combine, the TP all-reduce after ``wo`` and the shared expert).

Expert GEMMs: this GPU's token-expert pairs are sorted by expert and gathered once; then a
loop over the active experts runs only each one's ``gate_up`` and ``down`` GEMMs on its
contiguous slice (into slices of shared buffers), and the SiLU, the quantisation and the
weighted combine run once for all pairs. An expert that receives no token is not computed and
its weights are not read (``bytes_moved`` counts only the active experts' weights). The step
is timed as CUDA-graph replays (``prepare``), as a serving engine runs it; its small
elementwise kernels (quantisation, SiLU, gathers: about 50 at fp8, 20 at bf16, independent of
the number of experts) are not fused as an engine would fuse them, so measured time sits a
little above what fused kernels would take.

Weights. ``weight_dtype='fp8'``: e4m3 with one fp32 scale per output channel for
``qkv_a``, ``q_b``, ``o_proj``, the indexer's ``wq_b`` and ``wk``, the experts and the shared
expert; each GEMM quantises its bf16 input per token (scale amax / 448) and runs
``torch._scaled_mm`` with row-wise scales, bf16 out (DeepSeek's checkpoint uses 128x128 weight
blocks and 1x128 activation groups: the same bytes within 0.02 %). W_UK / W_UV stay bf16 (vLLM
keeps bf16 copies for the absorbed bmm's), the router gate and the indexer's ``weights_proj``
too (bf16 in DeepSeek's fp8 reference). ``'bf16'``: every weight bf16, ``torch.matmul``.

Not included: RMSNorm / LayerNorm, RoPE, residual adds, the router's top-k, the KV row's
quantisation and cache write, the dense MLP of the first 3 layers (this is a MoE layer).

Accounting (``gemms``): FLOPs ``2 M K N`` per GEMM; bytes = the weights it reads (scales
included) + its input and output activations counted once each at 2 B (bf16); quantisation,
gathers and the SiLU are not counted separately.

``python -m harness.rest_of_layer --batch 8,64,256 --tp 1,8 --dtype fp8,bf16`` checks each
step against the float32 reference and prints weight GB per GPU, measured us (CUDA-graph
replays, cold L2), roofline us and achieved GB/s; ``--quick`` runs the tiny model on the CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from harness.rest_of_layer_ref import rest_of_layer_ref
from harness.timing import capture_graph, time_fn

TP_SIZES = (1, 2, 4, 8)
WEIGHT_DTYPES = ("fp8", "bf16")
FP8 = torch.float8_e4m3fn
#: fp8 GEMMs run on a multiple of this many rows (zero rows padded; cuBLASLt refused some counts)
FP8_ROW_MULTIPLE = 16
FP8_MAX = 448.0
#: matrices stored in e4m3 when weight_dtype='fp8' (the others stay bf16)
FP8_MATRICES = ("qkv_a", "q_b", "o_proj", "index_q_b", "index_k", "shared_gate_up",
                "shared_down", "expert_gate_up", "expert_down")


@dataclass(frozen=True)
class MatrixShape:
    """One weight matrix on this GPU: ``groups`` x ``[in_features, out_features]``."""

    name: str
    in_features: int
    out_features: int
    fp8: bool
    groups: int = 1               # heads of a head-wise (batched) matrix, else 1

    @property
    def nbytes(self) -> int:
        """Bytes on the GPU: 1 B (fp8) or 2 B (bf16) per element, + fp32 scale per output channel (fp8)."""
        n = self.groups * self.in_features * self.out_features
        return n + 4 * self.groups * self.out_features if self.fp8 else 2 * n


@dataclass(frozen=True)
class Gemm:
    """One GEMM of a step: ``m`` tokens through ``shape`` (per group)."""

    m: int
    shape: MatrixShape

    @property
    def flops(self) -> int:
        s = self.shape
        return 2 * s.groups * self.m * s.in_features * s.out_features

    @property
    def bytes(self) -> int:
        """Weights read + bf16 input and output activations."""
        s = self.shape
        return s.nbytes + 2 * s.groups * self.m * (s.in_features + s.out_features)


@dataclass(frozen=True)
class Routing:
    """Uniform seeded routing of one step's ``T = dp_size x batch`` received tokens.

    ``experts`` int64 ``[T, top_k]``: distinct global expert ids per token; ``weights`` float32
    ``[T, top_k]``: combine weights (each row sums to 1); this GPU holds experts ``[0, n_local)``.
    """

    experts: torch.Tensor
    weights: torch.Tensor
    n_local: int

    @property
    def counts(self) -> np.ndarray:
        """int64 ``[n_local]``: tokens routed to each of this GPU's experts."""
        local = self.experts[self.experts < self.n_local]
        return torch.bincount(local, minlength=self.n_local).numpy()

    def local_pairs(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This GPU's token-expert pairs sorted by expert: (expert int64 ``[R]``, received
        row int64 ``[R]``, combine weight float32 ``[R]``)."""
        rows, slot = torch.nonzero(self.experts < self.n_local, as_tuple=True)
        experts = self.experts[rows, slot]
        order = torch.argsort(experts, stable=True)
        return experts[order], rows[order], self.weights[rows, slot][order]


def uniform_routing(num_tokens: int, n_routed: int, top_k: int, n_local: int, seed: int) -> Routing:
    """Each token picks ``top_k`` distinct experts of ``n_routed`` uniformly (CPU generator ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    experts = torch.rand(num_tokens, n_routed, generator=g).argsort(dim=1)[:, :top_k]
    w = torch.rand(num_tokens, top_k, generator=g)
    return Routing(experts.contiguous(), w / w.sum(dim=1, keepdim=True), n_local)


def check_layout(model, tp_size: int, ep_size: int, weight_dtype: str) -> None:
    """Raises ``ValueError`` naming the field and the allowed values."""
    shared = model.n_shared_experts * model.moe_intermediate_size
    if tp_size not in TP_SIZES or model.num_heads % tp_size or shared % tp_size:
        raise ValueError(f"tp_size={tp_size!r}: allowed {TP_SIZES}, dividing model.num_heads "
                         f"({model.num_heads}) and the shared expert's width ({shared})")
    if (not isinstance(ep_size, int) or ep_size < 1 or ep_size % tp_size
            or model.n_routed_experts % ep_size):
        raise ValueError(f"ep_size={ep_size!r}: allowed a multiple of tp_size ({tp_size}: the EP "
                         f"group is tp_size x DP attention groups) that divides "
                         f"model.n_routed_experts ({model.n_routed_experts})")
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype={weight_dtype!r}: allowed {WEIGHT_DTYPES}")


def _check_batch(batch: int) -> None:
    if not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch={batch!r}: allowed a positive integer (decode tokens on this GPU)")


class RestOfLayerPlan:
    """Shapes, layout, routing and accounting of one GPU's share of a MoE decode layer.

    ``model``: a ``ModelConfig`` (or anything with its fields). Allocates nothing, so the
    accounting of the full model is available on any machine.
    """

    def __init__(self, model, *, tp_size: int, ep_size: int, weight_dtype: str, seed: int = 0):
        check_layout(model, tp_size, ep_size, weight_dtype)
        self.model = model
        self.tp_size, self.ep_size, self.weight_dtype, self.seed = tp_size, ep_size, weight_dtype, seed
        self.dp_size = ep_size // tp_size
        self.heads = model.num_heads // tp_size
        self.n_local_experts = model.n_routed_experts // ep_size
        self.shared_width = model.n_shared_experts * model.moe_intermediate_size // tp_size
        m, h = model, self.heads
        q_head = m.qk_nope_head_dim + m.d_rope
        spec = {  # name: (in_features, out_features, groups)
            "qkv_a": (m.hidden_size, m.q_lora_rank + m.d_nope + m.d_rope, 1),
            "q_b": (m.q_lora_rank, h * q_head, 1),
            "w_uk": (m.qk_nope_head_dim, m.d_nope, h),
            "index_q_b": (m.q_lora_rank, m.index_heads * m.index_dim, 1),
            "index_k": (m.hidden_size, m.index_dim, 1),
            "index_weights": (m.hidden_size, m.index_heads, 1),
            "w_uv": (m.d_nope, m.v_head_dim, h),
            "o_proj": (h * m.v_head_dim, m.hidden_size, 1),
            "gate": (m.hidden_size, m.n_routed_experts, 1),
            "shared_gate_up": (m.hidden_size, 2 * self.shared_width, 1),
            "shared_down": (self.shared_width, m.hidden_size, 1),
            "expert_gate_up": (m.hidden_size, 2 * m.moe_intermediate_size, 1),
            "expert_down": (m.moe_intermediate_size, m.hidden_size, 1),
        }
        fp8 = weight_dtype == "fp8"
        self.shapes: Dict[str, MatrixShape] = {
            k: MatrixShape(k, i, o, fp8 and k in FP8_MATRICES, g) for k, (i, o, g) in spec.items()}
        self._routing: Dict[int, Routing] = {}

    def layout(self) -> Dict[str, object]:
        """The layout as flat fields (for result rows)."""
        return dict(tp_size=self.tp_size, ep_size=self.ep_size, dp_size=self.dp_size,
                    heads_per_gpu=self.heads, experts_per_gpu=self.n_local_experts,
                    weight_dtype=self.weight_dtype, weight_bytes=self.weight_bytes())

    def weight_bytes(self) -> int:
        """Bytes of this GPU's share of the layer's weights (all local experts, scales included)."""
        s = self.shapes
        per_expert = s["expert_gate_up"].nbytes + s["expert_down"].nbytes
        return (sum(v.nbytes for k, v in s.items() if not k.startswith("expert_"))
                + self.n_local_experts * per_expert)

    def routing(self, batch: int) -> Routing:
        """The seeded routing of a step of ``batch`` tokens (the same for every call)."""
        _check_batch(batch)
        if batch not in self._routing:
            m = self.model
            self._routing[batch] = uniform_routing(
                self.dp_size * batch, m.n_routed_experts, m.num_experts_per_tok,
                self.n_local_experts, seed=self.seed * 1_000_003 + batch)
        return self._routing[batch]

    def expert_token_counts(self, batch: int) -> np.ndarray:
        """int64 ``[n_routed_experts / ep_size]``: tokens each of this GPU's experts receives."""
        return self.routing(batch).counts

    def gemms(self, batch: int) -> List[Gemm]:
        """The GEMMs of one step of ``batch`` tokens, in execution order (active experts only)."""
        s = self.shapes
        dense = [Gemm(batch, s[k]) for k in ("qkv_a", "q_b", "w_uk", "index_q_b", "index_k",
                                             "index_weights", "w_uv", "o_proj", "gate",
                                             "shared_gate_up", "shared_down")]
        experts = [Gemm(int(c), s[k]) for c in self.expert_token_counts(batch) if c
                   for k in ("expert_gate_up", "expert_down")]
        return dense + experts

    def flops(self, batch: int) -> int:
        return sum(g.flops for g in self.gemms(batch))

    def bytes_moved(self, batch: int) -> int:
        """Bytes one step reads and writes: the weights actually read + activations."""
        return sum(g.bytes for g in self.gemms(batch))

    def roofline_us(self, batch: int, hbm_gbps: float, tflops: float,
                    fp8_tflops: Optional[float] = None) -> float:
        """max(bytes / bandwidth, FLOPs / compute) in us at the given ceilings.

        ``hbm_gbps`` GB/s; ``tflops`` TFLOP/s of the bf16 GEMMs; ``fp8_tflops`` of the fp8 ones
        (default ``2 x tflops``: Hopper's dense fp8 tensor-core peak is twice bf16's).
        """
        fp8_tflops = 2 * tflops if fp8_tflops is None else fp8_tflops
        gemms = self.gemms(batch)
        compute = sum(g.flops / (fp8_tflops if g.shape.fp8 else tflops) for g in gemms) / 1e6
        memory = sum(g.bytes for g in gemms) / (hbm_gbps * 1e3)
        return max(memory, compute)


@dataclass
class RestOfLayerOutput:
    """What one step produces (bf16; B = batch, H = heads per GPU, T = dp_size x B).

    ``q_attn`` ``[B, H, d_nope + d_rope]``: the absorbed MQA query for sparse attention;
    ``kv_row`` ``[B, d_nope + d_rope]``: the new latent KV row (before norm / RoPE);
    ``index_q`` ``[B, index_heads, index_dim]``, ``index_k`` ``[B, index_dim]``,
    ``index_weights`` ``[B, index_heads]``: the indexer's inputs;
    ``attn_out`` ``[B, hidden]``: ``wo`` of W_UV(attention output) (this GPU's partial sum
    when ``tp_size > 1``), the MoE's input; ``router_logits`` ``[B, n_routed_experts]``;
    ``shared_out`` ``[B, hidden]``; ``routed_out`` ``[T, hidden]``: this GPU's experts'
    weighted outputs per received token (0 where none of its experts was picked).
    """

    q_attn: torch.Tensor
    kv_row: torch.Tensor
    index_q: torch.Tensor
    index_k: torch.Tensor
    index_weights: torch.Tensor
    attn_out: torch.Tensor
    router_logits: torch.Tensor
    shared_out: torch.Tensor
    routed_out: torch.Tensor


class Fp8Rows(NamedTuple):
    """Activations quantised per token: ``data`` e4m3 ``[M, K]``, ``scale`` fp32 ``[M, 1]``."""

    data: torch.Tensor
    scale: torch.Tensor


def quantize_rows(x: torch.Tensor) -> Fp8Rows:
    """bf16 ``[M, K]`` -> e4m3 with one scale per row (``amax / 448``)."""
    scale = torch.linalg.vector_norm(x, float("inf"), dim=1, keepdim=True, dtype=torch.float32)
    scale = scale.div_(FP8_MAX).clamp_min_(1e-12)
    return Fp8Rows(torch.div(x, scale).to(FP8), scale)


def gather_rows(a, index: torch.Tensor):
    """Rows ``index`` of a bf16 tensor or of ``Fp8Rows``."""
    if isinstance(a, Fp8Rows):
        return Fp8Rows(a.data.view(torch.uint8).index_select(0, index).view(FP8),
                       a.scale.index_select(0, index))
    return a.index_select(0, index)


def slice_rows(a, start: int, stop: int):
    """Rows ``[start, stop)`` (a view) of a bf16 tensor or of ``Fp8Rows``."""
    if isinstance(a, Fp8Rows):
        return Fp8Rows(a.data[start:stop], a.scale[start:stop])
    return a[start:stop]


class Linear:
    """``y [M, out] = x [M, in] @ W``, bf16 out (into ``out`` when given); W fresh ``N(0, 1 / in)``.

    fp8: W e4m3 ``[out, in]`` with an fp32 scale per output channel; x ``Fp8Rows`` (or bf16,
    then quantised here); ``torch._scaled_mm`` with row-wise scales. bf16: W bf16
    ``[out, in]``, x bf16, ``x @ W.T``.
    """

    def __init__(self, shape: MatrixShape, device: torch.device, gen: torch.Generator):
        w = torch.randn(shape.out_features, shape.in_features, generator=gen, device=device)
        w /= math.sqrt(shape.in_features)
        if shape.fp8:
            self.scale = w.abs().amax(dim=1) / FP8_MAX              # fp32 [out]
            self.weight = (w / self.scale[:, None]).to(FP8)
        else:
            self.scale = None
            self.weight = w.to(torch.bfloat16)

    def __call__(self, x, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.scale is None:
            return torch.mm(x, self.weight.t(), out=out)
        if not isinstance(x, Fp8Rows):
            x = quantize_rows(x)
        m = x.data.shape[0]
        misaligned = any(t is not None and t.data_ptr() % 16 for t in (x.data, x.scale, out))
        if m % FP8_ROW_MULTIPLE or misaligned:
            # cuBLASLt's fp8 GEMM wants 16-byte aligned operands and scales (an expert's slice of
            # the routed rows often is not) and refuses some row counts: fresh, padded copies
            pad = -m % FP8_ROW_MULTIPLE
            data = torch.cat([x.data.view(torch.uint8), x.data.new_zeros(pad, x.data.shape[1]).view(torch.uint8)]).view(FP8)
            scale = torch.cat([x.scale, x.scale.new_ones(pad, 1)])
            y = torch._scaled_mm(data, self.weight.t(), scale_a=scale, scale_b=self.scale.view(1, -1),
                                 out_dtype=torch.bfloat16)[:m]
            return y if out is None else out.copy_(y)
        return torch._scaled_mm(x.data, self.weight.t(), scale_a=x.scale,
                                scale_b=self.scale.view(1, -1), out_dtype=torch.bfloat16, out=out)

    def float32(self) -> torch.Tensor:
        """The weight as float32 ``[out, in]`` (dequantised)."""
        w = self.weight.float()
        return w if self.scale is None else w * self.scale[:, None]

    def tensors(self) -> List[torch.Tensor]:
        return [self.weight] + ([self.scale] if self.scale is not None else [])


class HeadwiseLinear:
    """``y [B, H, out] = x [B, H, in] @ W[h]`` per head, bf16 (W ``[H, in, out]``, ``N(0, 1 / in)``)."""

    def __init__(self, shape: MatrixShape, device: torch.device, gen: torch.Generator):
        w = torch.randn(shape.groups, shape.in_features, shape.out_features, generator=gen,
                        device=device)
        self.weight = (w / math.sqrt(shape.in_features)).to(torch.bfloat16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x.transpose(0, 1), self.weight).transpose(0, 1)

    def float32(self) -> torch.Tensor:
        return self.weight.float()

    def tensors(self) -> List[torch.Tensor]:
        return [self.weight]


@dataclass(frozen=True)
class ExpertBatch:
    """A step's token-expert pairs on this GPU, sorted by expert (device tensors, R pairs).

    ``dest`` int64 ``[R]``: received row of each pair; ``src`` int64 ``[R]``: the local row it
    reads (``dest mod B``); ``weight`` bf16 ``[R, 1]``: its combine weight; ``segments``:
    ``(local expert, first pair, pairs)`` of each active expert, contiguous in pair order.
    """

    dest: torch.Tensor
    src: torch.Tensor
    weight: torch.Tensor
    segments: Tuple[Tuple[int, int, int], ...]


def check_scaled_mm(device: torch.device) -> None:
    """Raises ``ValueError`` when ``torch._scaled_mm`` with row-wise scales does not run on ``device``."""
    try:
        a = torch.ones(16, 32, device=device).to(FP8)
        b = torch.ones(16, 32, device=device).to(FP8)
        torch._scaled_mm(a, b.t(), scale_a=torch.ones(16, 1, device=device),
                         scale_b=torch.ones(1, 16, device=device), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as e:
        raise ValueError(f"weight_dtype='fp8': torch._scaled_mm with row-wise scales does not run "
                         f"on {device} ({str(e).splitlines()[0]}); allowed there: 'bf16'") from e


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of a fused ``[M, 2 I]`` gate_up output -> ``[M, I]``."""
    width = gate_up.shape[1] // 2
    return F.silu(gate_up[:, :width]) * gate_up[:, width:]


class RestOfLayer(RestOfLayerPlan):
    """This GPU's share of one MoE decode layer's weights, and the step that runs its GEMMs.

    ``weight_dtype`` ``'fp8'`` or ``'bf16'``; ``device`` where the weights live; ``seed`` seeds
    the weights (device generator), the step inputs and the routing. ``gemm`` records how the
    fp8 / bf16 GEMMs ran.
    """

    def __init__(self, model, *, tp_size: int, ep_size: int, weight_dtype: str,
                 device: torch.device | str, seed: int = 0):
        super().__init__(model, tp_size=tp_size, ep_size=ep_size, weight_dtype=weight_dtype,
                         seed=seed)
        self.device = torch.device(device)
        if weight_dtype == "fp8":
            check_scaled_mm(self.device)
        self.gemm = "scaled_mm_fp8_rowwise" if weight_dtype == "fp8" else "matmul_bf16"
        gen = torch.Generator(device=self.device).manual_seed(seed)
        s = self.shapes
        self.w_uk = HeadwiseLinear(s["w_uk"], self.device, gen)
        self.w_uv = HeadwiseLinear(s["w_uv"], self.device, gen)
        for k in ("qkv_a", "q_b", "index_q_b", "index_k", "index_weights", "o_proj", "gate",
                  "shared_gate_up", "shared_down"):
            setattr(self, k, Linear(s[k], self.device, gen))
        self.experts = [(Linear(s["expert_gate_up"], self.device, gen),
                         Linear(s["expert_down"], self.device, gen))
                        for _ in range(self.n_local_experts)]
        self._inputs: Dict[int, tuple] = {}

    def allocated_bytes(self) -> int:
        """Bytes of the weight tensors actually allocated (equals ``weight_bytes()``)."""
        mats = [self.w_uk, self.w_uv, self.qkv_a, self.q_b, self.index_q_b, self.index_k,
                self.index_weights, self.o_proj, self.gate, self.shared_gate_up, self.shared_down]
        mats += [lin for pair in self.experts for lin in pair]
        return sum(t.numel() * t.element_size() for lin in mats for t in lin.tensors())

    def inputs(self, batch: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Seeded step inputs: ``x`` bf16 ``[B, hidden]`` (the layer's normed input) and
        ``attn_latent`` bf16 ``[B, H, d_nope]`` (the sparse attention's latent output)."""
        return self._step_inputs(batch)[:2]

    def _step_inputs(self, batch: int) -> tuple:
        _check_batch(batch)
        if batch not in self._inputs:
            m = self.model
            gen = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + batch)
            x = torch.randn(batch, m.hidden_size, generator=gen, device=self.device)
            lat = torch.randn(batch, self.heads, m.d_nope, generator=gen, device=self.device)
            experts, dest, w = self.routing(batch).local_pairs()
            counts = torch.bincount(experts, minlength=self.n_local_experts).tolist()
            starts = np.cumsum([0] + counts[:-1]).tolist()
            pairs = ExpertBatch(dest.to(self.device), (dest % batch).to(self.device),
                                w.to(self.device, torch.bfloat16)[:, None],
                                tuple((e, starts[e], c) for e, c in enumerate(counts) if c))
            self._inputs[batch] = (x.to(torch.bfloat16), lat.to(torch.bfloat16), pairs)
        return self._inputs[batch]

    def run(self, x: torch.Tensor, attn_latent: torch.Tensor) -> RestOfLayerOutput:
        """One step on ``x`` bf16 ``[B, hidden]`` and ``attn_latent`` bf16 ``[B, H, d_nope]``,
        routed by ``routing(B)``."""
        m, batch = self.model, x.shape[0]
        if tuple(x.shape) != (batch, m.hidden_size) or tuple(attn_latent.shape) != (
                batch, self.heads, m.d_nope):
            raise ValueError(f"x {tuple(x.shape)} / attn_latent {tuple(attn_latent.shape)}: "
                             f"allowed [B, {m.hidden_size}] / [B, {self.heads}, {m.d_nope}]")
        pairs = self._step_inputs(batch)[2]
        xa = self._activation(x)
        qkv = self.qkv_a(xa)
        c_q, kv_row = qkv[:, :m.q_lora_rank], qkv[:, m.q_lora_rank:]
        cqa = self._activation(c_q)
        q = self.q_b(cqa).view(batch, self.heads, m.qk_nope_head_dim + m.d_rope)
        q_attn = torch.cat([self.w_uk(q[..., :m.qk_nope_head_dim]), q[..., m.qk_nope_head_dim:]], -1)
        index_q = self.index_q_b(cqa).view(batch, m.index_heads, m.index_dim)
        index_k, index_weights = self.index_k(xa), self.index_weights(x)
        attn_out = self.o_proj(self._activation(self.w_uv(attn_latent).reshape(batch, -1)))
        router_logits = self.gate(attn_out)
        ha = self._activation(attn_out)
        shared_out = self.shared_down(self._activation(silu_mul(self.shared_gate_up(ha))))
        return RestOfLayerOutput(q_attn, kv_row, index_q, index_k, index_weights, attn_out,
                                 router_logits, shared_out, self._routed(ha, pairs, batch))

    def _activation(self, x: torch.Tensor):
        """A GEMM input as the weights want it: ``Fp8Rows`` (fp8; shared by the GEMMs that
        read it) or bf16 as it is."""
        return quantize_rows(x) if self.weight_dtype == "fp8" else x

    def _routed(self, ha, pairs: ExpertBatch, batch: int) -> torch.Tensor:
        """This GPU's experts on their pairs: one gather, then per active expert only its
        ``gate_up`` and ``down`` GEMMs (into slices of shared buffers), the SiLU, quantisation
        and weighted combine once for all pairs. bf16 ``[dp_size x B, hidden]``."""
        m, n_pairs = self.model, pairs.dest.numel()
        a = gather_rows(ha, pairs.src)
        gate_up = torch.empty(n_pairs, 2 * m.moe_intermediate_size, dtype=torch.bfloat16,
                              device=self.device)
        for e, start, count in pairs.segments:
            self.experts[e][0](slice_rows(a, start, start + count), out=gate_up[start:start + count])
        act = self._activation(silu_mul(gate_up))
        down = torch.empty(n_pairs, m.hidden_size, dtype=torch.bfloat16, device=self.device)
        for e, start, count in pairs.segments:
            self.experts[e][1](slice_rows(act, start, start + count), out=down[start:start + count])
        routed = torch.zeros(self.dp_size * batch, m.hidden_size, dtype=torch.bfloat16,
                             device=self.device)
        return routed.index_add_(0, pairs.dest, down * pairs.weight)

    def step(self, batch: int) -> RestOfLayerOutput:
        """One step of ``batch`` tokens on the seeded inputs and routing of that batch size."""
        x, lat, _ = self._step_inputs(batch)
        return self.run(x, lat)

    def prepare(self, batch: int) -> Callable[[], RestOfLayerOutput]:
        """The step of ``batch`` as a zero-argument callable to time.

        CUDA: one CUDA-graph replay of the step (as a serving engine runs it; from Python the
        ~6 launches per active expert would make it host-bound); each call returns the same
        output tensors, rewritten. Elsewhere: the eager ``step``.
        """
        self._step_inputs(batch)               # allocated before any capture
        if self.device.type != "cuda":
            return lambda: self.step(batch)
        graph, out = capture_graph(lambda: self.step(batch))

        def replay() -> RestOfLayerOutput:
            graph.replay()
            return out
        return replay


# ---------------------------------------------------------------------------------------------
# CLI: python -m harness.rest_of_layer


def relative_errors(out: RestOfLayerOutput, ref: Dict[str, torch.Tensor], tokens: List[int],
                    rows: List[int]) -> Dict[str, float]:
    """``||out - ref|| / ||ref||`` per output, on the reference's tokens / received rows."""
    errs = {}
    for name, r in ref.items():
        o = getattr(out, name)[rows if name == "routed_out" else tokens].float()
        errs[name] = float((o - r).norm() / r.norm().clamp_min(1e-30))
    return errs


def _ints(text: str) -> List[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv: Optional[List[str]] = None) -> List[dict]:
    from harness.ceilings import measure
    from harness.config import ModelConfig, load_model_preset

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="8,64,256", help="comma list of decode tokens per GPU")
    ap.add_argument("--tp", default="1,8", help="comma list of attention TP sizes")
    ap.add_argument("--ep", type=int, default=8, help="EP size (GPUs serving the layer)")
    ap.add_argument("--dtype", default="fp8,bf16", help="comma list of weight dtypes")
    ap.add_argument("--model", default=None, choices=("dsv32", "tiny"),
                    help="default: dsv32 with CUDA, else tiny")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rel-tol", type=float, default=0.03, help="max relative error vs float32 reference")
    ap.add_argument("--quick", action="store_true", help="tiny model, batches 2,8, 3 repeats (CPU smoke run)")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.quick:
        args.model, args.repeats = "tiny", 3
        if args.batch == ap.get_default("batch"):
            args.batch = "2,8"
    name = args.model or ("dsv32" if device.type == "cuda" else "tiny")
    preset = load_model_preset(name)
    model = ModelConfig(**preset)
    points = [(tp, dtype) for tp in _ints(args.tp) for dtype in args.dtype.split(",") if dtype]
    batches = _ints(args.batch)
    try:                                       # every bad value before anything runs
        for tp, dtype in points:
            check_layout(model, tp, args.ep, dtype)
        for batch in batches:
            _check_batch(batch)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    ceil = measure(device)
    rows: List[dict] = []
    for tp, dtype in points:
        layer = RestOfLayer(model, tp_size=tp, ep_size=args.ep, weight_dtype=dtype,
                            device=device, seed=args.seed)
        for batch in batches:
            tokens = sorted({0, batch - 1})
            recv = [r for r in range(layer.dp_size * batch) if r % batch in tokens]
            ref = rest_of_layer_ref(layer, *layer.inputs(batch), layer.routing(batch), tokens)
            errs = relative_errors(layer.step(batch), ref, tokens, recv)
            worst = max(errs, key=errs.get)
            ok = errs[worst] <= args.rel_tol
            row = dict(model=name, device=str(device), gemm=layer.gemm, batch=batch,
                       **layer.layout(), weight_gb=layer.weight_bytes() / 1e9,
                       active_experts=int((layer.expert_token_counts(batch) > 0).sum()),
                       routed_tokens=int(layer.expert_token_counts(batch).sum()),
                       bytes_moved=layer.bytes_moved(batch), flops=layer.flops(batch),
                       max_rel_err=errs[worst], worst_output=worst,
                       status="ok" if ok else "incorrect", **ceil.as_columns())
            row["roofline_us"] = layer.roofline_us(batch, ceil.hbm_gbps, ceil.bf16_tflops)
            if ok:
                st = time_fn(layer.prepare(batch), device, warmup=args.warmup,
                             repeats=args.repeats)
                row.update(us=st.median_us, p10_us=st.p10_us, p90_us=st.p90_us,
                           achieved_gbps=row["bytes_moved"] / (st.median_us * 1e3))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del layer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"\nrest of layer, model={name}, ep_size={args.ep}, device={device} "
          f"(roofline: HBM copy {ceil.hbm_gbps:.0f} GB/s, bf16 {ceil.bf16_tflops:.0f} TFLOP/s, fp8 2x)")
    print(f"{'tp':>3} {'dtype':>5} {'batch':>6} {'weight GB':>9} {'read GB':>8} {'experts':>7} "
          f"{'us':>8} {'roofline us':>11} {'GB/s':>7} {'rel err':>8} status")
    for r in rows:
        print(f"{r['tp_size']:>3} {r['weight_dtype']:>5} {r['batch']:>6} {r['weight_gb']:>9.3f} "
              f"{r['bytes_moved'] / 1e9:>8.3f} {r['active_experts']:>7} {r.get('us', float('nan')):>8.1f} "
              f"{r['roofline_us']:>11.1f} {r.get('achieved_gbps', float('nan')):>7.0f} "
              f"{r['max_rel_err']:>8.4f} {r['status']}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "rest_of_layer_bench.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    rows = main()
    sys.exit(0 if all(r["status"] == "ok" for r in rows) else 1)
