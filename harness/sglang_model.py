"""Test and bench support for SGLang's swap-in peer (``backends/kernels/sglang_peer``): the
pure-Python model of upstream's kernel (its policy, ``UpstreamHotBuffer``, written from the
0.5.23 source; the semantics are in the peer package's docstring), a stand-in for the compiled
kernel that runs that model on CPU tensors (``ModelSwapInKernel``, ``modelled_peer``), and the
lockstep comparison of one step of ours and the peer (``compare_step``). A reference, as
``harness/lru_model.py`` is for our coordinator: not production code."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from backends.kernels.flashmla_peer import PeerUnsupported
from backends.kernels.sglang_peer import (KernelConfig, SGLangHiSparsePeer, canonical_selection,
                                          uncanonical)


@dataclass
class UpstreamStep:
    """What one upstream step did for one (layer, request): request-local slot offsets per entry
    (``None``: output left untouched), misses in order (position, slot)."""
    offsets: List[Optional[int]]
    hits: int
    misses: int
    loaded: List[Tuple[int, int]] = field(default_factory=list)


class UpstreamHotBuffer:
    """Upstream's per-(layer, request) policy, written from the kernel (the semantics in
    ``backends/kernels/sglang_peer/__init__.py``'s docstring).

    ``tokens[s]``: position in hot slot ``s`` (-1 empty); ``lru``: slots, least recent first.
    Duplicate positions in one selection are refused (the kernel's handling of them depends on a
    shared-memory race)."""

    def __init__(self, device_buffer_size: int, tokens=None, lru=None):
        self.D = device_buffer_size
        self.tokens = list(tokens) if tokens is not None else [-1] * self.D
        self.lru = list(lru) if lru is not None else list(range(self.D))

    @classmethod
    def from_model(cls, model) -> "UpstreamHotBuffer":
        """The same state as a token-mode ``harness.lru_model.HotBufferModel``."""
        if model.page_mode:
            raise PeerUnsupported("upstream's kernel is token-granular")
        return cls(model.D, model.slot_unit, model.lru)

    def step(self, seq_len: int, selection: Sequence[int]) -> UpstreamStep:
        D, K = self.D, len(selection)
        if seq_len <= D:
            count = min(seq_len, K)
            offs = [p if (i < count and p >= 0) else -1 for i, p in enumerate(selection)]
            return UpstreamStep(offs, len({p for p in offs if p >= 0}), 0)
        live = [p for p in selection if p >= 0 and p != seq_len - 1]
        if len(set(live)) != len(live):
            raise ValueError("duplicate positions: upstream's result would be racy")
        offs: List[Optional[int]] = [None] * K
        pending = {}
        newest_hit = 0
        for i, p in enumerate(selection):
            if p == seq_len - 1:
                offs[i], newest_hit = D, 1
            elif p >= 0:
                pending[p] = i
        hits, evictable = [], []
        for s in self.lru:                                   # LRU walk
            t = self.tokens[s]
            if t >= 0 and t in pending:
                offs[pending.pop(t)] = s
                hits.append(s)
            else:
                evictable.append(s)
        misses = sorted(pending.items(), key=lambda kv: kv[1])   # selection order
        loaded = []
        for j, (p, i) in enumerate(misses):
            s = evictable[j]
            self.tokens[s] = p
            offs[i] = s
            loaded.append((p, s))
        M = len(misses)
        self.lru = evictable[M:] + evictable[:M] + hits
        return UpstreamStep(offs, len(hits) + newest_hit, M, loaded)


class ModelSwapInKernel:
    """A stand-in with ``SGLangSwapInKernel.launch``'s buffer protocol that runs
    ``UpstreamHotBuffer`` on CPU tensors (tokens, int16 LRU, locs, host locs, output, miss plan,
    row copies): lets the CPU tests drive ``SGLangHiSparsePeer`` and ``compare_step`` end to end.
    """

    def __init__(self, cfg: KernelConfig):
        self.cfg = cfg

    def launch(self, *, top_k, device_buffer_tokens, host_cache_locs, device_buffer_locs,
               host_cache, device_buffer, top_k_device_locs, req_pool_indices, seq_lens,
               lru_slots, num_real_reqs, item_size_bytes, miss_src=None, miss_dst=None,
               miss_count=None, skip_io=False) -> None:
        D = self.cfg.hot_buffer_size
        for b in range(int(num_real_reqs[0])):
            r, n = int(req_pool_indices[b]), int(seq_lens[b])
            m = UpstreamHotBuffer(D, device_buffer_tokens[r, :D].tolist(), lru_slots[r].tolist())
            st = m.step(n, top_k[b].tolist())
            for i, off in enumerate(st.offsets):
                if off is not None:
                    top_k_device_locs[b, i] = -1 if off < 0 else device_buffer_locs[r, off]
            device_buffer_tokens[r, :D] = torch.tensor(m.tokens, dtype=torch.int32)
            lru_slots[r] = torch.tensor(m.lru, dtype=torch.int16)
            for j, (pos, slot) in enumerate(st.loaded):
                src, dst = int(host_cache_locs[r, pos]), int(device_buffer_locs[r, slot])
                if miss_src is not None:
                    miss_src[b, j], miss_dst[b, j] = src, dst
                if not skip_io:
                    device_buffer[dst] = host_cache[src]
            if miss_count is not None:
                miss_count[b] = st.misses


def modelled_peer(pools) -> SGLangHiSparsePeer:
    """The peer over ``pools`` (a token-mode ``HiSparseCoordinator``) with ``ModelSwapInKernel``
    (upstream's policy in Python) in place of the compiled kernel: runs anywhere, CPU included
    (tests, ``harness.bench peers --quick``)."""
    return SGLangHiSparsePeer(pools, kernel=ModelSwapInKernel(
        KernelConfig(pools.top_k, pools.device_buffer_size)))


def compare_step(ours, peer: SGLangHiSparsePeer, req_pool_indices: torch.Tensor,
                 seq_lens: torch.Tensor, topk_indices: torch.Tensor, layer_id: int
                 ) -> Dict[str, object]:
    """One lockstep step: the peer takes our state for this layer, both swap in, and the report
    says what agrees. ``ours`` and ``peer.pools`` must hold identical pools (same config, seed,
    host KV, prefill and begin_step). Both see the selection in the kernel's entry order (the
    peer's canonical selection; ours' returned rows are mapped back to the caller's order): in
    ``lru_order=upstream`` the entry order decides which miss takes which slot, and with it
    everything agrees, the LRU order included (``lru_exact``); in ``position`` order all but
    the order of the hit slots. Upstream is also checked against ``UpstreamHotBuffer``.

    Keys: ``slots`` (output tables equal), ``slot_map`` (slot -> position equal), ``lru_prefix``
    (non-hit part of the LRU equal), ``lru_hit_set`` (same hit slots at the MRU end),
    ``lru_exact``, ``misses``, ``hits`` (counts equal), ``pool`` (the layer's device rows equal
    byte for byte), ``model`` (upstream equals the pure-Python model of upstream), and
    ``n_hits``/``n_misses`` totals.
    """
    peer.sync_from(ours, layers=[layer_id])
    old_tokens = peer.tokens[layer_id].cpu().numpy().copy()    # .cpu() aliases CPU tensors
    old_lru = peer.lru_slots[layer_id].cpu().numpy().copy()
    canon_sel, where = canonical_selection(topk_indices, seq_lens)
    out_ours = uncanonical(
        ours.swap_in_selected_pages(req_pool_indices, seq_lens, canon_sel, layer_id), where)
    out_peer = peer.swap_in(req_pool_indices, seq_lens, topk_indices, layer_id)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    c_ours = {k: v.cpu() for k, v in ours.layer_counts(layer_id).items()}
    c_peer = {k: v.cpu() for k, v in peer.last_counts().items()}
    su_o, lru_o = ours.slot_unit[layer_id].cpu(), ours.lru[layer_id].cpu()
    su_p, lru_p = (t.cpu() for t in peer.state(layer_id))
    reqs = req_pool_indices.cpu().numpy().astype(np.int64)
    seqs = seq_lens.cpu().numpy().astype(np.int64)
    canon = peer.last_selection.cpu().numpy()
    rep = dict(slots=torch.equal(out_ours.cpu(), out_peer.cpu()),
               slot_map=torch.equal(su_o[reqs], su_p[reqs]),
               misses=torch.equal(c_ours["misses"], c_peer["misses"]),
               hits=torch.equal(c_ours["hits"], c_peer["hits"]),
               pool=torch.equal(ours.device_kv[layer_id].cpu(),
                                peer.pools.device_kv[layer_id].cpu()),
               lru_exact=torch.equal(lru_o[reqs], lru_p[reqs]),
               n_hits=int(c_peer["hits"].sum()), n_misses=int(c_peer["misses"].sum()))
    prefix_ok, hitset_ok, model_ok = True, True, True
    out_p = peer.out[:len(reqs)].cpu().numpy()
    D = ours.device_buffer_size
    for b, r in enumerate(reqs):
        m = UpstreamHotBuffer(D, old_tokens[r, :D].tolist(), old_lru[r].tolist())
        st = m.step(int(seqs[b]), canon[b].tolist())
        base = r * (D + ours.page_size)
        want = [-1 if o is None or o < 0 else base + o for o in st.offsets]
        model_ok &= (want == out_p[b].tolist() and m.tokens == su_p[r].tolist()
                     and m.lru == lru_p[r].tolist() and st.misses == int(c_peer["misses"][b]))
        if seqs[b] > D:
            n_hit_slots = st.hits - int((canon[b] == seqs[b] - 1).any())
            cut = D - n_hit_slots
            prefix_ok &= lru_o[r, :cut].tolist() == lru_p[r, :cut].tolist()
            hitset_ok &= sorted(lru_o[r, cut:].tolist()) == sorted(lru_p[r, cut:].tolist())
    rep.update(lru_prefix=prefix_ok, lru_hit_set=hitset_ok, model=model_ok)
    return rep
