"""HiSparseCoordinator vs the pure-Python model (harness/lru_model.py), on fresh random KV, in
both LRU orders (``upstream``: stamp resolve; ``position``: sort resolve).

Every swap-in is checked four ways: the returned slots equal the model's, the counts equal the
model's, the device rows behind the returned slots hold the host bytes of the selected positions,
and the per-(layer, request) slot map and LRU order equal the model's. Before every call the
resolve's scratch is overwritten with random values (stale stamps must not matter).
"""
import os

import numpy as np
import pytest
import torch

from backends.hisparse_coordinator import (HiSparseCoordinator, HiSparseOOMError,
                                           find_page_overflow, validate_selection)
from backends.kernels.swap_in import PTX_SCATTER_MODES, ResolveLaunch
from harness.lru_model import CoordinatorModel


class Rig:
    """A coordinator, its model and the logical KV rows, stepped together and cross-checked."""

    def __init__(self, *, layers=2, reqs=3, max_seq=96, row_bytes=16, top_k=8, D=24, P=4,
                 gran="token", engine="uva_kernel", order="upstream", device=None, seed=0):
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.c = HiSparseCoordinator(
            num_layers=layers, max_requests=reqs, max_seq_len=max_seq, row_bytes=row_bytes,
            top_k=top_k, device_buffer_size=D, page_size=P, load_granularity=gran,
            copy_engine=engine, lru_order=order, device=device, seed=seed)
        self.m = CoordinatorModel(layers, D, P, gran, order)
        g = torch.Generator().manual_seed(seed + 1)
        self.kv = torch.randint(0, 256, (layers, reqs, max_seq, row_bytes), dtype=torch.uint8,
                                generator=g)
        for r in range(reqs):
            self.c.load_host_kv_all_layers(r, self.kv[:, r])
        self.layers, self.K, self.device = layers, top_k, torch.device(device)
        self.rng = np.random.default_rng(seed + 2)

    def prefill(self, reqs, prompt_lens):
        self.c.prefill(reqs, prompt_lens)
        self.m.prefill(reqs, prompt_lens)

    def swap(self, reqs, seq_lens, sel, layers=None, begin=True, validate=True):
        """One decode step (begin_step + swap-in on each layer), everything checked.
        ``validate=False`` passes positions >= seq_len (treated as -1) to the kernel."""
        if begin:
            self.c.begin_step(reqs, seq_lens)
            self.m.begin_step(reqs, seq_lens)
        sel = np.asarray(sel, dtype=np.int64)
        if validate:
            validate_selection(sel, seq_lens)
        results = []
        for layer in (range(self.layers) if layers is None else layers):
            self.poison_scratch()
            out = self.c.swap_in_selected_pages(
                torch.tensor(reqs, dtype=torch.int32, device=self.device),
                torch.tensor(seq_lens, dtype=torch.int32, device=self.device),
                torch.tensor(sel, dtype=torch.int32, device=self.device), layer)
            res = self.m.swap_in(reqs, seq_lens, sel.tolist(), layer)
            self.check(layer, reqs, sel, out, res)
            results.append(res)
        return results

    def poison_scratch(self):
        """Random stale values in the resolve's scratch, entry ids in range among them."""
        g = torch.Generator().manual_seed(int(self.rng.integers(1 << 30)))
        junk = torch.randint(-3, self.c.k_pad + 3, tuple(self.c.scratch.shape), generator=g,
                             dtype=torch.int32)
        self.c.scratch.copy_(junk)

    def check(self, layer, reqs, sel, out, res):
        c = self.c
        out = out.cpu().numpy().astype(np.int64)
        counts = {k: v.cpu().numpy() for k, v in c.last_counts.items()}
        pool = c.device_pool(layer).cpu()
        for b, r in enumerate(reqs):
            exp = np.asarray(res[b].offsets, dtype=np.int64)
            exp = np.where(exp >= 0, exp + c.request_slot_base(r), -1)
            np.testing.assert_array_equal(out[b], exp, err_msg=f"slots layer {layer} row {b}")
            got = {k: int(counts[k][b]) for k in counts}
            want = dict(hits=res[b].hits, misses=res[b].misses,
                        tokens_loaded=res[b].tokens_loaded, pages_loaded=res[b].pages_loaded,
                        bytes_h2d=res[b].bytes_h2d(c.row_bytes), overflow=int(res[b].overflow),
                        pages_needed=res[b].pages_needed)
            assert got == want, (layer, b)
            live = (sel[b] >= 0) & (sel[b] < self.c._seq_len[r])
            if live.any() and not res[b].overflow:
                rows = pool[torch.from_numpy(out[b][live])]
                assert torch.equal(rows, self.kv[layer, r, torch.from_numpy(sel[b][live])]), \
                    f"device bytes differ from host rows, layer {layer} row {b}"
            buf = self.m.buffer(layer, r)
            assert c.slot_unit[layer, r].tolist() == buf.slot_unit, (layer, b)
            assert c.lru[layer, r].tolist() == buf.lru, (layer, b)

    # ---- selection generators
    def random_sel(self, seq, n_valid=None, dup=True, pad=True):
        K = self.K
        n_valid = K if n_valid is None else n_valid
        s = self.rng.integers(0, seq, n_valid)
        row = np.full(K, -1, dtype=np.int64)
        row[:n_valid] = s
        if dup and n_valid >= 2:
            row[n_valid - 1] = row[0]
        if pad and n_valid == K:
            row[self.rng.integers(0, K)] = -1
        self.rng.shuffle(row)
        return row

    def kind_selection(self, reqs, seq, kind):
        """One row per request of distinct positions below its newest token, all (``hit``),
        half (``mixed``) or none (``miss``) of them resident in layer 0's hot buffer."""
        sel = []
        for r, s in zip(reqs, seq):
            held = self.rng.permutation(self.resident_positions(0, r))
            cold = self.rng.permutation(sorted(set(range(s - 1)) - set(held.tolist())))
            n_held = {"hit": self.K, "mixed": self.K // 2, "miss": 0}[kind]
            sel.append(self.rng.permutation(np.concatenate([held[:n_held],
                                                            cold[:self.K - n_held]])))
        return sel

    def resident_positions(self, layer, req):
        buf = self.m.buffer(layer, req)
        return sorted(u for u in buf.slot_unit if u >= 0)


@pytest.mark.parametrize("order", ["upstream", "position"])
def test_token_mode_random_mixed_batch(order):
    """Short, long and short->long requests in one batch, random selections with -1 and
    duplicates, D = 24 (not a power of two), several steps, two layers."""
    rig = Rig(order=order)
    reqs, lens = [0, 1, 2], [9, 40, 21]       # short, long, crosses D=24 at step 4
    rig.prefill(reqs, lens)
    for step in range(6):
        seq = [n + 1 + step for n in lens]
        rig.swap(reqs, seq, [rig.random_sel(s) for s in seq])


@pytest.mark.parametrize("order", ["upstream", "position"])
def test_token_mode_adversarial_sequence(order):
    rig = Rig(layers=1, reqs=2, top_k=8, D=24, order=order)
    reqs = [1, 0]
    rig.prefill(reqs, [60, 50])
    seq = [61, 51]
    res = rig.swap(reqs, seq, [rig.random_sel(s) for s in seq])
    # all hits: positions currently resident, newest included
    sel = []
    for r, s in zip(reqs, seq):
        res_pos = rig.resident_positions(0, r)
        pick = list(rig.rng.choice(res_pos, rig.K - 1, replace=False)) + [s - 1]
        sel.append(pick)
    res = rig.swap(reqs, seq, sel, begin=False)[0]
    assert all(x.misses == 0 and x.hits == rig.K for x in res)
    # overlap 1: the same selection again is all hits
    res = rig.swap(reqs, seq, sel, begin=False)[0]
    assert all(x.misses == 0 for x in res)
    # all misses, overlap 0: positions neither resident nor newest
    sel = []
    for r, s in zip(reqs, seq):
        free = sorted(set(range(s - 1)) - set(rig.resident_positions(0, r)))
        sel.append(list(rig.rng.choice(free, rig.K, replace=False)))
    res = rig.swap(reqs, seq, sel, begin=False)[0]
    assert all(x.misses == rig.K and x.hits == 0 for x in res)
    # newest token moves on: the previous newest is now a miss; duplicates + -1 + newest
    seq = [62, 52]
    sel = [[60, 60, -1, 61, 61, 3, -1, 60], [50, 51, 2, 2, -1, -1, 40, 41]]
    res = rig.swap(reqs, seq, sel)[0]
    assert res[0].hits + res[0].misses == 3 and res[0].tokens_loaded >= 1


@pytest.mark.parametrize("launch", [None, ResolveLaunch(block_c=16, num_warps=2)])
@pytest.mark.parametrize("order", ["upstream", "position"])
@pytest.mark.parametrize("gran", ["token", "page"])
def test_raw_selections_against_model(gran, order, launch):
    """Unvalidated random selections: many duplicates (units and positions), -1 anywhere,
    positions >= seq_len, the newest token; top_k 12 (padded to 16); short, crossing and long
    requests; in page mode some steps overflow. ``block_c=16`` walks the 24 token slots in two
    chunks."""
    rig = Rig(gran=gran, top_k=12, D=24, P=4, order=order, seed=3)
    if launch is not None:
        rig.c.set_resolve_launch(launch)
    reqs, lens = [1, 2, 0], [12, 21, 60]
    rig.prefill(reqs, lens)
    n_over = n_miss = 0
    for step in range(7):
        seq = [n + 1 + step for n in lens]
        sel = []
        for s in seq:
            hi = s + 6 if step % 2 else min(s, 28)        # odd steps: beyond seq_len too
            row = rig.rng.integers(-1, hi, 12)
            row[rig.rng.integers(0, 12, 3)] = row[0]       # repeats of one position
            if step % 3 == 0:
                row[rig.rng.integers(0, 12)] = s - 1       # the newest token
            sel.append(row)
        for res in rig.swap(reqs, seq, sel, validate=False):
            n_over += sum(r.overflow for r in res)
            n_miss += sum(r.misses for r in res)
    assert n_miss > 0
    assert (n_over > 0) == (gran == "page")


@pytest.mark.parametrize("ptx_scatter,pdl", [("none", False), ("misses", False), ("all", False),
                                             ("none", True), ("misses", True), ("all", True)])
def test_launch_options_against_model(ptx_scatter, pdl):
    """The resolve's scattered stores (``tl.store`` / inline PTX) and the copy's launch (plain /
    programmatic dependent): all-hit, mixed and all-miss steps of distinct positions on fresh
    random KV give the model's slots, counts, device rows, slot map and LRU order (``Rig.swap``
    checks all). On CUDA each option runs its own code; under the interpreter both take
    ``tl.store`` and a plain launch (the options are flags of a CUDA launch only)."""
    rig = Rig(top_k=16, D=32, P=4, max_seq=200, seed=23)
    rig.c.set_resolve_launch(ResolveLaunch(ptx_scatter=ptx_scatter))
    rig.c.set_copy_engine("uva_kernel", pdl=pdl)
    cuda = rig.device.type == "cuda"
    assert rig.c.resolve_ptx_scatter == (PTX_SCATTER_MODES[ptx_scatter] if cuda else 0)
    assert rig.c.engine.pdl == pdl
    reqs, lens = [2, 0, 1], [90, 120, 150]
    rig.prefill(reqs, lens)
    kinds = []
    for step, kind in enumerate(["hit", "mixed", "hit", "miss", "mixed", "hit"]):
        seq = [n + 1 + step for n in lens]
        res = rig.swap(reqs, seq, rig.kind_selection(reqs, seq, kind))
        kinds.append({"hit": all(x.misses == 0 for layer in res for x in layer),
                      "miss": all(x.hits == 0 for layer in res for x in layer),
                      "mixed": all(0 < x.misses < rig.K for layer in res for x in layer)}[kind])
    assert all(kinds)


def test_host_page_order_hands_out_pages_in_order_or_shuffled():
    """``sequential``: each request's host pages are adjacent, in loading order (a fresh pool);
    ``shuffled`` (default): not; a bad order is refused with the allowed names."""
    kw = dict(num_layers=1, max_requests=3, max_seq_len=256, row_bytes=8, top_k=8, page_size=16,
              device="cpu")
    seq = HiSparseCoordinator(host_page_order="sequential", **kw)
    shuf = HiSparseCoordinator(**kw)
    assert shuf.host_page_order == "shuffled"
    rows = torch.randint(0, 256, (256, 8), dtype=torch.uint8)
    for c in (seq, shuf):
        for r in (2, 0, 1):
            c.load_host_kv(0, r, rows[: 100 + 50 * r])
    pages = {r: seq.host_rows_of(r, np.arange(0, 100 + 50 * r, 16)) // 16 for r in range(3)}
    assert pages[2].tolist() == list(range(13)) and pages[0].tolist() == list(range(13, 20))
    assert pages[1].tolist() == list(range(20, 30))
    shuffled = shuf.host_rows_of(2, np.arange(0, 200, 16)) // 16
    assert shuffled.tolist() != sorted(shuffled.tolist())
    for c in (seq, shuf):                                    # the rows are where the table says
        for r in range(3):
            n = 100 + 50 * r
            assert torch.equal(c.host_kv[0][torch.from_numpy(c.host_rows_of(r, np.arange(n)))],
                               rows[:n])
    with pytest.raises(ValueError, match="host_page_order must be one of .*shuffled.*sequential"):
        HiSparseCoordinator(host_page_order="fresh", **kw)


def test_launch_option_validation():
    assert ResolveLaunch().ptx_scatter == "misses"
    for bad in (1, True, "some"):
        with pytest.raises(ValueError, match="ptx_scatter must be one of .*none.*misses.*all"):
            ResolveLaunch(ptx_scatter=bad)
    c = HiSparseCoordinator(num_layers=1, max_requests=1, max_seq_len=64, row_bytes=8, top_k=8,
                            device="cpu")
    assert c.resolve_ptx_scatter == 0 and c.engine.pdl is False     # the interpreter
    c.set_copy_engine("uva_kernel", pdl=True)
    assert c.engine.pdl is True


def test_top_k_equal_to_buffer_evicts_everything():
    rig = Rig(layers=1, reqs=1, top_k=8, D=8, P=4)
    rig.prefill([0], [30])
    for step in range(4):
        seq = [31 + step]
        free = sorted(set(range(seq[0] - 1)) - set(rig.resident_positions(0, 0)))
        sel = [list(rig.rng.choice(free, 8, replace=False))]
        res = rig.swap([0], seq, sel)[0]
        assert res[0].misses == 8


@pytest.mark.parametrize("order", ["upstream", "position"])
def test_page_mode_random_with_overflow_and_crossing(order):
    """Page granularity: C = 24 / 4 = 6 page slots; selections drawn from few pages (no
    overflow) and from many (overflow, reported, state unchanged); a request crossing D."""
    rig = Rig(gran="page", top_k=8, D=24, P=4, order=order)
    reqs, lens = [2, 0, 1], [70, 22, 10]
    rig.prefill(reqs, lens)
    n_over = 0
    for step in range(8):
        seq = [n + 1 + step for n in lens]
        sel = []
        for s in seq:
            n_pages = (s + 3) // 4
            k_pages = 5 if step % 3 else 8         # 8 distinct pages may overflow 6 slots
            pages = rig.rng.choice(n_pages, min(k_pages, n_pages), replace=False)
            row = [min(int(p) * 4 + int(rig.rng.integers(4)), s - 1) for p in pages]
            row = (row + [-1] * 8)[:8]
            if step % 2:
                row[-1] = s - 1                    # the newest token, in the reserved page
            sel.append(row)
        before = [(rig.c.slot_unit[0, r].clone(), rig.c.lru[0, r].clone()) for r in reqs]
        pool_before = rig.c.device_pool(0).clone()
        expected_over = dict(find_page_overflow(np.asarray(sel), seq, 4, 24))
        res = rig.swap(reqs, seq, sel, layers=[0], begin=True)[0]
        for b, r in enumerate(reqs):
            assert res[b].overflow == (b in expected_over)
            if res[b].overflow:
                n_over += 1
                assert res[b].pages_needed == expected_over[b] > 6
                assert torch.equal(rig.c.slot_unit[0, r], before[b][0])
                assert torch.equal(rig.c.lru[0, r], before[b][1])
                base = rig.c.request_slot_base(r)
                sl = slice(base, base + 24)
                assert torch.equal(rig.c.device_pool(0)[sl], pool_before[sl])
        rig.swap(reqs, seq, sel, layers=[1], begin=False)
    assert n_over > 0


@pytest.mark.parametrize("order", ["upstream", "position"])
def test_page_mode_reserved_page_refresh(order):
    """The newest token walks across a page boundary: the reserved page follows it and holds
    every position of the newest page so far; the completed page is then a hot-page miss."""
    rig = Rig(layers=1, reqs=1, gran="page", top_k=8, D=8, P=4, order=order)
    rig.prefill([0], [29])                         # newest page at the first step: 7 (28..31)
    for seq in range(30, 38):
        newest_page = (seq - 1) // 4
        sel = [list(range(newest_page * 4, seq)) + [-1] * (8 - (seq - newest_page * 4))]
        res = rig.swap([0], [seq], sel)[0]
        assert res[0].misses == 0 and res[0].hits == 1
    sel = [[28, 29, 30, 31, 36, -1, -1, -1]]         # page 7 is no longer the newest page
    res = rig.swap([0], [37], sel, begin=False)[0]
    assert res[0].misses == 1 and res[0].tokens_loaded == 4 and res[0].pages_loaded == 1


@pytest.mark.parametrize("order", ["upstream", "position"])
def test_large_buffer_not_power_of_two(order):
    """D = 6144 and top_k = 2048 (one program, 6 LRU chunks), interpreter-sized rows."""
    rig = Rig(layers=1, reqs=1, max_seq=9000, row_bytes=8, top_k=2048, D=6144, P=64, order=order)
    rig.prefill([0], [8000])
    seq = [8001]
    sel = [rig.rng.permutation(8001)[:2048]]       # about 3/4 hits
    res = rig.swap([0], seq, sel)[0]
    assert 0 < res[0].misses < 2048 and res[0].hits > 0
    sel2 = np.concatenate([sel[0][:1024], rig.rng.permutation(8001)[:1024]])
    rig.swap([0], seq, [sel2], begin=False)


def test_begin_step_jump_from_short_to_long():
    rig = Rig(layers=1, reqs=1)
    rig.prefill([0], [5])
    rig.swap([0], [6], [rig.random_sel(6)])
    rig.swap([0], [50], [rig.random_sel(50)])     # grows 6 -> 24 resident, then long


@pytest.mark.parametrize("order", ["upstream", "position"])
def test_resolve_then_copy_stages(order):
    """The two stages of a swap-in: after resolve the missed rows are not loaded yet; after the
    copy they are; a copy for another layer than the plan's is refused."""
    rig = Rig(layers=2, reqs=1, order=order)
    rig.prefill([0], [60])
    rig.c.begin_step([0], [61])
    rig.m.begin_step([0], [61])
    dev = rig.device
    sel = np.array([[50, 51, 52, 53, 3, 4, -1, 60]])
    args = (torch.tensor([0], dtype=torch.int32, device=dev),
            torch.tensor([61], dtype=torch.int32, device=dev),
            torch.tensor(sel, dtype=torch.int32, device=dev))
    before = rig.c.device_pool(0).clone()
    out = rig.c.resolve_selection(*args, 0)
    assert int(rig.c.last_counts["misses"][0]) == 4
    assert torch.equal(rig.c.device_pool(0), before)
    with pytest.raises(ValueError, match="plan is for layer 0"):
        rig.c.copy_planned_misses(1)
    rig.c.copy_planned_misses(0)
    rig.check(0, [0], sel, out, rig.m.swap_in([0], [61], sel.tolist(), 0))


def test_sizes_and_host_page_shuffle():
    c = HiSparseCoordinator(num_layers=2, max_requests=3, max_seq_len=100, row_bytes=16,
                            top_k=8, device_buffer_size=24, page_size=4, device="cpu")
    assert c.device_working_set_bytes() == 2 * 3 * (24 + 4) * 16
    assert c.host_bytes() == 2 * 3 * 100 * 16
    c.load_host_kv(0, 1, torch.randint(0, 256, (40, 16), dtype=torch.uint8))
    pages = c.host_rows_of(1, np.arange(0, 40, 4)) // 4
    assert len(set(pages.tolist())) == 10 and sorted(pages.tolist()) != pages.tolist()


@pytest.mark.parametrize("order", ["upstream", "position"])
@pytest.mark.parametrize("gran", ["token", "page"])
def test_declared_footprint_is_what_it_allocates(gran, order):
    """``footprint_of`` (what the capacity scenario counts) equals the bytes of the device
    tensors allocated; the resolve scratch is per batch row, shared by the layers: upstream
    ``2 k_pad + 2 C + cdiv(max_seq_len, unit)`` int32 (stamps per unit), position
    ``3 k_pad + C``."""
    kw = dict(num_layers=3, max_requests=5, max_seq_len=1000, row_bytes=16, top_k=12,
              device_buffer_size=48, page_size=8, load_granularity=gran, lru_order=order)
    c = HiSparseCoordinator(**kw, device="cpu")
    dev = sum(t.numel() * t.element_size() for t in (
        c.device_kv, c.slot_unit, c.lru, c.host_page_table, c.out, c.plan, c.counts, c.scratch))
    assert HiSparseCoordinator.footprint_of(**kw) == (dev, c.host_kv.numel())
    unit = 8 if gran == "page" else 1
    C = 48 // unit
    width = C + 2 * -(-1000 // unit) if order == "upstream" else 3 * 16 + C
    assert tuple(c.scratch.shape) == (5, width) and c.scratch.dtype == torch.int32


def test_resolve_launch_validation_and_defaults():
    with pytest.raises(ValueError, match="block_c must be a power of two"):
        ResolveLaunch(block_c=24)
    with pytest.raises(ValueError, match="num_warps must be one of"):
        ResolveLaunch(num_warps=3)
    assert ResolveLaunch().resolved(2048, 4096, True) == (4096, 8)
    assert ResolveLaunch().resolved(2048, 4096, False) == (1024, 8)
    assert ResolveLaunch(num_warps=16).resolved(16, 24, True) == (32, 16)
    c = HiSparseCoordinator(num_layers=1, max_requests=1, max_seq_len=64, row_bytes=8, top_k=4,
                            page_size=4, device="cpu")
    with pytest.raises(ValueError, match="resolve_launch must be a ResolveLaunch"):
        c.set_resolve_launch({"num_warps": 4})


def test_host_pool_exhaustion_is_oom():
    c = HiSparseCoordinator(num_layers=1, max_requests=2, max_seq_len=64, row_bytes=8,
                            top_k=4, page_size=4, host_rows=32, device="cpu")
    c.load_host_kv(0, 0, torch.randint(0, 256, (32, 8), dtype=torch.uint8))
    with pytest.raises(HiSparseOOMError, match="host pool exhausted"):
        c.load_host_kv(0, 1, torch.randint(0, 256, (4, 8), dtype=torch.uint8))


@pytest.mark.parametrize("kwargs, match", [
    (dict(top_k=16, device_buffer_size=8), "device_buffer_size"),
    (dict(load_granularity="page", device_buffer_size=30, page_size=4), "multiple of page_size"),
    (dict(load_granularity="block"), "load_granularity"),
    (dict(copy_engine="dma"), "copy_engine"),
    (dict(lru_order="fifo"), "lru_order must be one of"),
    (dict(row_bytes=0), "row_bytes"),
])
def test_constructor_validation(kwargs, match):
    args = dict(num_layers=1, max_requests=2, max_seq_len=64, row_bytes=8, top_k=4,
                page_size=4, device="cpu")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        HiSparseCoordinator(**args)


def test_selection_and_call_validation():
    with pytest.raises(ValueError, match=r"topk_indices\[1, 2\] = 7"):
        validate_selection(np.array([[0, 1, 2], [0, -1, 7]]), [5, 7])
    with pytest.raises(ValueError, match=r"topk_indices\[0, 0\] = -3"):
        validate_selection(np.array([[-3]]), [5])
    with pytest.raises(ValueError, match="seq_lens"):
        validate_selection(np.array([[0]]), [0])
    c = HiSparseCoordinator(num_layers=1, max_requests=2, max_seq_len=64, row_bytes=8, top_k=4,
                            page_size=4, device="cpu")
    t = torch.zeros(1, 4, dtype=torch.int32)
    one = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="topk_indices must be int32"):
        c.swap_in_selected_pages(one * 0, one, t.long(), 0)
    with pytest.raises(ValueError, match="top_k=4"):
        c.swap_in_selected_pages(one * 0, one, torch.zeros(1, 5, dtype=torch.int32), 0)
    with pytest.raises(ValueError, match="layer_id"):
        c.swap_in_selected_pages(one * 0, one, t, 3)
    with pytest.raises(ValueError, match="seq_lens"):
        c.swap_in_selected_pages(one * 0, torch.ones(2, dtype=torch.int32), t, 0)
    with pytest.raises(ValueError, match="distinct"):
        c.begin_step([0, 0], [3, 3])
    with pytest.raises(ValueError, match="not been prefilled"):
        c.begin_step([1], [3])


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["upstream", "position"])
@pytest.mark.parametrize("gran", ["token", "page"])
def test_gpu_uva_dsv32_size(gran, order):
    """On the GPU: pinned host pool read over UVA, 656 B rows, top_k 2048, D 4096, 64-token
    pages; several steps with ~60% overlap, checked against the model and the host bytes."""
    D, K, P = 4096, 2048, 64
    rig = Rig(layers=1, reqs=2, max_seq=20000, row_bytes=656, top_k=K, D=D, P=P, gran=gran,
              order=order, device="cuda")
    assert rig.c.host_kv.is_pinned()
    reqs, lens = [1, 0], [16000, 3000]             # long and short
    rig.prefill(reqs, lens)
    prev = [None, None]
    for step in range(3):
        seq = [n + 1 + step for n in lens]
        sel = []
        for b, s in enumerate(seq):
            if gran == "page":                     # <= 50 pages of 64, within 64 page slots
                n_pages = min(50, s // P)
                pages = rig.rng.choice(s // P, n_pages, replace=False)
                row = (pages[:, None] * P + rig.rng.integers(0, P, (n_pages, 41))).reshape(-1)
                row = np.resize(row, K)
            elif prev[b] is None:
                row = rig.rng.permutation(s)[:K]
            else:
                row = np.concatenate([prev[b][:1200], rig.rng.permutation(s)[:K - 1200]])
            prev[b] = row
            sel.append(row)
        rig.swap(reqs, seq, sel)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="in-process CPU points need TRITON_INTERPRET=1")
def test_backend_lru_order_setting(tmp_path):
    """``hisparse.lru_order`` reaches the coordinator and the result row, in both orders the
    point is correct (checked against the reference by the runner), and a bad value names the
    field and its choices."""
    from backends.base import ConfigError
    from backends.hisparse import HiSparseBackend, HiSparseSettings
    from cli import compose
    from harness.config import ModelConfig, load_model_preset
    from harness.workload import Workload
    from harness import results
    from harness.runner import run_point
    from harness.validate import validate
    point = ["device=cpu", "model=tiny", "backend=hisparse", "top_k=16",
             "hisparse.device_buffer_size=24", "page_size=8", "context_len=60", "batch_size=2",
             "steps=3", "timing.warmup_steps=1", "num_layers=1", "step_overlap=0.6",
             "report=false"]
    for order in ("upstream", "position"):
        cfg = compose(*point, f"hisparse.lru_order={order}")
        validate(cfg)
        run_point(cfg, torch.device("cpu"), tmp_path / order, "python -m harness ...", "h")
        row = results.load(tmp_path / order).iloc[0]
        assert row["status"] == "ok", row["error"]
        assert row["lru_order"] == order and row["misses"] > 0
        be = HiSparseBackend(Workload.build(
            model=ModelConfig(**load_model_preset("tiny")), device=torch.device("cpu"),
            kv_dtype="bf16", page_size=8, seq_lens=np.array([[40, 50]], dtype=np.int32),
            topk=np.zeros((1, 1, 2, 16), dtype=np.int32), top_k=16, num_layers=1, seed=0),
            HiSparseSettings(24, "token", "uva_kernel", "triton", order))
        assert be.coord.lru_order == order
    with pytest.raises(ConfigError, match=r"hisparse\.lru_order.*upstream.*position"):
        validate(compose(*point, "hisparse.lru_order=fifo"))
