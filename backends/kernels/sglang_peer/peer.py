"""``SGLangHiSparsePeer``: upstream's swap-in kernel driving the host and device pools of one of
our ``HiSparseCoordinator``s, with upstream's state kept beside them (``state.py``)."""
from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported
from backends.kernels.sglang_peer.binding import SGLangSwapInKernel
from backends.kernels.sglang_peer.build import DEFAULT_BLOCK_SIZE, KernelConfig
from backends.kernels.sglang_peer.staging import DEFAULT_BUILD_DIR
from backends.kernels.sglang_peer.state import (canonical_selection, device_buffer_locs,
                                                from_upstream_state, host_cache_locs,
                                                to_upstream_state, uncanonical)


class SGLangHiSparsePeer:
    """Upstream's swap-in kernel driving the host and device pools of a ``HiSparseCoordinator``.

    The peer keeps upstream's state (tokens, int16 LRU, locs, host locs; package docstring) for
    every (layer, request) and writes the missed rows into ``pools.device_kv`` from
    ``pools.host_kv``. ``pools``' own slot maps are only read: by ``sync_from`` (lockstep
    comparisons, ``harness.sglang_model.compare_step``) and, for requests that have not been
    long yet, by ``begin_step`` (set-up grows them in position order, as upstream's coordinator
    does).
    Free-running use: ``pools.prefill`` then ``peer.prefill``; per step ``pools.begin_step`` then
    ``peer.begin_step`` (same arguments), then ``peer.swap_in`` per layer (no host sync). Use a
    coordinator of its own as ``pools`` (same config and seed as ours gives identical pools).
    Token mode only; raises PeerUnavailable without CUDA (unless a ``kernel`` stand-in with
    ``SGLangSwapInKernel.launch``'s protocol is given, such as ``harness.sglang_model``'s
    ``ModelSwapInKernel``).
    """

    def __init__(self, pools, *, block_size: int = DEFAULT_BLOCK_SIZE, build: bool = True,
                 build_dir: os.PathLike = DEFAULT_BUILD_DIR, kernel=None, **build_kw):
        if kernel is None and (pools.device.type != "cuda" or not torch.cuda.is_available()):
            raise PeerUnavailable("SGLang's swap-in kernel needs a CUDA coordinator")
        if pools.page_mode:
            raise PeerUnsupported("upstream's kernel is token-granular; load_granularity='page' "
                                  "has no upstream counterpart")
        if pools.row_bytes % 16:
            raise PeerUnsupported(f"row_bytes {pools.row_bytes} is not a multiple of 16")
        self.pools = pools
        self.cfg = KernelConfig(pools.top_k, pools.device_buffer_size, block_size)
        self.cfg.validate()
        self.kernel = kernel if kernel is not None else SGLangSwapInKernel.load(
            self.cfg, build=build, build_dir=build_dir, **build_kw)
        R, D, P, K = pools.max_requests, pools.device_buffer_size, pools.page_size, pools.top_k
        dev = pools.device
        self.tokens, self.lru_slots = to_upstream_state(pools.slot_unit, pools.lru, P)
        self.locs = device_buffer_locs(R, D, P, dev)
        self.host_locs: Optional[torch.Tensor] = None
        self.refresh_host_locs()
        self.out = torch.full((R, K), -1, dtype=torch.int32, device=dev)
        self.miss_src = torch.zeros((R, K), dtype=torch.int64, device=dev)
        self.miss_dst = torch.zeros((R, K), dtype=torch.int32, device=dev)
        self.miss_count = torch.zeros(R, dtype=torch.int32, device=dev)
        self.num_real = torch.zeros(1, dtype=torch.int32, device=dev)
        self._long_seen = np.zeros(R, dtype=bool)
        self.last_where: Optional[torch.Tensor] = None
        self.last_selection: Optional[torch.Tensor] = None   # what the kernel last saw

    # ---- state
    def sync_from(self, coord, layers=None, reqs=None) -> None:
        """Copies a coordinator's slot maps and LRU orders (ours) into upstream's layout."""
        layers = range(coord.num_layers) if layers is None else layers
        reqs = slice(None) if reqs is None else torch.as_tensor(list(reqs), dtype=torch.long)
        for layer in layers:
            self.load_state(layer, coord.slot_unit[layer][reqs], coord.lru[layer][reqs], reqs)
        self.refresh_host_locs()

    def load_state(self, layer: int, slot_unit: torch.Tensor, lru: torch.Tensor,
                   reqs=slice(None)) -> None:
        """Sets the hot-buffer state of ``layer`` for requests ``reqs`` from ours: ``slot_unit``
        and ``lru`` int32 ``[len(reqs), D]`` (position per slot; slots least recent first)."""
        tok, lru16 = to_upstream_state(slot_unit, lru, self.pools.page_size)
        self.tokens[layer][reqs] = tok.to(self.tokens.device)
        self.lru_slots[layer][reqs] = lru16.to(self.lru_slots.device)

    def refresh_host_locs(self) -> None:
        """Re-reads the host page table of ``pools`` (after ``load_host_kv`` allocated pages),
        in place: a captured CUDA graph keeps reading the same buffer."""
        locs = host_cache_locs(self.pools.host_page_table, self.pools.page_size)
        if self.host_locs is not None and self.host_locs.shape == locs.shape:
            self.host_locs.copy_(locs)
        else:
            self.host_locs = locs

    def prefill(self, reqs) -> None:
        """After ``pools.prefill``: takes the fresh hot buffers (positions ``0..``)."""
        reqs = [int(r) for r in reqs]
        self._long_seen[reqs] = False
        self.sync_from(self.pools, reqs=reqs)

    def begin_step(self, reqs, seq_lens) -> None:
        """After ``pools.begin_step`` (same arguments): requests that have not been long yet take
        the grown buffers (position order, as upstream's coordinator grows them); from the first
        step at ``seq_len > D`` on, the peer's state is its own."""
        D = self.pools.device_buffer_size
        fresh = [int(r) for r in reqs if not self._long_seen[int(r)]]
        if fresh:
            self.sync_from(self.pools, reqs=fresh)
        for r, n in zip(reqs, seq_lens):
            if int(n) > D:
                self._long_seen[int(r)] = True
        self.refresh_host_locs()

    def state(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(slot_unit, lru)`` of ``layer`` in our layout (int32 ``[R, D]`` each)."""
        return from_upstream_state(self.tokens[layer], self.lru_slots[layer])

    # ---- the call
    def swap_in(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                topk_indices: torch.Tensor, layer_id: int, skip_io: bool = False) -> torch.Tensor:
        """Like ``HiSparseCoordinator.swap_in_selected_pages``: int32 ``[B, top_k]`` global rows
        of ``pools.device_pool(layer_id)`` in the caller's entry order. Runs the canonicalising
        sort (a few small torch ops), the -1 fill of the output and upstream's kernel."""
        canon, where = canonical_selection(topk_indices, seq_lens)
        out = self.swap_in_direct(req_pool_indices, seq_lens, canon, layer_id, skip_io)
        self.last_where = where
        return uncanonical(out, where)

    def swap_in_direct(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                       topk_indices: torch.Tensor, layer_id: int, skip_io: bool = False
                       ) -> torch.Tensor:
        """Upstream's kernel alone, fed the selection as SGLang feeds it the indexer's top-k:
        int32 ``[B, top_k]`` that meets upstream's contract (``selection_contract_error`` is
        None: e.g. a canonical selection). Returns int32 ``[B, top_k]`` global rows of
        ``pools.device_pool(layer_id)`` per entry, -1 for -1 entries. Runs the -1 fill of the
        output and the kernel."""
        B = topk_indices.shape[0]
        out = self.out[:B]
        out.fill_(-1)
        self.num_real.fill_(B)
        self.kernel.launch(
            top_k=topk_indices, device_buffer_tokens=self.tokens[layer_id],
            host_cache_locs=self.host_locs, device_buffer_locs=self.locs,
            host_cache=self.pools.host_kv[layer_id], device_buffer=self.pools.device_kv[layer_id],
            top_k_device_locs=out, req_pool_indices=req_pool_indices, seq_lens=seq_lens,
            lru_slots=self.lru_slots[layer_id], num_real_reqs=self.num_real,
            item_size_bytes=self.pools.row_bytes, miss_src=self.miss_src[:B],
            miss_dst=self.miss_dst[:B], miss_count=self.miss_count[:B], skip_io=skip_io)
        self.last_selection = topk_indices
        return out

    def last_counts(self) -> Dict[str, torch.Tensor]:
        """``hits`` and ``misses`` (int64 ``[B]``) of the latest call, derived as ours counts
        them: misses = upstream's miss count, hits = distinct valid selections - misses (the
        latest selection met the contract, so its entries >= 0 are distinct and valid)."""
        B = self.last_selection.shape[0]
        misses = self.miss_count[:B].to(torch.int64)
        distinct = (self.last_selection >= 0).sum(dim=1).to(torch.int64)
        return dict(hits=distinct - misses, misses=misses,
                    tokens_loaded=misses, bytes_h2d=misses * self.pools.row_bytes)
