"""``scenario=extend`` (alias ``phase=extend``): the extend (prefill) step, indexer -> RAGGED top-k ->
sparse attention.

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

The measured layer step is the backend's (``FlashMLASparseBackend.extend_layer``: stages
``gather``, ``indexer``, ``topk``, ``attention``; see ``backends/flashmla_sparse.py``).

The index heads are zero-padded to the indexer kernel's minimum (a power of two >= 16) with
zero weights, which adds exactly 0 to every logit (so a model with e.g. 4 index heads runs).
The index query is taken in ``selection.query_dtype`` (``fp8`` by default, as vLLM's indexer;
``bf16``), as in decode.

Checks (every layer step, warm-up included; outside the timed region)
---------------------------------------------------------------------
* attention: ``harness.reference.sparse_mla_decode_ref`` on the *logical* paged KV rows the
  selected ragged rows stand for (ragged row -> request position -> physical slot through the
  block table), so the gather is checked too: ``max_rel_err`` / ``max_lse_err``;
* top-k: the selected positions must lie in the row's causal range, be distinct, and their
  reference scores (``harness.indexer_ref.indexer_logits_ragged_ref`` on the index keys read
  from the paged cache in logical order) must equal the row's top-``min(top_k, len)`` reference
  scores up to a relative ``TOPK_SCORE_RTOL`` (tie-robust: which of two equal scores is taken
  does not matter; with the fp8 query ``2 * FP8_QUERY_TOL``, the fp8 MMA's accumulation error,
  against the reference of the same quantized query).

Either beyond tolerance -> ``status=incorrect``.

Backends: those listing ``extend`` in their ``phases`` (``flashmla_sparse``); any other row is
``status=invalid`` with the backend's reason (HiSparse is decode-only upstream).

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

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from backends.base import ConfigError
from backends.kernels import kv_format
from backends.kernels.index_cache import IndexKeyCache, IndexKeyFormat
from backends.kernels.indexer import pad_index_heads
from harness.config import ModelConfig
from harness.indexer_ref import FP8_QUERY_TOL
from harness.reference import convert_req_index_to_global_index_ref, sparse_mla_decode_on_slots_ref
from harness.scenarios.base import LayerInputs, LayerResult, Scenario
from harness.timing import StageTimer, TimingStats
from harness.workload import Workload, seeded_generator, lse_error, relative_error

#: top-k check: |selected reference score - wanted reference score| <= rtol * max |row score|
TOPK_SCORE_RTOL = 1e-4


@dataclass
class ExtendSettings:
    """``extend.*``: the extend (prefill) workload of ``scenario=extend``."""

    shared_prefix: float = 0.5    # fraction of a group's shortest prefix its requests share (whole pages)
    group_size: int = 2           # consecutive requests that share one prefix (1: no sharing)
    prefix_spread: float = 0.25   # prefix lengths uniform in context_len * [1 - spread, 1 + spread]


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
    phase: str = "extend"
    query_dtype: str = "fp8"

    @classmethod
    def build(cls, model: ModelConfig, device: torch.device, *, kv_dtype: str, page_size: int,
              top_k: int, num_layers: int, seed: int, batch_size: int, context_len: int,
              extend_len: int, shared_prefix: float = 0.5, group_size: int = 2,
              prefix_spread: float = 0.25, kv_scale_format: str = "raw",
              query_dtype: str = "fp8") -> "ExtendWorkload":
        """Draws the lengths, allocates and fills the paged caches (seeded)."""
        prefix, shared, group_of = extend_lengths(context_len, batch_size, page_size,
                                                  shared_prefix, group_size, prefix_spread, seed)
        total = prefix + extend_len
        pool = Workload.build(model=model, device=device, kv_dtype=kv_dtype, page_size=page_size,
                              seq_lens=total[None, :].astype(np.int32), topk=None, top_k=top_k,
                              num_layers=num_layers, seed=seed, kv_scale_format=kv_scale_format)
        bt, used = shared_block_table(total, shared, group_of, page_size, pool.num_pages, seed)
        caches = []
        # seeded as backends.indexer_select does for decode; every slot (unused ones too, so
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
                   cu_dev=dev_i32(cu), ks=dev_i32(ks), ke=dev_i32(ke), row_request=dev_i32(row_req),
                   query_dtype=query_dtype)

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
        ``[M, index_heads]`` (scaled by ``index_heads ** -0.5``, as ``backends.indexer_select``)."""
        g = seeded_generator(self.device, self.seed, 5, step, layer)
        m = self.model
        q = torch.randn(self.num_rows, m.index_heads, m.index_dim, generator=g, device=self.device)
        w = torch.randn(self.num_rows, m.index_heads, generator=g, device=self.device) * m.index_heads ** -0.5
        return q.to(torch.bfloat16), w

    def cache_bytes(self) -> int:
        """Bytes of the paged KV and index keys of the pages in use, all simulated layers."""
        per_token = self.pool.row_bytes + self.index_caches[0].bytes_per_token
        return self.num_layers * self.pages_used * self.page_size * per_token


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
    return indexer_logits_ragged_ref(q_idx, w_idx, keys, ew.ks, ew.ke, max_len=ew.max_len,
                                     query_dtype=ew.query_dtype)


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
# The scenario
# ----------------------------------------------------------------------------------------------


class ExtendScenario(Scenario):
    """Every backend that serves the extend phase on one shared ``ExtendWorkload``."""

    name = "extend"
    phase = "extend"
    settings = ExtendSettings

    @classmethod
    def check(cls, cfg) -> None:
        """The indexer selects inside the step, so there is no trace to replay."""
        if cfg.selection.source == "trace" or cfg.selection.record:
            raise ConfigError("selection", cfg.selection.source,
                              "scenario=extend selects with the lightning indexer: no trace replay or "
                              "record (use selection=synthetic, the default, or selection.source=indexer)")
        e = cfg.extend
        if not 0.0 <= e.shared_prefix <= 1.0:
            raise ConfigError("extend.shared_prefix", e.shared_prefix, "must be a fraction in [0, 1]")
        if e.group_size < 1:
            raise ConfigError("extend.group_size", e.group_size, "must be an integer >= 1")
        if not 0.0 <= e.prefix_spread < 1.0:
            raise ConfigError("extend.prefix_spread", e.prefix_spread, "must be in [0, 1)")

    @classmethod
    def graphs_supported(cls) -> str:
        return "scenario=extend runs eagerly: timing.cuda_graph is decode-only"

    def prepare(self) -> Optional[str]:
        cfg, e = self.cfg, self.cfg.extend
        try:
            self.ew = ExtendWorkload.build(
                self.model, self.device, kv_dtype=cfg.kv_dtype, page_size=cfg.page_size,
                top_k=cfg.top_k, num_layers=cfg.num_layers, seed=cfg.seed, batch_size=cfg.batch_size,
                context_len=cfg.context_len, extend_len=cfg.extend_len, shared_prefix=e.shared_prefix,
                group_size=e.group_size, prefix_spread=e.prefix_spread,
                kv_scale_format=cfg.kv_scale_format, query_dtype=cfg.selection.query_dtype)
        except (torch.OutOfMemoryError, MemoryError) as ex:
            return f"extend caches do not fit: {str(ex).splitlines()[0]}"
        self.row_lens = self.ew.row_lengths()
        return None

    def base_columns(self) -> Dict[str, object]:
        """``context_len`` = the configured mean prefix; selection = pattern = indexer."""
        return {**super().base_columns(), "selection": "indexer", "pattern": "indexer",
                "step_overlap": None, "cluster_len": None,
                "fuse_topk": bool(self.cfg.selection.fuse_topk),
                "query_dtype": self.cfg.selection.query_dtype, "context_len": self.cfg.context_len}

    @property
    def steps(self) -> int:
        return self.cfg.steps

    @property
    def num_layers(self) -> int:
        return self.ew.num_layers

    @property
    def rows(self) -> int:
        return self.ew.num_rows

    @property
    def attention_row_bytes(self) -> int:
        """Attention reads the ragged bf16 buffer."""
        m = self.model
        return kv_format.row_bytes("bf16", m.d_nope, m.d_rope)

    def open_backend(self, cls, settings, run):
        self.topk_bad: Optional[str] = None
        return cls(self.ew, settings, attention_kernel=self.cfg.attention_kernel)

    def begin_step(self, be, step: int) -> None:
        be.begin_extend_step(StageTimer(self.device, cold_l2=False, launch_shield_us=0),
                             bool(self.cfg.selection.fuse_topk))

    def layer_inputs(self, be, step: int, layer: int) -> LayerInputs:
        qi, wi = self.ew.index_q(step, layer)
        qi_p, wi_p = pad_index_heads(qi, wi)
        return LayerInputs(step, layer, {"q": self.ew.q(step, layer), "q_idx": qi_p, "w_idx": wi_p},
                           extra={"q_idx": qi, "w_idx": wi})

    def run_layer(self, be, x: LayerInputs, timer):
        t = x.tensors
        return be.extend_layer(x.layer, t["q"], t["q_idx"], t["w_idx"], timer)

    def stage_times(self, t: Dict[str, float]) -> Dict[str, float]:
        t["select"] = t["indexer"] + t["topk"]
        return t

    def check_layer(self, be, x: LayerInputs, out, lse) -> LayerResult:
        ew = self.ew
        pos, outside = selected_positions(ew, be.indices)
        ref_out, ref_lse = reference_attention(ew, x.layer, x.tensors["q"], pos)
        # fp8 queries: scores closer than the fp8 MMA's accumulation error may trade places
        rtol = 2 * FP8_QUERY_TOL if ew.query_dtype == "fp8" else TOPK_SCORE_RTOL
        bad = outside or check_topk(reference_logits(ew, x.layer, x.extra["q_idx"], x.extra["w_idx"]), pos,
                                    ew.ke - ew.ks, rtol)
        if bad and self.topk_bad is None:
            self.topk_bad = f"step {x.step} layer {x.layer}: {bad}"
        return LayerResult(pos.cpu().numpy().astype(np.int32), self.row_lens, relative_error(out, ref_out),
                           lse_error(lse, ref_lse))

    def check_error(self) -> Optional[str]:
        return f"top-k check: {self.topk_bad}" if self.topk_bad else None

    def backend_columns(self, be) -> Dict[str, object]:
        return {"working_set_bytes": be.working_set_bytes(), "host_bytes": 0,
                "stage_plan_us": TimingStats.of(be.plan_us).median_us,
                "plan_builds_per_step": float(np.mean(be.plan_builds))}
