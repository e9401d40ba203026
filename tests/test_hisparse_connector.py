"""The HiSparse connector design (backends/hisparse_connector.py) on fresh seeded random KV.

Full residency: no host bytes, no misses, and the same output as flashmla_sparse (both against
the torch reference). Zero residency: per (step, layer, request) the same hits, misses and copied
rows as the hisparse backend (token mode, uva_kernel) on the same trace. Mixed residency: counts,
tiers, hot-region rows, slot maps and LRU order against harness/connector_model.py over several
steps, and the bytes behind every returned row against the logical KV. Plus the residency plan
against the model, the declared footprint against the allocations, and bad settings.
"""
import numpy as np
import pytest
import torch

from backends.base import BackendInvalid, ConfigError
from backends.connector_residency import ACTIVE_TAIL_PAGES, plan_residency, spill_order
from backends.flashmla_sparse import FlashMLASparseBackend
from backends.hisparse import HiSparseBackend, HiSparseSettings
from backends.hisparse_connector import HiSparseConnectorBackend, HiSparseConnectorSettings
from harness.config import ModelConfig, load_model_preset
from harness.connector_model import ConnectorModel, pool_pages, resident_pages
from harness.selection import PatternParams, synthesize
from harness.timing import StageTimer
from harness.workload import Workload, lse_error, relative_error

TINY = ModelConfig(**load_model_preset("tiny"))
TOL = 0.03


def make_workload(device, *, contexts, steps=5, layers=2, top_k=16, page_size=8, kv_dtype="fp8_ds_mla",
                  seed=0, newest_every=2):
    """Requests of the given prompt lengths, random selections with 85 % step overlap; every
    ``newest_every``-th row selects the newest token, some rows end in -1 padding."""
    seq = (np.asarray(contexts)[None, :] + 1 + np.arange(steps)[:, None]).astype(np.int32)
    topk = synthesize(PatternParams("random", 16, 64, 512), seq, layers, top_k, 0.85, seed)
    rng = np.random.default_rng(seed + 9)
    for s in range(steps):
        for layer in range(layers):
            for b in range(seq.shape[1]):
                row = topk[s, layer, b]
                newest = seq[s, b] - 1
                if (s + layer + b) % newest_every == 0 and newest not in row:
                    row[0] = newest
                if rng.random() < 0.3:
                    row[-rng.integers(1, 4):] = -1
    return Workload.build(model=TINY, device=device, kv_dtype=kv_dtype, page_size=page_size,
                          seq_lens=seq, topk=topk, top_k=top_k, num_layers=layers, seed=seed)


def drive(be, wl):
    """prefill, then every step and layer through ``decode_layer`` with a stage timer; yields
    (step, layer, positions, out, lse, counts) after each layer step."""
    be.prefill()
    timer = StageTimer(wl.device)
    for s in range(wl.steps):
        be.begin_step(s)
        seq = torch.from_numpy(wl.seq_lens[s]).to(wl.device)
        for layer in range(wl.num_layers):
            q = wl.q(s, layer)
            pos = torch.from_numpy(wl.topk[s, layer]).to(wl.device)
            timer.begin()
            out, lse = be.decode_layer(s, layer, q, pos, seq, timer)
            t = timer.end()
            assert set(be.stages) <= set(t)
            yield s, layer, pos, out, lse, be.layer_counts(layer)


def connector(wl, fraction, D=None):
    return HiSparseConnectorBackend(wl, HiSparseConnectorSettings(device_buffer_size=D,
                                                                  resident_fraction=fraction))


def logical_rows(wl, layer, b, positions):
    """The logical KV bytes of request ``b``'s positions (uint8 [n, row_bytes])."""
    p = torch.as_tensor(positions, dtype=torch.int64, device=wl.device)
    slots = wl.block_table[b].long()[p // wl.page_size] * wl.page_size + p % wl.page_size
    rows = wl.kv_flat(layer)[slots]
    return rows if rows.dtype == torch.uint8 else rows.contiguous().view(torch.uint8)


# ---------------------------------------------------------------- the residency plan
def test_spill_order_follows_vllm_release_order():
    """Three requests of 5 pages, pool of 9: six pages go, request 0's head pages from the
    highest down, then request 1's; active tails and request 2 stay."""
    order = [tuple(x) for x in spill_order([5, 5, 5])]
    assert order[:6] == [(0, 2), (0, 1), (0, 0), (1, 2), (1, 1), (1, 0)]
    assert order[9:] == [(0, 4), (0, 3), (1, 4), (1, 3), (2, 4), (2, 3)]   # active tails last
    m = plan_residency([5, 5, 5], 9)
    assert m.tolist() == [[False] * 3 + [True] * 2, [False] * 3 + [True] * 2, [True] * 5]
    assert ACTIVE_TAIL_PAGES == 2


@pytest.mark.parametrize("pages", [[5, 5, 5], [1, 7, 3, 12], [2], [9, 1]])
def test_residency_plan_matches_model(pages):
    total = sum(pages)
    for budget in range(total + 1):
        plan = plan_residency(pages, budget)
        model = resident_pages(pages, budget)
        assert plan.sum() == budget
        for r, n in enumerate(pages):
            assert set(np.nonzero(plan[r])[0].tolist()) == model[r], (pages, budget, r)
            assert not plan[r, n:].any()


# ---------------------------------------------------------------- full residency
def test_full_residency_is_flashmla_sparse(device):
    wl = make_workload(device, contexts=[60, 130, 45])
    be = connector(wl, 1.0)
    assert be.host_bytes() == 0 and be.lay.hot_requests == 0
    ref_be = FlashMLASparseBackend(wl)
    ref_runs = {(s, l): (out, lse) for s, l, _, out, lse, _ in drive(ref_be, wl)}
    n = 0
    for s, layer, pos, out, lse, c in drive(be, wl):
        valid = (pos >= 0).sum(dim=1).cpu().numpy()
        np.testing.assert_array_equal(c["resident_hits"], valid)
        np.testing.assert_array_equal(c["hits"], valid)
        for k in ("misses", "tokens_loaded", "pages_loaded", "bytes_h2d"):
            assert not c[k].any(), k
        ref_out, ref_lse = wl.reference(layer, wl.q(s, layer), pos)
        f_out, f_lse = ref_runs[(s, layer)]
        assert relative_error(out, ref_out) <= TOL and lse_error(lse, ref_lse) <= 0.05
        assert relative_error(f_out, ref_out) <= TOL
        assert torch.equal(out, f_out) and torch.equal(lse, f_lse)
        n += 1
    assert n == wl.steps * wl.num_layers


# ---------------------------------------------------------------- zero residency
def test_zero_residency_is_hisparse_token_mode(device):
    """Short, crossing (D = 40 reached at step 3) and long requests: identical counts to the
    SGLang-style backend per (step, layer, request), and identical outputs."""
    D = 40
    wl = make_workload(device, contexts=[20, 37, 120, 200], steps=6)
    be = connector(wl, 0.0, D=D)
    assert be.lay.resident_pages == 0 and be.lay.hot_requests == wl.batch_size
    hs = HiSparseBackend(wl, HiSparseSettings(D, "token", "uva_kernel", "triton"))
    theirs = {(s, l): (out, c) for s, l, _, out, _, c in drive(hs, wl)}
    total_misses = 0
    for s, layer, pos, out, lse, c in drive(be, wl):
        h_out, hc = theirs[(s, layer)]
        for k in ("hits", "misses", "tokens_loaded", "bytes_h2d"):
            np.testing.assert_array_equal(c[k], hc[k], err_msg=f"{k} step {s} layer {layer}")
        assert not c["resident_hits"].any()
        assert torch.equal(out, h_out)
        total_misses += int(c["misses"].sum())
    assert total_misses > 0


# ---------------------------------------------------------------- mixed residency
@pytest.mark.parametrize("fraction, kv_dtype", [(0.5, "fp8_ds_mla"), (0.3, "bf16"), (0.8, "fp8_ds_mla")])
def test_mixed_residency_against_model(device, fraction, kv_dtype):
    D, P = 40, 8
    wl = make_workload(device, contexts=[150, 37, 120, 200, 20], kv_dtype=kv_dtype, page_size=P)
    be = connector(wl, fraction, D=D)
    pages = [-(-int(wl.seq_lens[:, b].max()) // P) for b in range(wl.batch_size)]
    model = ConnectorModel(pages, fraction, num_layers=wl.num_layers, device_buffer_size=D,
                           page_size=P)
    assert be.lay.resident_pages == model.budget == pool_pages(sum(pages), fraction)
    assert np.nonzero(be.hot_np >= 0)[0].tolist() == model.hot_requests
    model.prefill((wl.seq_lens[0] - 1).tolist())
    tiers = set()
    for s, layer, pos, out, lse, c in drive(be, wl):
        if layer == 0:
            model.begin_step(wl.seq_lens[s].tolist())
        res = model.step(layer, wl.seq_lens[s].tolist(), wl.topk[s, layer].tolist())
        rows = be.out[layer].cpu().numpy().astype(np.int64)   # what the resolver returned
        pool = be.device_kv[layer]
        for b, r in enumerate(res):
            want = dict(resident_hits=r.resident_hits, hits=r.hits, misses=r.misses,
                        tokens_loaded=r.misses, bytes_h2d=r.misses * wl.row_bytes)
            assert {k: int(c[k][b]) for k in want} == want, (s, layer, b)
            p = wl.topk[s, layer, b]
            for k, tier in enumerate(r.tier):
                tiers.add(tier)
                if tier == "resident":
                    assert rows[b, k] == be.residency_np[b, p[k] // P] * P + p[k] % P
                elif tier == "hot":
                    assert rows[b, k] == be._hot_base(b) + r.hot_offsets[k], (s, layer, b, k)
                else:
                    assert rows[b, k] == -1
            live = p >= 0
            got = pool[torch.from_numpy(rows[b][live]).to(device)]
            assert torch.equal(got, logical_rows(wl, layer, b, p[live])), (s, layer, b)
            if (layer, b) in model.buffers:
                buf, h = model.buffers[(layer, b)], int(be.hot_np[b])
                assert be.slot_pos[layer, h].tolist() == buf.slot_unit
                assert be.lru[layer, h].tolist() == buf.lru
        ref_out, ref_lse = wl.reference(layer, wl.q(s, layer), pos)
        assert relative_error(out, ref_out) <= TOL and lse_error(lse, ref_lse) <= 0.05
    assert tiers == {"resident", "hot", "none"}


# ---------------------------------------------------------------- memory
def test_footprint_is_what_it_allocates(device):
    wl = make_workload(device, contexts=[100, 100, 100], steps=3)
    for fraction in (0.0, 0.4, 1.0):
        be = connector(wl, fraction, D=24)
        dev_b, host_b = HiSparseConnectorBackend.footprint(
            3, int(wl.seq_lens.max()), top_k=wl.top_k, page_size=wl.page_size,
            row_bytes=wl.row_bytes, num_layers=wl.num_layers,
            settings=HiSparseConnectorSettings(24, fraction))
        assert be.working_set_bytes() == dev_b and be.host_bytes() == host_b
        assert HiSparseConnectorBackend.host_bytes_needed(wl, be.cfg) == host_b
    # zero residency, independently: every page on the host, 3 hot regions of D + 1 rows
    pages = -(-int(wl.seq_lens.max()) // wl.page_size)
    be = connector(wl, 0.0, D=24)
    assert be.host_bytes() == wl.num_layers * 3 * pages * wl.page_size * wl.row_bytes
    assert be.device_kv.shape[1] == -(-3 * 25 // 64) * 64
    # full residency: the pool holds exactly the batch's pages, rounded to 64 rows
    be = connector(wl, 1.0)
    assert be.device_kv.shape[1] == -(-3 * pages * wl.page_size // 64) * 64


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("settings, field", [
    (HiSparseConnectorSettings(device_buffer_size=8), "hisparse_connector.device_buffer_size"),
    (HiSparseConnectorSettings(device_buffer_size=20.5), "hisparse_connector.device_buffer_size"),
    (HiSparseConnectorSettings(resident_fraction=1.5), "hisparse_connector.resident_fraction"),
    (HiSparseConnectorSettings(resident_fraction=-0.1), "hisparse_connector.resident_fraction"),
    (HiSparseConnectorSettings(resident_fraction="half"), "hisparse_connector.resident_fraction"),
])
def test_bad_settings_name_the_field(device, settings, field):
    with pytest.raises(ConfigError, match=field):
        HiSparseConnectorBackend.check(settings.resolved(16), top_k=16, page_size=8, phase="decode")
    wl = make_workload(device, contexts=[30], steps=1, layers=1)
    with pytest.raises(BackendInvalid, match=field):
        HiSparseConnectorBackend(wl, settings)


def test_bad_selection_is_invalid_before_any_kernel(device):
    wl = make_workload(device, contexts=[30, 40], steps=2, layers=1)
    wl.topk[1, 0, 1, :2] = [5, 5]
    with pytest.raises(BackendInvalid, match="step 1, layer 0: batch row 1 selects a position twice"):
        connector(wl, 0.5)
    wl.topk[1, 0, 1, :2] = [5, 99]
    with pytest.raises(BackendInvalid, match=r"step 1, layer 0: topk_indices\[1, 1\] = 99"):
        connector(wl, 0.5)


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_graph_capture_replays_like_eager():
    """A layer step captured in a CUDA graph at mixed residency: its replays give the eager
    run's outputs and counts (same selections, same state evolution)."""
    dev = torch.device("cuda")
    wl = make_workload(dev, contexts=[3000, 9000, 600, 5000], steps=4, layers=2, top_k=512,
                       page_size=64)
    eager = {}
    be = connector(wl, 0.4)
    assert be.graph_capture_blocker() == ""
    for s, layer, _, out, lse, c in drive(be, wl):
        eager[(s, layer)] = (out.clone(), lse.clone(), c)
    be = connector(wl, 0.4)
    be.prefill()
    graphs = {}
    for s in range(wl.steps):
        be.begin_step(s)
        seq = torch.from_numpy(wl.seq_lens[s]).to(dev)
        for layer in range(wl.num_layers):
            q, pos = wl.q(s, layer), torch.from_numpy(wl.topk[s, layer]).to(dev)
            if layer not in graphs:
                sq, sp, ss = q.clone(), pos.clone(), seq.clone()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):      # captured, not run: state advances at replay
                    outs = be.decode_layer(s, layer, sq, sp, ss, _Untimed())
                graphs[layer] = (g, sq, sp, ss, outs)
            g, sq, sp, ss, (out, lse) = graphs[layer]
            sq.copy_(q), sp.copy_(pos), ss.copy_(seq)
            g.replay()
            torch.cuda.synchronize()
            e_out, e_lse, e_c = eager[(s, layer)]
            assert torch.equal(out, e_out) and torch.equal(lse, e_lse)
            c = be.layer_counts(layer)
            for k in e_c:
                np.testing.assert_array_equal(c[k], e_c[k])


class _Untimed:
    def run(self, stage, fn):
        return fn()


@pytest.mark.gpu
def test_gpu_full_residency_costs_what_flashmla_sparse_costs():
    """dsv32 shape, 32 requests at 16K context, top-k 2048: the connector's resolve + attention
    at full residency within 10 % (+ 5 us) of flashmla_sparse's transform + attention, cold L2,
    launch shield, medians of 20 samples each, interleaved."""
    from harness.timing import time_fn
    dev = torch.device("cuda")
    m = ModelConfig(**load_model_preset("dsv32"))
    seq = np.full((1, 32), 16385, dtype=np.int32)
    topk = synthesize(PatternParams("random", 16, 64, 512), seq, 1, 2048, 0.85, 0)
    wl = Workload.build(model=m, device=dev, kv_dtype="fp8_ds_mla", page_size=64, seq_lens=seq,
                        topk=topk, top_k=2048, num_layers=1, seed=0)
    q, pos, sl = wl.q(0, 0), torch.from_numpy(topk[0, 0]).to(dev), torch.from_numpy(seq[0]).to(dev)
    conn, flash = connector(wl, 1.0), FlashMLASparseBackend(wl)
    conn.prefill(), conn.begin_step(0)
    u = _Untimed()
    ours = lambda: conn.decode_layer(0, 0, q, pos, sl, u)      # noqa: E731
    theirs = lambda: flash.decode_layer(0, 0, q, pos, sl, u)   # noqa: E731
    assert torch.equal(ours()[0], theirs()[0])
    a, b = [], []
    for _ in range(5):
        a.append(time_fn(ours, dev, repeats=20).median_us)
        b.append(time_fn(theirs, dev, repeats=20).median_us)
    t_ours, t_theirs = float(np.median(a)), float(np.median(b))
    assert t_ours <= 1.10 * t_theirs + 5.0, (t_ours, t_theirs)
    assert conn.layer_counts(0)["bytes_h2d"].sum() == 0


@pytest.mark.gpu
def test_gpu_mixed_residency_pinned_dsv32_rows():
    """On the GPU: pinned host pool read over UVA by the fused resolver, 656 B rows, top-k 2048,
    D 4096, 64-token pages, mixed residency; counts, rows and bytes against the model."""
    dev = torch.device("cuda")
    m = ModelConfig(**load_model_preset("dsv32"))
    seq = (np.array([16000, 3000, 9000])[None, :] + 1 + np.arange(3)[:, None]).astype(np.int32)
    topk = synthesize(PatternParams("random", 16, 64, 512), seq, 1, 2048, 0.6, 1)
    wl = Workload.build(model=m, device=dev, kv_dtype="fp8_ds_mla", page_size=64, seq_lens=seq,
                        topk=topk, top_k=2048, num_layers=1, seed=1)
    be = connector(wl, 0.35)
    assert be.host_kv.is_pinned()
    pages = [-(-int(seq[:, b].max()) // 64) for b in range(3)]
    model = ConnectorModel(pages, 0.35, num_layers=1, device_buffer_size=4096, page_size=64)
    model.prefill((seq[0] - 1).tolist())
    for s, layer, pos, out, lse, c in drive(be, wl):
        model.begin_step(seq[s].tolist())
        res = model.step(0, seq[s].tolist(), topk[s, 0].tolist())
        assert c["misses"].tolist() == [r.misses for r in res]
        assert c["resident_hits"].tolist() == [r.resident_hits for r in res]
        for b in range(3):
            p = topk[s, 0, b]
            live = p >= 0
            rows = be.out[0, b][torch.from_numpy(live).to(dev)].long()
            assert torch.equal(be.device_kv[0][rows], logical_rows(wl, 0, b, p[live]))
    assert sum(r.misses for r in res) > 0


def test_resident_fraction_within_a_budget_is_the_most_that_fits():
    """Brute force over every resident page count of a small batch: the fraction returned keeps
    the most pages whose layout fits the budget; None below the zero-residency footprint."""
    from backends.connector_residency import connector_layout
    kw = dict(top_k=16, page_size=8, row_bytes=656, num_layers=2)
    s = HiSparseConnectorSettings(device_buffer_size=40)
    B, n_tok = 3, 100
    total = 3 * 13
    bytes_at = [connector_layout([n_tok] * B, device_buffer_size=40, resident_fraction=r / total,
                                 num_counts=5, **kw).device_bytes for r in range(total + 1)]
    for budget in (min(bytes_at) - 1, min(bytes_at), bytes_at[7] + 100, bytes_at[20], max(bytes_at)):
        f = HiSparseConnectorBackend.resident_fraction_within(budget, B, n_tok, settings=s, **kw)
        fitting = [r for r in range(total + 1) if bytes_at[r] <= budget]
        if not fitting:
            assert f is None
            continue
        assert f == max(fitting) / total
        dev_b, _ = HiSparseConnectorBackend.footprint(B, n_tok, **kw,
                                                      settings=HiSparseConnectorSettings(40, f))
        assert dev_b <= budget
