"""The three copy engines: each against a pure-numpy reference copy, and all three through the
coordinator giving byte-identical device pools."""
import numpy as np
import pytest
import torch

from backends.copy_engines import (COPY_ENGINES, MemcpyEngine, UvaKernelEngine, make_copy_engine,
                                   word_view)
from test_hisparse_coordinator import Rig


def random_plan(rng, batch, max_misses, host_units, dev_units, unit_rows):
    """A plan with distinct device units (across the batch) and random host units."""
    plan = np.zeros((batch, 1 + 2 * max_misses), dtype=np.int32)
    dst_units = rng.permutation(dev_units)
    used = 0
    for b in range(batch):
        n = int(rng.integers(0, max_misses + 1))
        plan[b, 0] = n
        plan[b, 1:1 + n] = rng.integers(0, host_units, n) * unit_rows
        plan[b, 1 + max_misses:1 + max_misses + n] = dst_units[used:used + n] * unit_rows
        used += n
    return plan


def reference_copy(host, dev, plan, batch, unit_rows):
    out = dev.copy()
    m = (plan.shape[1] - 1) // 2
    for b in range(batch):
        for j in range(plan[b, 0]):
            for r in range(unit_rows):
                out[plan[b, 1 + m + j] + r] = host[plan[b, 1 + j] + r]
    return out


@pytest.mark.parametrize("engine", COPY_ENGINES)
@pytest.mark.parametrize("row_bytes, unit_rows", [(16, 1), (12, 3), (10, 1), (7, 2)])
def test_engine_matches_reference(device, engine, row_bytes, unit_rows):
    rng = np.random.default_rng(row_bytes * 10 + unit_rows)
    batch, max_misses = 3, 6
    host = rng.integers(0, 256, (40 * unit_rows, row_bytes), dtype=np.uint8)
    dev = rng.integers(0, 256, (60 * unit_rows, row_bytes), dtype=np.uint8)
    plan = random_plan(rng, batch, max_misses, 40, 60, unit_rows)
    plan[1, 0] = max_misses if plan[1, 0] == 0 else plan[1, 0]
    plan[1, 1:1 + max_misses] = rng.integers(0, 40, max_misses) * unit_rows
    want = reference_copy(host, dev, plan, batch, unit_rows)
    eng = make_copy_engine(engine, capacity_rows=batch * max_misses * unit_rows,
                           row_bytes=row_bytes, device=device)
    dev_t = torch.from_numpy(dev.copy()).to(device)
    host_t = torch.from_numpy(host)
    if device.type == "cuda":
        host_t = host_t.pin_memory()            # the zero-copy kernel reads it over UVA
    eng.copy(host_t, dev_t, torch.from_numpy(plan).to(device), batch, unit_rows)
    np.testing.assert_array_equal(dev_t.cpu().numpy(), want)
    assert not np.array_equal(want, dev)       # the plan moved something


def test_memcpy_runs_merge_contiguous_units():
    counts = np.array([4, 3])
    src = np.array([[8, 9, 10, 20], [0, 1, 2, 0]])
    dst = np.array([[100, 101, 102, 103], [50, 52, 53, 0]])
    runs = MemcpyEngine.copy_runs(counts, src, dst, 1)
    assert runs == [(8, 100, 3), (20, 103, 1), (0, 50, 1), (1, 52, 2)]
    runs = MemcpyEngine.copy_runs(np.array([2]), np.array([[64, 128]]), np.array([[0, 64]]), 64)
    assert runs == [(64, 0, 128)]


def test_word_view_is_widest_divisor():
    for nbytes, dtype in ((656, torch.int64), (1152, torch.int64), (12, torch.int32),
                          (10, torch.int16), (7, torch.uint8)):
        assert word_view(torch.zeros(3, nbytes, dtype=torch.uint8)).dtype == dtype


def test_engine_validation():
    with pytest.raises(ValueError, match="copy_engine"):
        make_copy_engine("dma", capacity_rows=1, row_bytes=8, device="cpu")
    eng = make_copy_engine("memcpy", capacity_rows=1, row_bytes=8, device="cpu")
    plan = torch.zeros(1, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="host_layer"):
        eng.copy(torch.zeros(4, 8, dtype=torch.int32), torch.zeros(4, 8, dtype=torch.uint8),
                 plan, 1, 1)
    with pytest.raises(ValueError, match="rows differ"):
        eng.copy(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 16, dtype=torch.uint8),
                 plan, 1, 1)
    with pytest.raises(ValueError, match="plan"):
        eng.copy(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 8, dtype=torch.uint8),
                 plan[:, :2], 1, 1)


def run_sequence(engine, gran, device, steps=4, **rig_kwargs):
    """Drives a Rig (every step model-checked) and returns its device pool and outputs."""
    lens = rig_kwargs.pop("lens", [60, 20])
    rig = Rig(layers=1, reqs=2, gran=gran, engine=engine, device=device, seed=5, **rig_kwargs)
    reqs = [1, 0]
    rig.prefill(reqs, lens)
    D, P = rig.c.device_buffer_size, rig.c.page_size
    outs = []
    for step in range(steps):
        seq = [n + 1 + step for n in lens]
        sel = []
        for s in seq:
            if gran == "page":
                pages = rig.rng.choice((s + P - 1) // P, min(D // P, (s + P - 1) // P),
                                       replace=False)
                row = np.minimum(pages * P + rig.rng.integers(0, P, len(pages)), s - 1)
                sel.append(np.resize(row, rig.K))
            else:
                sel.append(rig.random_sel(s))
        rig.swap(reqs, seq, sel)
        outs.append(rig.c.out[0, :2].cpu().clone())
    return rig.c.device_kv.cpu().clone(), outs


@pytest.mark.parametrize("gran", ["token", "page"])
def test_engines_give_identical_device_pools(device, gran):
    pools = {e: run_sequence(e, gran, device) for e in COPY_ENGINES}
    ref_pool, ref_outs = pools["uva_kernel"]
    for e in ("memcpy", "staged"):
        assert torch.equal(pools[e][0], ref_pool), e
        for a, b in zip(pools[e][1], ref_outs):
            assert torch.equal(a, b), e


@pytest.mark.gpu
def test_gpu_engines_identical_dsv32_rows():
    """On the GPU, pinned host pool: 656 B rows, top_k 2048, D 4096, 64-token pages."""
    kw = dict(max_seq=12000, row_bytes=656, top_k=2048, D=4096, P=64, lens=[10000, 3000])
    pools = {e: run_sequence(e, "token", "cuda", steps=2, **dict(kw)) for e in COPY_ENGINES}
    for e in ("memcpy", "staged"):
        assert torch.equal(pools[e][0], pools["uva_kernel"][0]), e


# ------------------------------------------------------------------ uva_kernel launch variants
#: (rows_per_program, num_warps, programs, load_cache, store_cache)
LAUNCHES = [(4, 4, 0, "", ""), (1, 1, 0, ".cg", ".cs"), (16, 8, 0, ".cv", ".wt"),
            (2, 2, 3, "", ""), (8, 4, 1, ".cg", ".cg"), (32, 8, 64, ".ca", ".wb")]


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda t: "r{}w{}p{}{}{}".format(*t))
@pytest.mark.parametrize("row_bytes, unit_rows", [(656, 1), (12, 3)])
def test_uva_launch_variants_copy_exactly_the_plan(device, launch, row_bytes, unit_rows):
    """Every launch variant (capacity grid and persistent grids smaller and larger than the
    chunk count) writes exactly the planned rows, bytes equal, every other row untouched;
    batch rows with no misses sit between full ones."""
    rows, warps, programs, lc, sc = launch
    rng = np.random.default_rng(rows * 131 + programs * 7 + row_bytes + unit_rows)
    batch, max_misses, host_units, dev_units = 5, 7, 50, 64
    host = rng.integers(0, 256, (host_units * unit_rows, row_bytes), dtype=np.uint8)
    dev = rng.integers(0, 256, (dev_units * unit_rows, row_bytes), dtype=np.uint8)
    plan = random_plan(rng, batch, max_misses, host_units, dev_units, unit_rows)
    plan[1, 0] = 0                                  # an empty row between others
    plan[3, 0] = max_misses                         # one row at the plan's capacity
    used = {int(x) for b in (0, 2, 4) for x in plan[b, 1 + max_misses:1 + max_misses + plan[b, 0]]}
    free = [u * unit_rows for u in range(dev_units) if u * unit_rows not in used]
    plan[3, 1:1 + max_misses] = rng.integers(0, host_units, max_misses) * unit_rows
    plan[3, 1 + max_misses:] = free[:max_misses]
    want = reference_copy(host, dev, plan, batch, unit_rows)
    eng = UvaKernelEngine(rows_per_program=rows, num_warps=warps, programs=programs,
                          load_cache=lc, store_cache=sc)
    host_t = torch.from_numpy(host)
    if device.type == "cuda":
        host_t = host_t.pin_memory()
    dev_t = torch.from_numpy(dev.copy()).to(device)
    eng.copy(host_t, dev_t, torch.from_numpy(plan).to(device), batch, unit_rows)
    np.testing.assert_array_equal(dev_t.cpu().numpy(), want)
    assert (want != dev).any(axis=1).sum() == plan[:batch, 0].sum() * unit_rows


def test_uva_launch_validation():
    for kwargs, field in ((dict(rows_per_program=3), "rows_per_program"),
                          (dict(num_warps=3), "num_warps"), (dict(programs=-1), "programs"),
                          (dict(load_cache=".cs"), "load_cache"),
                          (dict(store_cache=".ca"), "store_cache")):
        with pytest.raises(ValueError, match=field):
            UvaKernelEngine(**kwargs)
    eng = UvaKernelEngine(rows_per_program=8, programs=4, load_cache=".cg")
    assert UvaKernelEngine(**eng.launch_config()).launch_config() == eng.launch_config()


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [0, 132])
def test_gpu_uva_copy_is_graph_capturable(programs):
    """Captured once in a CUDA graph, a replay copies the plan as it is at replay time (counts
    and rows read on the device, no host sync)."""
    from harness.timing import capture_graph
    rng = np.random.default_rng(programs)
    host = torch.from_numpy(rng.integers(0, 256, (1 << 16, 656), dtype=np.uint8)).pin_memory()
    dev = torch.zeros((4096, 656), dtype=torch.uint8, device="cuda")
    plan = torch.zeros((4, 1 + 2 * 2048), dtype=torch.int32, device="cuda")
    eng = UvaKernelEngine(programs=programs)
    graph, _ = capture_graph(lambda: eng.copy(host, dev, plan, 4, 1))
    p = random_plan(rng, 4, 2048, 1 << 16, 4096, 1)
    plan.copy_(torch.from_numpy(p))
    dev.zero_()
    graph.replay()
    want = reference_copy(host.numpy(), np.zeros((4096, 656), np.uint8), p, 4, 1)
    np.testing.assert_array_equal(dev.cpu().numpy(), want)


# ------------------------------------------------------------------ the swap_in bench's sections
def test_gather_host_rows_distributions():
    from harness.bench.swap_in import GATHER_DISTS, OS_PAGE, gather_host_rows
    pool, n, rb, window = 20000, 300, 656, 1000 * 656
    for dist in GATHER_DISTS:
        rows = gather_host_rows(dist, np.random.default_rng(1), pool, n, rb, window)
        assert rows.dtype == np.int64 and len(rows) == n and len(set(rows.tolist())) == n, dist
        assert rows.min() >= 0 and rows.max() < pool, dist
        pages = np.unique(rows * rb // OS_PAGE)
        if dist in ("sorted", "pages_4k", "contiguous"):
            assert (np.diff(rows) > 0).all(), dist
        if dist == "random":
            assert not (np.diff(rows) > 0).all() and len(pages) > 0.9 * n
        if dist == "window":
            assert rows.max() - rows.min() < 1000
        if dist == "pages_4k":                     # fewest pages: about n / (4096 / 656)
            assert len(pages) <= n // (OS_PAGE // rb) + 3
        if dist == "contiguous":
            assert rows[-1] - rows[0] == n - 1
    with pytest.raises(ValueError, match="gather distribution"):
        gather_host_rows("strided", np.random.default_rng(1), pool, n, rb, window)


def _bench_run():
    import argparse
    from harness.bench.measure import BenchRun
    # no warm-up calls: each row's checked first call ran the kernel already (in the interpreter
    # a warm-up call costs as much as a timed one)
    args = argparse.Namespace(quick=True, repeats=2, warmup=0, section=("gather", "context"),
                              host_alloc=("pinned",), host_page_order=("shuffled",),
                              resolve_kernel=("triton",), host_translations=("cycled",))
    return BenchRun("swap_in", args, torch.device("cpu"), "test swap_in")


def _small_sizes():
    from dataclasses import replace
    from harness.bench import swap_in as sw
    return replace(sw.QUICK, gather_pools=(4096,), gather_rows=(16, 40), gather_runs=2,
                   gather_variants=("default", "persist4x_rows4"), context_lens=(200, 300))


def test_swap_in_gather_and_context_sections(capsys):
    """The gather rows: every (rows, distribution, variant) in every run, checked exact; the
    summary reports each run's GB/s; the context rows: resolve, copy and total per context
    with the same miss counts their free run recorded."""
    import pandas as pd
    from harness.bench import swap_in as sw
    run, sz = _bench_run(), _small_sizes()
    sw.gather(run, sz)
    sw.context(run, sz)
    df = pd.DataFrame(run.rows)
    assert set(df["status"]) == {"ok"} and (df["max_rel_err"] == 0).all()
    g = df[df["kernel"] == "gather"]
    keys = set(zip(g["misses"], g["case"], g["variant"], g["seed"]))
    want = {(n, "random", v, r) for n in sz.gather_rows for v in sz.gather_variants
            for r in range(sz.gather_runs)}
    want |= {(40, d, "default", r) for d in (*sw.GATHER_DISTS[1:], "random_cpu_read")
             for r in range(sz.gather_runs)}
    assert keys == want and len(g) == len(want)
    assert (g["bytes_h2d"] == g["misses"] * sz.row_bytes).all()
    assert (g["host_bytes"] == 4096 * sz.row_bytes).all()
    out = capsys.readouterr().out
    assert "== gather" in out and "== swap-in at equal misses vs context" in out
    c = df[df["case"] == "context"]
    assert sorted(set(c["kernel"])) == ["copy_planned_misses", "resolve_selection",
                                         "swap_in_selected_pages"]
    assert sorted(set(c["context_len"])) == [200, 300] and (c["misses"] > 0).all()
    assert (c["host_bytes"].astype(int) > 0).all()
    copies = c[c["kernel"] == "copy_planned_misses"]
    assert set(copies["variant"]) == set(sz.context_variants) and len(copies) == 4
    assert (copies.groupby("context_len")["misses"].nunique() == 1).all()
    text = sw.context_summary(run.rows)
    assert text.count("\ncontext ") == 2 * len(sz.context_variants)


def test_swap_in_gather_and_context_flag_a_dropped_row(monkeypatch):
    """A uva copy that leaves one planned row unwritten makes the gather rows and the context
    copy / total rows incorrect, and the resolve rows too (their reference, the free run, had a
    wrong row)."""
    from dataclasses import replace

    import pandas as pd
    from harness.bench import swap_in as sw
    real = UvaKernelEngine._copy

    def dropping(self, host_layer, device_layer, plan, batch, unit_rows):
        m = (plan.shape[1] - 1) // 2
        keep = plan[0, 1 + m].clone()
        saved = device_layer[int(keep)].clone()
        real(self, host_layer, device_layer, plan, batch, unit_rows)
        device_layer[int(keep)] = saved
    monkeypatch.setattr(UvaKernelEngine, "_copy", dropping)
    run, sz = _bench_run(), _small_sizes()
    sz = replace(sz, gather_rows=(16,), gather_variants=("default",), context_lens=(200,))
    monkeypatch.setattr(sw, "GATHER_DISTS", ("random",))
    sw.gather(run, sz)
    sw.context(run, sz)
    df = pd.DataFrame(run.rows)
    bad = df[df["kernel"].isin(["gather", "copy_planned_misses", "swap_in_selected_pages"])]
    assert len(bad) and set(bad["status"]) == {"incorrect"} and (bad["max_rel_err"] > 0).all()
    assert set(df[df["kernel"] == "resolve_selection"]["status"]) == {"incorrect"}


def test_uva_pdl_option(device):
    """``pdl``: validated, in the launch config, chosen by ``make_copy_engine`` (off under the
    interpreter unless asked for), and the copy with it moves the same rows as without."""
    with pytest.raises(ValueError, match="pdl"):
        UvaKernelEngine(pdl=1)
    assert UvaKernelEngine(pdl=True).launch_config()["pdl"] is True
    assert make_copy_engine("uva_kernel", capacity_rows=1, row_bytes=8, device="cpu").pdl is False
    assert make_copy_engine("uva_kernel", capacity_rows=1, row_bytes=8, device="cpu",
                            pdl=True).pdl is True
    g = torch.Generator().manual_seed(7)
    host = torch.randint(0, 256, (64, 24), dtype=torch.uint8, generator=g)
    if device.type == "cuda":
        host = host.pin_memory()
    plan = torch.zeros((3, 1 + 2 * 5), dtype=torch.int32)
    plan[:, 0] = torch.tensor([5, 0, 3])
    plan[:, 1:6] = torch.randperm(64, generator=g)[:15].view(3, 5).int()
    plan[:, 6:11] = torch.randperm(40, generator=g)[:15].view(3, 5).int()
    plan = plan.to(device)
    pools = []
    for pdl in (False, True):
        dev = torch.zeros((40, 24), dtype=torch.uint8, device=device)
        UvaKernelEngine(rows_per_program=2, programs=4, pdl=pdl).copy(host, dev, plan, 3, 1)
        pools.append(dev.cpu())
    assert torch.equal(pools[0], pools[1])
    p = plan.cpu()
    for b in range(3):
        for j in range(int(p[b, 0])):
            assert torch.equal(pools[1][int(p[b, 6 + j])], host.cpu()[int(p[b, 1 + j])])


def test_swap_in_context_section_with_sequential_host_pages():
    """``--host-page-order sequential``: its own case (``context+sequential``), every row exact,
    and the same misses per step as the shuffled pool's (the page order moves host rows only)."""
    from dataclasses import replace

    import pandas as pd
    from harness.bench import swap_in as sw
    run, sz = _bench_run(), replace(_small_sizes(), context_lens=(300,), context_variants=("default",))
    run.args.host_page_order = ("shuffled", "sequential")
    sw.context(run, sz)
    df = pd.DataFrame(run.rows)
    assert set(df["status"]) == {"ok"} and (df["max_rel_err"] == 0).all()
    assert set(df["case"]) == {"context", "context+sequential"}
    misses = df.groupby("case")["misses"].first()
    assert misses["context"] == misses["context+sequential"] > 0


def test_swap_in_context_section_with_cold_host_translations():
    """``--host-translations cycled,cold``: the copy and the swap-in in both modes (the cold
    rows case ``...+cold``, column ``cold_host_translations`` true, every row exact), the
    resolve once; the summary gives the cold rows the resolve of their case."""
    from dataclasses import replace

    import pandas as pd
    from harness.bench import swap_in as sw
    run, sz = _bench_run(), replace(_small_sizes(), context_lens=(300,), context_variants=("default",))
    run.args.host_translations = ("cycled", "cold")
    sw.context(run, sz)
    df = pd.DataFrame(run.rows)
    assert set(df["status"]) == {"ok"} and (df["max_rel_err"] == 0).all()
    by = df.groupby(["kernel", "case"])["cold_host_translations"].agg(list).to_dict()
    assert by == {("resolve_selection", "context"): [False],
                  ("copy_planned_misses", "context"): [False],
                  ("copy_planned_misses", "context+cold"): [True],
                  ("swap_in_selected_pages", "context"): [False],
                  ("swap_in_selected_pages", "context+cold"): [True]}
    table = sw.context_summary(run.rows)
    cold = [line for line in table.splitlines() if line.startswith("context+cold")]
    assert len(cold) == 1 and "nan" not in cold[0]


def test_swap_in_context_flags_are_checked_before_any_kernel():
    """``--contexts`` too short for the section's never-resident positions, more than one
    ``--context-batch``, an unknown ``--host-page-order`` or ``--resolve-kernel`` stop with a
    message naming the flag."""
    from cli import run_harness
    base = ["run", "swap_in", "--quick", "--section", "context", "--host-alloc", "registered"]
    for extra, words in ((["--contexts", "100,400"], "--contexts: [100] below 112"),
                         (["--context-batch", "2,3"], "--context-batch takes one value"),
                         (["--host-page-order", "fresh"], "--host-page-order takes a comma list"),
                         (["--resolve-kernel", "cub"],
                          "--resolve-kernel takes a comma list of triton, cuda"),
                         (["--host-translations", "warm"],
                          "--host-translations takes a comma list of cycled, cold")):
        r = run_harness(*base, *extra, check=False, module="harness.bench")
        assert r.returncode != 0 and words in r.stderr + r.stdout, (extra, r.stderr[-500:])
