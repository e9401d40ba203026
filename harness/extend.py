"""The extend (prefill) step, ``phase=extend``: indexer -> RAGGED top-k -> sparse attention.

Workload
--------
``batch_size`` requests; request ``r`` has ``prefix_len[r]`` tokens already in the paged KV cache
and ``extend_len`` (``E``) new query tokens whose KV has just been written behind them, so the
request holds ``T_r = prefix_len[r] + E`` tokens. Query row ``i`` of ``r`` is causal: it sees keys
``[0, prefix_len[r] + i + 1)``. Prefix lengths are seeded, uniform in
``context_len * [1 - extend.prefix_spread, 1 + extend.prefix_spread]`` (at least 1).

Consecutive requests form groups of ``extend.group_size`` that share a prefix, as a radix cache
would serve them: the first ``shared_len`` tokens of every member (``extend.shared_prefix`` times
the group's shortest prefix, rounded down to whole pages, since a paged radix cache shares whole
pages) live in the *same physical pages*; their block-table entries are equal, and so are their
KV rows and index keys there. Every other page is private. Physical page ids are a seeded random
permutation (not contiguous, as in a long-running server).

Caches, per simulated layer: the paged attention KV (``harness.workload.Workload``'s seeded pools
in ``kv_dtype``: ``fp8_ds_mla`` or ``bf16`` rows) and the paged fp8 index-key cache
(``harness.index_cache.IndexKeyCache``, 132 B per token at ``index_dim`` 128), both addressed by
the one block table ``int32 [B, max_pages]`` (``-1`` past a request's pages).

The measured layer step (stages timed with ``harness.timing.StageTimer``)
-----------------------------------------------------------------------
``gather``
    One Triton kernel (``ragged_gather``) reads every request's ``T_r`` tokens through the block
    table and writes (a) the attention KV dequantized to a contiguous bf16 buffer
    ``[N, d_qk]``, ``N = sum_r T_r``, requests concatenated (request ``r`` starts at row
    ``cu[r]``; a shared prefix is gathered once per request, as vLLM's
    ``cp_gather_and_upconvert_fp8_kv_cache`` / SGLang's ``dequantize_k_cache_paged`` do), and
    (b) the fp8 index keys ``uint8 [N, index_dim]`` + scales ``float32 [N]`` in the same order
    (vLLM's ``cp_gather_indexer_k_quant_cache``).
``indexer``
    ``indexer_logits_ragged`` over the concatenated index keys: ``M = B * E`` query rows, row
    ``m = r * E + i`` scores keys ``[ks, ke) = [cu[r], cu[r] + prefix_len[r] + i + 1)``;
    logits ``float32 [M, max_len]``.
``topk``
    ``IndexerMetadata.for_extend(ks, ke, top_k).select`` = ``topk_transform(...,
    TopkTransformMethod.RAGGED, row_offsets=ks, fuse=selection.fuse_topk)``: int32 ``[M, top_k]``
    rows of the ragged bf16 buffer (``-1`` padded when a row has fewer keys than ``top_k``).
``attention``
    ``sparse_mla_decode`` (or the ``attention_kernel=flashmla`` peer) with the query rows as its
    batch axis, over the ragged bf16 buffer: out bf16 ``[M, H, d_v]``, lse float32 ``[M, H]``.

The index heads are zero-padded to the indexer kernel's minimum (a power of two >= 16) with
zero weights, which adds exactly 0 to every logit (so a model with e.g. 4 index heads runs).

Checks (every layer step, warm-up included; outside the timed region)
---------------------------------------------------------------------
* attention: ``harness.reference.sparse_mla_decode_ref`` on the *logical* paged KV rows the
  selected ragged rows stand for (ragged row -> request position -> physical slot through the
  block table), so the gather is checked too: ``max_rel_err`` / ``max_lse_err``;
* top-k: the selected positions must lie in the row's causal range, be distinct, and their
  reference scores (``harness.indexer_ref.indexer_logits_ragged_ref`` on the index keys read
  from the paged cache in logical order) must equal the row's top-``min(top_k, len)`` reference
  scores up to a relative ``TOPK_SCORE_RTOL`` (tie-robust: which of two equal scores is taken
  does not matter).

Either beyond tolerance -> ``status=incorrect``.

Backends: only ``flashmla_sparse`` serves extend; a ``hisparse`` row is ``status=invalid``
(HiSparse is decode-only upstream: prefill runs with the KV on the GPU and is staged to host
afterwards; the swap-in coordinator serves decode steps).

Counts (per query row, summed over measured steps, layers and rows as in decode):
``tokens_selected`` = distinct valid selected positions, ``pages_touched`` = distinct pages of
``page_size`` holding them. ``steps`` repeats the extend step on the same caches with fresh
queries (``timing.warmup_steps`` of them excluded from the numbers).

Result columns that differ from decode: ``phase=extend``, ``selection=pattern=indexer``,
``context_len`` = the configured mean prefix; a sample is one layer step of all ``M`` query rows;
``stage_select_us`` = indexer + topk; ``stage_plan_us`` / ``plan_builds_per_step``: the per-step
RAGGED top-k plan (outside the samples); ``stage_gather_us`` (once ``harness.results`` has the
column); ``bytes_hbm_read`` / ``bytes_selected`` count bf16 rows (what attention reads here);
``working_set_bytes`` = paged KV + index keys of the pages in use (shared pages once) + the
step's workspaces (ragged KV and keys, logits, indices).
"""
from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import triton
from omegaconf import OmegaConf

from backends.base import BackendInvalid, BackendUnavailable
from backends.kernels.ragged_gather import ragged_gather
from harness import results
from backends.kernels import kv_format
from harness.config import ModelConfig
from backends.kernels.index_cache import IndexKeyCache, IndexKeyFormat
from harness.reference import convert_req_index_to_global_index_ref, sparse_mla_decode_on_slots_ref
from harness.selection import distinct_counts
from harness.timing import StageTimer
from harness.validate import backends_of
from harness.workload import Workload, seeded_generator, lse_error, relative_error

log = logging.getLogger("harness")

PHASE = "extend"
#: stages of the extend layer step, in order
EXTEND_STAGES = ("gather", "indexer", "topk", "attention")
#: top-k check: |selected reference score - wanted reference score| <= rtol * max |row score|
TOPK_SCORE_RTOL = 1e-4
HISPARSE_INVALID = ("phase=extend: HiSparse is decode-only upstream (SGLang prefills with the KV "
                    "on the GPU and stages it to host afterwards; the swap-in coordinator serves "
                    "decode steps), so there is no HiSparse extend path to measure")


# ----------------------------------------------------------------------------------------------
# Workload
# ----------------------------------------------------------------------------------------------


def extend_lengths(context_len: int, batch_size: int, page_size: int, shared_prefix: float, group_size: int, prefix_spread: float, seed: int
                   ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded prefix lengths and prefix sharing.

    Returns ``(prefix_lens, shared_lens, group_of)``, each int64 ``[batch_size]``: tokens in the
    cache before the extend; leading tokens whose pages the request shares with its group (a
    multiple of ``page_size``, 0 when not shared); the request's group (consecutive runs of
    ``group_size``; a group of one shares nothing).
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 11]))
    u = rng.uniform(-1.0, 1.0, batch_size)
    prefix = np.maximum(1, np.rint(context_len * (1.0 + prefix_spread * u))).astype(np.int64)
    group_of = np.arange(batch_size, dtype=np.int64) // max(group_size, 1)
    shared = np.zeros(batch_size, dtype=np.int64)
    for g in np.unique(group_of):
        members = np.flatnonzero(group_of == g)
        if len(members) > 1:
            shared[members] = int(shared_prefix * prefix[members].min()) // page_size * page_size
    return prefix, shared, group_of


def shared_block_table(total_lens: np.ndarray, shared_lens: np.ndarray, group_of: np.ndarray,
                       page_size: int, num_pages: int, seed: int) -> Tuple[np.ndarray, int]:
    """Block table with shared prefix pages.

    Args:
        total_lens: int64 ``[B]`` tokens per request (prefix + extend).
        shared_lens, group_of: from ``extend_lengths``.
        page_size: tokens per page.
        num_pages: physical pages of the pool (>= the pages needed).
        seed: seeds the permutation of physical page ids.
    Returns:
        ``(block_table int32 [B, max_pages], pages_used)``: members of a group map their first
        ``shared_len / page_size`` logical pages to the same physical pages; the remaining pages
        are private; entries past a request's ``ceil(T_r / page_size)`` pages are ``-1``.
    """
    B = len(total_lens)
    pages = -(-total_lens // page_size)
    bt = np.full((B, int(pages.max())), -1, dtype=np.int64)
    perm = np.random.default_rng(np.random.SeedSequence([seed, 12])).permutation(num_pages)
    nxt = 0
    for g in np.unique(group_of):
        members = np.flatnonzero(group_of == g)
        n_sh = int(shared_lens[members[0]]) // page_size
        bt[members, :n_sh] = perm[nxt: nxt + n_sh]
        nxt += n_sh
        for r in members:
            n_priv = int(pages[r]) - n_sh
            bt[r, n_sh: pages[r]] = perm[nxt: nxt + n_priv]
            nxt += n_priv
    if nxt > num_pages:
        raise ValueError(f"{nxt} pages needed, pool has {num_pages}")
    return bt.astype(np.int32), nxt


@dataclass
class ExtendWorkload:
    """Everything the extend step reads; built outside any timed region.

    Attributes:
        pool: the paged attention KV (``Workload``: per-layer pools ``[num_pages, page_size,
            row]``, seeded exactly like decode's); its own ``block_table`` is not used.
        block_table: int32 ``[B, max_pages]`` (device) with the shared prefix pages.
        index_caches: per layer, the paged fp8 index keys (same pages, same block table).
        prefix_lens, shared_lens, group_of: int64 ``[B]`` (host), see ``extend_lengths``.
        extend_len: new query tokens per request ``E``.
        pages_used: distinct physical pages the block table references.
        total_lens_dev, cu_dev: int32 ``[B]`` (device) tokens per request and start row of each
            request in the ragged buffers.
        ks, ke: int32 ``[M]`` (device) key range of each query row in the ragged buffers.
        row_request: int32 ``[M]`` (device) request of each query row.
    """

    model: ModelConfig
    device: torch.device
    kv_dtype: str
    page_size: int
    top_k: int
    num_layers: int
    seed: int
    extend_len: int
    prefix_lens: np.ndarray
    shared_lens: np.ndarray
    group_of: np.ndarray
    pool: Workload
    block_table: torch.Tensor
    pages_used: int
    index_caches: Tuple[IndexKeyCache, ...]
    total_lens_dev: torch.Tensor
    cu_dev: torch.Tensor
    ks: torch.Tensor
    ke: torch.Tensor
    row_request: torch.Tensor

    @classmethod
    def build(cls, model: ModelConfig, device: torch.device, *, kv_dtype: str, page_size: int,
              top_k: int, num_layers: int, seed: int, batch_size: int, context_len: int,
              extend_len: int, shared_prefix: float = 0.5, group_size: int = 2,
              prefix_spread: float = 0.25) -> "ExtendWorkload":
        """Draws the lengths, allocates and fills the paged caches (seeded)."""
        prefix, shared, group_of = extend_lengths(context_len, batch_size, page_size,
                                                  shared_prefix, group_size, prefix_spread, seed)
        total = prefix + extend_len
        pool = Workload(model=model, device=device, kv_dtype=kv_dtype, page_size=page_size,
                        seq_lens=total[None, :].astype(np.int32), topk=None, top_k=top_k,
                        num_layers=num_layers, seed=seed).build()
        bt, used = shared_block_table(total, shared, group_of, page_size, pool.num_pages, seed)
        caches = []
        # seeded as harness.indexer_select does for decode; every slot (unused ones too, so
        # stray reads would show)
        slots = torch.arange(pool.num_pages * page_size, device=device)
        for layer in range(num_layers):
            cache = IndexKeyCache.allocate(pool.num_pages, page_size, model.index_dim,
                                           IndexKeyFormat.FP8, device)
            keys = torch.randn(slots.numel(), model.index_dim,
                               generator=seeded_generator(device, seed, 4, layer), device=device)
            cache.write_slots(slots, keys)
            caches.append(cache)
            del keys
        cu = np.concatenate([[0], np.cumsum(total)[:-1]])
        E = extend_len
        row_req = np.repeat(np.arange(batch_size), E)
        i = np.tile(np.arange(E), batch_size)
        ks = cu[row_req]
        ke = ks + prefix[row_req] + i + 1
        dev_i32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device)  # noqa: E731
        return cls(model=model, device=device, kv_dtype=kv_dtype, page_size=page_size, top_k=top_k,
                   num_layers=num_layers, seed=seed, extend_len=E, prefix_lens=prefix,
                   shared_lens=shared, group_of=group_of, pool=pool, block_table=dev_i32(bt),
                   pages_used=used, index_caches=tuple(caches), total_lens_dev=dev_i32(total),
                   cu_dev=dev_i32(cu), ks=dev_i32(ks), ke=dev_i32(ke), row_request=dev_i32(row_req))

    @property
    def batch_size(self) -> int:
        return int(len(self.prefix_lens))

    @property
    def total_lens(self) -> np.ndarray:
        """int64 ``[B]``: ``prefix_len + extend_len``."""
        return self.prefix_lens + self.extend_len

    @property
    def num_tokens(self) -> int:
        """Rows ``N`` of the ragged buffers (``sum_r T_r``)."""
        return int(self.total_lens.sum())

    @property
    def num_rows(self) -> int:
        """Query rows ``M = B * E``."""
        return self.batch_size * self.extend_len

    @property
    def max_len(self) -> int:
        """Longest query row's key count (= ``max_r T_r``): the logits width."""
        return int(self.total_lens.max())

    def row_lengths(self) -> np.ndarray:
        """int64 ``[M]``: keys of each query row, ``prefix_len[r] + i + 1``."""
        E = self.extend_len
        return np.repeat(self.prefix_lens, E) + np.tile(np.arange(1, E + 1), self.batch_size)

    def kv_flat(self, layer: int) -> torch.Tensor:
        """Layer's paged KV as flat rows ``[num_slots, row]``."""
        return self.pool.kv_flat(layer)

    def q(self, step: int, layer: int) -> torch.Tensor:
        """Seeded absorbed attention queries bf16 ``[M, H, d_qk]``."""
        g = seeded_generator(self.device, self.seed, 3, step, layer)
        m = self.model
        return torch.randn(self.num_rows, m.num_heads, m.d_qk, generator=g,
                           device=self.device).to(torch.bfloat16)

    def index_q(self, step: int, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Seeded index queries bf16 ``[M, index_heads, index_dim]`` and weights float32
        ``[M, index_heads]`` (scaled by ``index_heads ** -0.5``, as ``harness.indexer_select``)."""
        g = seeded_generator(self.device, self.seed, 5, step, layer)
        m = self.model
        q = torch.randn(self.num_rows, m.index_heads, m.index_dim, generator=g, device=self.device)
        w = torch.randn(self.num_rows, m.index_heads, generator=g, device=self.device) * m.index_heads ** -0.5
        return q.to(torch.bfloat16), w

    def cache_bytes(self) -> int:
        """Bytes of the paged KV and index keys of the pages in use, all simulated layers."""
        per_token = self.pool.row_bytes + self.index_caches[0].bytes_per_token
        return self.num_layers * self.pages_used * self.page_size * per_token


def pad_index_heads(q: torch.Tensor, w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Zero-pads index heads to ``max(16, next_pow2(H))`` (the indexer kernel's minimum).

    A padded head has q = 0 and weight 0, so it adds exactly 0 to every logit.
    q bf16 ``[M, H, D]``, w float32 ``[M, H]`` -> ``[M, Hp, D]``, ``[M, Hp]`` (contiguous).
    """
    M, H, D = q.shape
    Hp = max(16, triton.next_power_of_2(H))
    if Hp == H:
        return q.contiguous(), w.contiguous()
    qp = torch.zeros(M, Hp, D, dtype=q.dtype, device=q.device)
    wp = torch.zeros(M, Hp, dtype=w.dtype, device=w.device)
    qp[:, :H] = q
    wp[:, :H] = w
    return qp, wp


# ----------------------------------------------------------------------------------------------
# The gather: paged KV (fp8_ds_mla or bf16) + paged fp8 index keys -> contiguous ragged buffers
# ----------------------------------------------------------------------------------------------


def ragged_gather_ref(ew: ExtendWorkload, layer: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch reference of the gather for ``layer``: ``(kv bf16 [N, d_qk], keys uint8 [N, D],
    key scales float32 [N])`` built request by request, position by position."""
    m, P = ew.model, ew.page_size
    flat = ew.kv_flat(layer)
    cache = ew.index_caches[layer]
    vals, scales = cache.values_view(), cache.scales_view()
    bt = ew.block_table.long()
    kv, keys, ks = [], [], []
    for r, n in enumerate(ew.total_lens.tolist()):
        pos = torch.arange(n, device=ew.device)
        page, off = bt[r, pos // P], pos % P
        rows = flat[page * P + off]
        kv.append(kv_format.kv_cache_to_float(rows, m.d_qk, m.d_v).to(torch.bfloat16)
                  if rows.dtype == torch.uint8 else rows)
        keys.append(vals[page, off])
        ks.append(scales[page, off])
    return torch.cat(kv), torch.cat(keys), torch.cat(ks)


# ----------------------------------------------------------------------------------------------
# The layer step and its checks
# ----------------------------------------------------------------------------------------------


class ExtendStep:
    """Per-point buffers and the measured extend layer step (``flashmla_sparse`` style)."""

    def __init__(self, ew: ExtendWorkload, attention_kernel: str = "triton", fuse_topk: bool = True):
        """Allocates the workspaces and resolves the attention kernel (``attention_kernel``:
        triton | flashmla); raises BackendInvalid / BackendUnavailable as the decode backends do."""
        from backends.attention import resolve_attention
        m, dev = ew.model, ew.device
        if m.index_dim < 16 or m.index_dim & (m.index_dim - 1):
            raise BackendInvalid(f"model.index_dim={m.index_dim}: the indexer kernel needs a power "
                                 "of two >= 16")
        self.ew = ew
        self.fuse_topk = fuse_topk
        N, M = ew.num_tokens, ew.num_rows
        self.kv = torch.empty(N, m.d_qk, dtype=torch.bfloat16, device=dev)
        self.keys = torch.empty(N, m.index_dim, dtype=torch.uint8, device=dev)
        self.key_scales = torch.empty(N, dtype=torch.float32, device=dev)
        self.logits = torch.empty(M, ew.max_len, dtype=torch.float32, device=dev)
        self.indices = torch.empty(M, ew.top_k, dtype=torch.int32, device=dev)
        self.meta = None
        self.plan_us: List[float] = []      # per step: building the top-k plan (untimed in samples)
        self.plan_builds: List[int] = []    # per step: plan_topk calls (1: reused by every layer)
        self.attention: Callable = resolve_attention(attention_kernel, dev, m.num_heads, m.d_qk,
                                                     m.d_v, self.kv)

    def workspace_bytes(self) -> int:
        """Bytes of the step's device workspaces (ragged KV, index keys, logits, indices)."""
        return sum(t.numel() * t.element_size()
                   for t in (self.kv, self.keys, self.key_scales, self.logits, self.indices))

    def begin_step(self) -> None:
        """Per-step indexer metadata (RAGGED, one top-k plan reused by every layer), timed on its
        own outside the layer samples (as ``harness.indexer_select`` does for decode)."""
        from backends.kernels.topk import plan_build_count
        from backends.kernels.topk_transform import IndexerMetadata
        ew = self.ew
        before = plan_build_count()
        timer = StageTimer(ew.device, cold_l2=False, launch_shield_us=0)
        timer.begin()
        self.meta = timer.run("plan", lambda: IndexerMetadata.for_extend(
            ew.ks, ew.ke, ew.top_k, max_len=ew.max_len, fuse_topk=self.fuse_topk))
        self.plan_us.append(timer.end()["plan"])
        self.plan_builds.append(plan_build_count() - before)

    def layer(self, layer: int, q: torch.Tensor, q_idx: torch.Tensor, w_idx: torch.Tensor,
              timer) -> Tuple[torch.Tensor, torch.Tensor]:
        """One measured layer step. q bf16 ``[M, H, d_qk]``; q_idx bf16 ``[M, Hp, D]`` and
        w_idx float32 ``[M, Hp]`` (heads padded, ``pad_index_heads``). Returns (out bf16
        ``[M, H, d_v]``, lse float32 ``[M, H]``); the selection stays in ``self.indices``."""
        from backends.kernels.indexer import indexer_logits_ragged
        ew, m = self.ew, self.ew.model
        timer.run("gather", lambda: ragged_gather(
            ew.kv_flat(layer), ew.index_caches[layer].data, ew.block_table, ew.total_lens_dev,
            ew.cu_dev, self.kv, self.keys, self.key_scales, page_size=ew.page_size,
            d_nope=m.d_nope, d_rope=m.d_rope, max_len=ew.max_len))
        timer.run("indexer", lambda: indexer_logits_ragged(
            q_idx, w_idx, self.keys, ew.ks, ew.ke, k_scales=self.key_scales, max_len=ew.max_len,
            out=self.logits))
        timer.run("topk", lambda: self.meta.select(self.logits, out=self.indices))
        return timer.run("attention", lambda: self.attention(
            q, self.kv, self.indices, m.sm_scale, d_v=m.d_v))


def selected_positions(ew: ExtendWorkload, indices: torch.Tensor) -> Tuple[torch.Tensor, Optional[str]]:
    """RAGGED indices int32 ``[M, K]`` -> request-local positions int64 ``[M, K]`` (-1 = none),
    and a message when some valid index lies outside its row's causal range ``[ks, ke)``."""
    idx = indices.long()
    ks, ke = ew.ks.long()[:, None], ew.ke.long()[:, None]
    valid = idx >= 0
    inside = valid & (idx >= ks) & (idx < ke)
    pos = torch.where(inside, idx - ks, torch.full_like(idx, -1))
    bad = int((valid & ~inside).sum())
    return pos, (f"{bad} selected indices outside their row's causal range" if bad else None)


def reference_attention(ew: ExtendWorkload, layer: int, q: torch.Tensor,
                        pos: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reference (out float32 ``[M, H, d_v]``, lse float32 ``[M, H]``) over the logical paged KV
    rows of the selected positions (position -> physical slot through the block table)."""
    slots = convert_req_index_to_global_index_ref(ew.row_request, ew.block_table,
                                                  pos.to(torch.int32), ew.page_size)
    return sparse_mla_decode_on_slots_ref(q, ew.kv_flat(layer), slots, ew.model.sm_scale, d_v=ew.model.d_v)


def reference_logits(ew: ExtendWorkload, layer: int, q_idx: torch.Tensor,
                     w_idx: torch.Tensor) -> torch.Tensor:
    """float32 ``[M, max_len]``: ``indexer_logits_ragged_ref`` over the index keys read from the
    paged cache in logical order (unpadded heads); column j = position j of the row's request."""
    from harness.indexer_ref import indexer_logits_ragged_ref
    keys = torch.cat(ew.index_caches[layer].gather(ew.block_table, ew.total_lens_dev))
    return indexer_logits_ragged_ref(q_idx, w_idx, keys, ew.ks, ew.ke, max_len=ew.max_len)


def check_topk(ref_logits: torch.Tensor, pos: torch.Tensor, lengths: torch.Tensor,
               rtol: float = TOPK_SCORE_RTOL) -> Optional[str]:
    """Tie-robust top-k check; None when the selection is a valid top-k, else the reason.

    Args:
        ref_logits: float32 ``[M, L]`` reference scores (``-inf`` past each row's length).
        pos: int64 ``[M, K]`` selected positions (-1 = none).
        lengths: ``[M]`` keys per row.
    Each row must select ``min(K, length)`` distinct positions whose reference scores, sorted,
    equal the row's top ``min(K, length)`` reference scores within ``rtol * max |row score|``.
    """
    M, K = pos.shape
    lengths = lengths.long()
    valid = pos >= 0
    n_sel = valid.sum(1)
    want_n = lengths.clamp(max=K)
    if not torch.equal(n_sel, want_n):
        r = int((n_sel != want_n).nonzero()[0, 0])
        return f"row {r} selected {int(n_sel[r])} positions, wants {int(want_n[r])}"
    s = torch.sort(torch.where(valid, pos, torch.full_like(pos, -1)), dim=1).values
    if bool(((s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)).any()):
        return "duplicate selected positions"
    got = torch.where(valid, ref_logits.gather(1, pos.clamp_min(0)),
                      torch.full(pos.shape, float("-inf"), device=pos.device))
    got = torch.sort(got, dim=1, descending=True).values
    kk = min(K, ref_logits.shape[1])
    want = torch.full((M, K), float("-inf"), device=pos.device)
    want[:, :kk] = torch.topk(ref_logits, kk, dim=1).values
    fin = torch.isfinite(want)
    if not torch.equal(fin, torch.isfinite(got)):
        return "selected positions with -inf reference scores"
    scale = torch.where(torch.isfinite(ref_logits), ref_logits.abs(),
                        torch.zeros_like(ref_logits)).amax(1, keepdim=True).clamp_min(1e-30)
    err = torch.where(fin, (got - want).abs() / scale, torch.zeros_like(got))
    worst = float(err.max()) if err.numel() else 0.0
    if worst > rtol:
        return f"top-k scores differ from the reference top-k by {worst:.3g} (relative) > {rtol}"
    return None


# ----------------------------------------------------------------------------------------------
# The point
# ----------------------------------------------------------------------------------------------


def make_extend_workload(cfg, device: torch.device) -> ExtendWorkload:
    """The point's ``ExtendWorkload`` from a resolved RunConfig (not yet built)."""
    model = ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True))
    e = cfg.extend
    return ExtendWorkload.build(model, device, kv_dtype=cfg.kv_dtype, page_size=cfg.page_size,
                                top_k=cfg.top_k, num_layers=cfg.num_layers, seed=cfg.seed,
                                batch_size=cfg.batch_size, context_len=cfg.context_len,
                                extend_len=cfg.extend_len, shared_prefix=e.shared_prefix,
                                group_size=e.group_size, prefix_spread=e.prefix_spread)


def extend_base_row(cfg, device: torch.device, repro: str, cfg_hash: str) -> Dict:
    """``runner.base_row`` with the extend columns: phase, selection/pattern = indexer."""
    from harness.runner import base_row
    row = base_row(cfg, None, device, repro, cfg_hash)  # context_len = cfg.context_len
    row.update(phase=PHASE, selection="indexer", pattern="indexer", step_overlap=None,
               cluster_len=None, fuse_topk=bool(cfg.selection.fuse_topk))
    return row


def summarize_extend(samples: List[Dict[str, float]], sums: Dict, ew: ExtendWorkload, cfg,
                     record: np.ndarray) -> Dict:
    """``runner.summarize`` with the query rows as its rows and bf16 rows as the row size
    (attention reads the ragged bf16 buffer), so ``bytes_hbm_read`` = per sample the queries
    ``M*H*d_qk*2`` + index table ``M*top_k*4`` + each selected bf16 row once, ``bytes_selected``
    = ``tokens_selected * 2 * d_qk`` and ``flops`` = ``2*H*(valid entries of record)*(d_qk +
    d_v)``. ``record``: int32 ``[steps, layers, M, top_k]`` selected positions (-1 = none)."""
    from harness.runner import summarize
    m = ew.model
    return summarize(samples, sums, model=m, rows=ew.num_rows, top_k=ew.top_k,
                     row_bytes=kv_format.row_bytes("bf16", m.d_nope, m.d_rope), record=record,
                     warmup_steps=cfg.timing.warmup_steps)


def run_extend_backend(cfg, ew: ExtendWorkload, device: torch.device) -> Tuple[Dict, List[Dict]]:
    """Runs every extend step and layer (``flashmla_sparse`` style). Returns (row, step_rows)."""
    from harness.runner import STEP_STAGES, correctness
    from harness.timing import TimingStats
    name = "flashmla_sparse"
    if cfg.timing.cuda_graph:
        return {"backend": name, "status": "invalid",
                "error": "phase=extend runs eagerly: timing.cuda_graph is decode-only"}, []
    try:
        step = ExtendStep(ew, attention_kernel=cfg.attention_kernel,
                          fuse_topk=bool(cfg.selection.fuse_topk))
    except BackendInvalid as e:
        return {"backend": name, "status": "invalid", "error": str(e)}, []
    except BackendUnavailable as e:
        return {"backend": name, "status": "unavailable", "error": str(e)}, []
    except (torch.OutOfMemoryError, MemoryError) as e:
        return {"backend": name, "status": "oom",
                "error": f"extend workspaces do not fit: {str(e).splitlines()[0]}"}, []
    row: Dict = {"backend": name}
    timer = StageTimer(device, cold_l2=cfg.timing.cold_l2, launch_shield_us=cfg.timing.launch_shield_us)
    row_lens = ew.row_lengths()
    samples: List[Dict[str, float]] = []
    step_rows: List[Dict] = []
    sums: Dict = {"tokens_selected": 0, "pages_touched": 0, "tokens_loaded": 0, "pages_loaded": 0,
                  "bytes_h2d": 0, "hits": None, "misses": None}
    max_err, max_lse, topk_bad = 0.0, 0.0, None
    # the selections served: request-local positions, -1 padded (flops count its valid entries)
    record = np.full((cfg.steps, ew.num_layers, ew.num_rows, ew.top_k), -1, dtype=np.int32)
    try:
        for s in range(cfg.steps):
            warm = s < cfg.timing.warmup_steps
            step.begin_step()
            for layer in range(ew.num_layers):
                q = ew.q(s, layer)
                qi, wi = ew.index_q(s, layer)
                qi_p, wi_p = pad_index_heads(qi, wi)
                timer.begin()
                out, lse = step.layer(layer, q, qi_p, wi_p, timer)
                t = timer.end()
                t["select"] = t["indexer"] + t["topk"]
                # ---- checks (untimed) ----
                pos, outside = selected_positions(ew, step.indices)
                ref_out, ref_lse = reference_attention(ew, layer, q, pos)
                max_err = max(max_err, relative_error(out, ref_out))
                max_lse = max(max_lse, lse_error(lse, ref_lse))
                bad = outside or check_topk(reference_logits(ew, layer, qi, wi), pos,
                                            ew.ke - ew.ks)
                if bad and topk_bad is None:
                    topk_bad = f"step {s} layer {layer}: {bad}"
                record[s, layer] = pos.cpu().numpy()
                tok, pages = distinct_counts(record[s, layer], ew.page_size)
                stages = {f"stage_{k}_us": v for k, v in t.items() if k in STEP_STAGES}
                for r in range(ew.num_rows):
                    sr = {"backend": name, "step": s, "layer": layer, "request": r, "warmup": warm,
                          "seq_len": int(row_lens[r]), "tokens_selected": int(tok[r]),
                          "pages_touched": int(pages[r]), "tokens_loaded": 0, "pages_loaded": 0,
                          "bytes_h2d": 0, "latency_us": t["total"], **stages}
                    step_rows.append(sr)
                if not warm:
                    samples.append(t)
                    sums["tokens_selected"] += int(tok.sum())
                    sums["pages_touched"] += int(pages.sum())
    except BackendInvalid as e:
        return {**row, "status": "invalid", "error": str(e)}, step_rows
    except (torch.OutOfMemoryError, MemoryError) as e:
        return {**row, "status": "oom",
                "error": f"out of memory while running: {str(e).splitlines()[0]}"}, step_rows
    row["working_set_bytes"] = ew.cache_bytes() + step.workspace_bytes()
    row["host_bytes"] = 0
    row.update(summarize_extend(samples, sums, ew, cfg, record))
    row["stage_plan_us"] = TimingStats.of(step.plan_us).median_us
    row["plan_builds_per_step"] = float(np.mean(step.plan_builds))
    row.update(correctness(max_err, max_lse, cfg.timing.check_tolerance,
                           f"top-k check: {topk_bad}" if topk_bad else None))
    return row, step_rows


def run_extend_point(cfg, device: torch.device, job_dir: Path, repro: str, cfg_hash: str) -> List[Dict]:
    """Runs the extend point for every requested backend; writes ``result.parquet`` and
    ``steps.parquet`` atomically (same contract as ``harness.runner.run_point``).

    Returns one row per backend (``harness.results.COLUMNS`` keys); ``hisparse`` is
    ``status=invalid``.
    """
    names = backends_of(cfg)
    base = extend_base_row(cfg, device, repro, cfg_hash)
    try:
        ew = make_extend_workload(cfg, device)
    except (torch.OutOfMemoryError, MemoryError) as e:
        err = f"extend caches do not fit: {str(e).splitlines()[0]}"
        rows = [{**base, "backend": n, "status": "invalid" if n == "hisparse" else "oom",
                 "error": HISPARSE_INVALID if n == "hisparse" else err} for n in names]
        results.write_results(job_dir, rows)
        return rows
    rows, step_rows = [], []
    for name in names:
        if name != "flashmla_sparse":
            row, srows = {"backend": name, "status": "invalid",
                          "error": HISPARSE_INVALID if name == "hisparse"
                          else f"backend {name} has no extend path"}, []
        else:
            try:
                row, srows = run_extend_backend(cfg, ew, device)
            except Exception as e:  # recorded, and the sweep goes on
                log.error("backend %s failed (extend):\n%s", name, traceback.format_exc())
                row, srows = {"backend": name, "status": "error", "error": f"{type(e).__name__}: {e}"}, []
        rows.append({**base, **row})
        step_rows += srows
        log.info("%-16s %-9s extend median %9.1f us  err %.2e  %s", name, rows[-1]["status"],
                 rows[-1].get("latency_us_median", float("nan")),
                 rows[-1].get("max_rel_err") or float("nan"), rows[-1].get("error") or "")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    results.write_steps(job_dir, step_rows)
    results.write_results(job_dir, rows)
    return rows
