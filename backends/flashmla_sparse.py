"""vLLM-style FLASHMLA_SPARSE: the whole KV cache lives in GPU memory; the top-k positions are
converted to global slots (``convert_req_index_to_global_index``) and go straight into the
sparse attention kernel, which gathers just those rows. Nothing outside attention knows about
sparsity: no host traffic, no hits or misses.

Decode stages: ``transform`` (request-local positions -> global slots; skipped when a fused
top-k + PAGED transform hands over slots), ``attention``. ``converter=vllm`` runs the transform
through vLLM's own Triton kernel, staged from the vllm wheel (``backends/kernels/vllm_peer.py``),
after checking it equals ours on a random selection of the point's shape.

Extend (prefill) stages, as vLLM's prefill path runs them (``scenario=extend``; the workload is
``harness.scenarios.extend.ExtendWorkload``):

``gather``
    One Triton kernel (``ragged_gather``) reads every request's ``T_r`` tokens through the block
    table and writes (a) the attention KV dequantised to a contiguous bf16 buffer ``[N, d_qk]``,
    ``N = sum_r T_r``, requests concatenated (a shared prefix is gathered once per request, as
    vLLM's ``cp_gather_and_upconvert_fp8_kv_cache`` does), and (b) the fp8 index keys
    ``uint8 [N, index_dim]`` + scales ``float32 [N]`` in the same order
    (``cp_gather_indexer_k_quant_cache``).
``indexer``
    ``indexer_logits_ragged`` over the concatenated index keys: query row ``m`` scores keys
    ``[ks[m], ke[m])``; logits ``float32 [M, max_len]``; the query in the workload's
    ``query_dtype`` (``selection.query_dtype``).
``topk``
    The step's RAGGED top-k plan (``IndexerMetadata.for_extend``, built once per step in
    ``begin_extend_step``): int32 ``[M, top_k]`` rows of the ragged buffer (``-1`` padded).
``attention``
    The sparse attention kernel with the query rows as its batch axis, over the ragged buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch

from backends.attention import resolve_attention
from backends.base import Backend, BackendInvalid, BackendUnavailable, KVLayout
from backends.kernels.index_convert import convert_req_index_to_global_index
from backends.kernels.indexer import indexer_logits_ragged
from backends.kernels.ragged_gather import ragged_gather
from backends.kernels.topk import plan_build_count
from backends.kernels.topk_transform import IndexerMetadata


#: ``flashmla_sparse.converter`` values: ours, or vLLM's own kernel staged from its wheel
CONVERTERS = ("triton", "vllm")


@dataclass
class FlashMLASparseSettings:
    """``flashmla_sparse.*``."""

    converter: str = "triton"   # transform stage: triton (ours) | vllm (vLLM's kernel, backends/kernels/vllm_peer.py)


def make_vllm_converter(req_ids: torch.Tensor, block_table: torch.Tensor, page_size: int,
                        top_k: int, max_pos: int, seed: int) -> Callable:
    """vLLM's staged conversion kernel as ``(req, block_table, positions, page_size) -> slots``,
    after checking that it equals ours on a seeded random selection of this point's shape
    (positions in ``[-1, max_pos)``). BackendUnavailable when not staged; BackendInvalid when
    ``top_k`` is not a multiple of its 128-column tile or the outputs differ."""
    from backends.kernels.flashmla_peer import PeerUnavailable
    from backends.kernels.vllm_peer import BLOCK_N, vllm_convert_req_index_to_global_index
    if top_k % BLOCK_N:
        raise BackendInvalid(f"converter=vllm: vLLM's kernel needs top_k to be a multiple of {BLOCK_N}, got {top_k}")
    dev = block_table.device
    g = torch.Generator(device=dev).manual_seed(seed)
    pos = torch.randint(-1, max_pos, (req_ids.shape[0], top_k), generator=g, device=dev, dtype=torch.int32)
    try:
        theirs = vllm_convert_req_index_to_global_index(req_ids, block_table, pos, page_size)
    except PeerUnavailable as e:
        raise BackendUnavailable(f"converter=vllm: {e}") from e
    ours = convert_req_index_to_global_index(req_ids, block_table, pos, page_size)
    if not torch.equal(theirs, ours):
        raise BackendInvalid(f"converter=vllm: vLLM's kernel disagrees with ours on "
                             f"{int((theirs != ours).sum())} of {ours.numel()} slots")
    return vllm_convert_req_index_to_global_index


class FlashMLASparseBackend(Backend):
    name = "flashmla_sparse"
    settings = FlashMLASparseSettings
    choices = {"converter": CONVERTERS}
    columns = {"converter": "string"}
    variant_axes = ("converter",)
    stages = ("transform", "attention")
    extend_stages = ("gather", "indexer", "topk", "attention")
    phases = ("decode", "extend")
    accepts_slots = True

    @classmethod
    def capacity_bytes(cls, layout: KVLayout, settings, batch_size: int) -> Tuple[int, int]:
        """The whole paged KV pool on the device; nothing on the host."""
        return layout.pool_bytes(batch_size), 0

    def __init__(self, workload, settings=None, *, attention_kernel: str = "triton"):
        super().__init__(workload, settings, attention_kernel=attention_kernel)
        m, dev = workload.model, workload.device
        if workload.phase == "extend":
            self._init_extend()
            rows = self.kv
        else:
            self.req_ids = workload.request_ids()
            rows = workload.kv_flat(0)
        self.convert: Callable = convert_req_index_to_global_index
        if settings is not None and settings.converter == "vllm":
            if workload.phase == "extend":
                raise BackendInvalid("converter=vllm: the extend step has no conversion stage")
            self.convert = make_vllm_converter(
                self.req_ids, workload.block_table, workload.page_size, workload.top_k,
                int(workload.seq_lens.max()), workload.seed)
        self.attention: Callable = resolve_attention(attention_kernel, dev, m.num_heads, m.d_qk, m.d_v, rows)

    # ---- decode ---------------------------------------------------------------------------

    def decode_layer(self, step: int, layer: int, q: torch.Tensor, positions: Optional[torch.Tensor],
                     seq_lens: torch.Tensor, timer, slots: Optional[torch.Tensor] = None
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
        wl = self.wl
        if slots is None:
            slots = timer.run("transform", lambda: self.convert(
                self.req_ids, wl.block_table, positions, wl.page_size))
        return timer.run("attention", lambda: self.attention(
            q, wl.kv_flat(layer), slots, wl.model.sm_scale, d_v=wl.model.d_v))

    # ---- extend ---------------------------------------------------------------------------

    def _init_extend(self) -> None:
        """Allocates the extend step's workspaces: ragged bf16 KV ``[N, d_qk]``, fp8 index keys
        ``uint8 [N, index_dim]`` + scales ``float32 [N]``, logits ``float32 [M, max_len]`` and
        the selection ``int32 [M, top_k]``."""
        ew = self.wl
        m, dev = ew.model, ew.device
        if m.index_dim < 16 or m.index_dim & (m.index_dim - 1):
            raise BackendInvalid(f"model.index_dim={m.index_dim}: the indexer kernel needs a power "
                                 "of two >= 16")
        N, M = ew.num_tokens, ew.num_rows
        self.kv = torch.empty(N, m.d_qk, dtype=torch.bfloat16, device=dev)
        self.keys = torch.empty(N, m.index_dim, dtype=torch.uint8, device=dev)
        self.key_scales = torch.empty(N, dtype=torch.float32, device=dev)
        self.logits = torch.empty(M, ew.max_len, dtype=torch.float32, device=dev)
        self.indices = torch.empty(M, ew.top_k, dtype=torch.int32, device=dev)
        self.meta: Optional[IndexerMetadata] = None
        self.plan_us: List[float] = []    # per step: building the top-k plan (outside the samples)
        self.plan_builds: List[int] = []  # per step: plan_topk calls (1: reused by every layer)

    def workspace_bytes(self) -> int:
        """Bytes of the extend step's device workspaces (ragged KV, index keys, logits, indices)."""
        return sum(t.numel() * t.element_size()
                   for t in (self.kv, self.keys, self.key_scales, self.logits, self.indices))

    def begin_extend_step(self, timer, fuse_topk: bool) -> None:
        """Builds the step's RAGGED top-k plan once (timed on its own, outside the layer samples);
        every layer of the step reuses it."""
        ew = self.wl
        before = plan_build_count()
        timer.begin()
        self.meta = timer.run("plan", lambda: IndexerMetadata.for_extend(
            ew.ks, ew.ke, ew.top_k, max_len=ew.max_len, fuse_topk=fuse_topk))
        self.plan_us.append(timer.end()["plan"])
        self.plan_builds.append(plan_build_count() - before)

    def extend_layer(self, layer: int, q: torch.Tensor, q_idx: torch.Tensor, w_idx: torch.Tensor,
                     timer) -> Tuple[torch.Tensor, torch.Tensor]:
        """One measured extend layer step. q bf16 ``[M, H, d_qk]``; q_idx bf16 ``[M, Hp, D]`` and
        w_idx float32 ``[M, Hp]`` (index heads padded, ``pad_index_heads``). Returns (out bf16
        ``[M, H, d_v]``, lse float32 ``[M, H]``); the selection stays in ``self.indices``."""
        ew, m = self.wl, self.wl.model
        timer.run("gather", lambda: ragged_gather(
            ew.kv_flat(layer), ew.index_caches[layer].data, ew.block_table, ew.total_lens_dev,
            ew.cu_dev, self.kv, self.keys, self.key_scales, page_size=ew.page_size,
            d_nope=m.d_nope, d_rope=m.d_rope, max_len=ew.max_len))
        timer.run("indexer", lambda: indexer_logits_ragged(
            q_idx, w_idx, self.keys, ew.ks, ew.ke, k_scales=self.key_scales, max_len=ew.max_len,
            out=self.logits, query_dtype=ew.query_dtype))
        timer.run("topk", lambda: self.meta.select(self.logits, out=self.indices))
        return timer.run("attention", lambda: self.attention(
            q, self.kv, self.indices, m.sm_scale, d_v=m.d_v))

    # ---- memory ---------------------------------------------------------------------------

    def working_set_bytes(self) -> int:
        if self.wl.phase == "extend":
            return self.wl.cache_bytes() + self.workspace_bytes()
        return self.wl.kv_pool_bytes
