"""The three copy engines: each against a pure-numpy reference copy, and all three through the
coordinator giving byte-identical device pools."""
import numpy as np
import pytest
import torch

from backends.copy_engines import COPY_ENGINES, MemcpyEngine, make_copy_engine, word_view
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
