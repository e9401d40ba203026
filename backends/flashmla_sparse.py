"""vLLM-style FLASHMLA_SPARSE: the whole KV cache lives in GPU memory; the top-k positions are
converted to global slots (``convert_req_index_to_global_index``) and go straight into the
sparse attention kernel, which gathers just those rows. Nothing outside attention knows about
sparsity: no host traffic, no hits or misses.

Stages: ``transform`` (request-local positions -> global slots), ``attention``.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from backends.attention import resolve_attention
from backends.base import Backend
from backends.kernels.index_convert import convert_req_index_to_global_index
from harness.timing import StageTimer
from harness.workload import Workload


class FlashMLASparseBackend(Backend):
    name = "flashmla_sparse"
    stages = ("transform", "attention")
    accepts_slots = True

    def __init__(self, workload: Workload, options: Dict[str, object]):
        super().__init__(workload, options)
        self.req_ids = workload.request_ids()
        m = workload.model
        self.attention = resolve_attention(str(options.get("attention_kernel", "triton")), workload.device,
                                           m.num_heads, m.d_qk, m.d_v, workload.kv_flat(0))

    def decode_layer(self, step: int, layer: int, q: torch.Tensor, positions: Optional[torch.Tensor],
                     seq_lens: torch.Tensor, timer: StageTimer,
                     slots: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        wl = self.wl
        if slots is None:
            slots = timer.run("transform", lambda: convert_req_index_to_global_index(
                self.req_ids, wl.block_table, positions, wl.page_size))
        return timer.run("attention", lambda: self.attention(
            q, wl.kv_flat(layer), slots, wl.model.sm_scale, d_v=wl.model.d_v))

    def working_set_bytes(self) -> int:
        return self.wl.kv_pool_bytes
