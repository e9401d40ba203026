"""scenario=capacity: maximum batches from the declared footprints, honest memory, throughput,
bad input (CPU, tiny model, a budget of a few MB)."""
import pytest
import torch

from backends import BACKENDS
from backends.hisparse import HiSparseBackend
from cli import compose, run_harness
from harness import results
from harness.runner import run_point
from harness.validate import validate

# device budget = 0.05 GB x 1 / 61 layers = 0.82 MB for the KV-related buffers of one layer
POINT = ["device=cpu", "model=tiny", "scenario=capacity", "top_k=16", "page_size=16",
         "context_len=120", "steps=3", "timing.warmup_steps=1", "num_layers=1", "report=false",
         "capacity.kv_budget_gb=0.05", "capacity.rest_of_layer=none"]
ROW_BYTES = 256 + 4 * 256 // 128 + 2 * 64  # fp8_ds_mla at the tiny model: 392 B
INDEX_BYTES = 64 + 4                        # fp8 index key + its scale, per token


def _run(d, *overrides):
    cfg = compose(*POINT, *overrides)
    validate(cfg)
    run_point(cfg, torch.device("cpu"), d, "python -m harness scenario=capacity", "h")
    return results.load(d)


@pytest.fixture(scope="module")
def point(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("capacity"), "capacity.batch_sizes=[2]")


def _pool_pages(batch, max_pos, P):  # pages of a paged pool, rounded up to 64 rows
    used = batch * -(-max_pos // P)
    per = max(1, 64 // P)
    return -(-used // per) * per


def _shared(batch, max_pos, P):  # index keys + block table, every design
    return _pool_pages(batch, max_pos, P) * P * INDEX_BYTES + batch * -(-max_pos // P) * 4


def _flashmla_bytes(batch, max_pos=123, P=16):
    return _pool_pages(batch, max_pos, P) * P * ROW_BYTES + _shared(batch, max_pos, P)


def _hisparse_bytes(batch, max_pos=123, P=16, K=16):
    D = 2 * K
    per = ((D + P) * ROW_BYTES            # hot buffer + reserved page
           + 2 * D * 4                      # slot map + LRU order
           + -(-max_pos // P) * 4           # host page table
           + K * 4                          # slot table
           + (1 + 2 * min(K, D)) * 4        # miss plan
           + 7 * 8                          # counts (7 fields)
           + (D + 2 * max_pos) * 4)         # resolve scratch (upstream: evictables, 2 stamps a unit)
    return batch * per + _shared(batch, max_pos, P)


def _largest(fn, budget):
    b = 0
    while fn(b + 1) <= budget:
        b += 1
    return b


def test_max_batch_equals_an_independent_count(point):
    df = point.set_index(["backend", "capacity_point"])
    budget = int(0.05e9 * 1 / 61)
    assert (point["device_budget_bytes"] == budget).all()
    for name, fn in (("flashmla_sparse", _flashmla_bytes), ("hisparse", _hisparse_bytes)):
        row = df.loc[(name, "max")]
        assert row["max_batch"] == _largest(fn, budget) == row["batch_size"]
        assert row["footprint_device_bytes"] == fn(row["batch_size"])
    # offloading holds several times the resident design's requests at this context
    assert df.loc[("hisparse", "max"), "max_batch"] >= 2 * df.loc[("flashmla_sparse", "max"), "max_batch"]


def test_runs_are_correct_and_allocate_what_they_declare(point):
    assert set(point["backend"]) == set(BACKENDS)
    assert (point["status"] == "ok").all(), point[["backend", "status", "error"]]
    # measured set-up allocations within 2 % + 16 KiB of the computed footprint (selections aside)
    dev = point["footprint_device_bytes"].astype(float)
    assert (point["setup_device_bytes"] <= dev * 1.02 + 16384).all()
    assert (point["setup_device_bytes"] >= dev * 0.98).all()
    fm = point[point.backend == "flashmla_sparse"]
    assert (fm["host_bytes"] == 0).all() and (fm["bytes_h2d"] == 0).all()
    hs = point[point.backend == "hisparse"]
    assert (hs["host_bytes"] > 0).all() and (hs["misses"] > 0).all()


def test_throughput_columns(point):
    for _, r in point.iterrows():
        assert r["tpot_ms"] == pytest.approx(61 * r["latency_us_median"] / 1e3)
        assert r["tokens_per_s"] == pytest.approx(r["batch_size"] / (r["tpot_ms"] / 1e3))


def test_connector_follows_the_budget(point):
    cn = point[point.backend == "hisparse_connector"].set_index("capacity_point")
    # at a small listed batch everything stays resident: nothing moves from host
    assert cn.loc["listed", "resident_fraction"] == 1.0 and cn.loc["listed", "bytes_h2d"] == 0
    # at its maximum batch the pool is short: pages spill and rows are copied
    assert cn.loc["max", "resident_fraction"] < 1.0 and cn.loc["max", "bytes_h2d"] > 0
    assert cn.loc["max", "footprint_device_bytes"] <= cn.loc["max", "device_budget_bytes"]


def test_a_planted_over_allocation_is_incorrect(tmp_path, monkeypatch):
    orig = HiSparseBackend.__init__

    def leaky(self, wl, settings, **kw):  # memory kept beyond what the design declares
        orig(self, wl, settings, **kw)
        self.leak = torch.ones(32 << 20, dtype=torch.uint8)

    monkeypatch.setattr(HiSparseBackend, "__init__", leaky)
    df = _run(tmp_path, "backend=hisparse", "capacity.workspace_mb=16", "capacity.workspace_fraction=0")
    r = df.iloc[0]
    assert r["status"] == "incorrect" and "footprint" in r["error"]


def test_indexer_selection_inside_the_capacity_step(tmp_path):
    df = _run(tmp_path, "selection=indexer", "backend=hisparse", "context_len=60")
    r = df.iloc[0]
    assert r["status"] == "ok", r["error"]
    assert r["stage_select_us"] > 0 and r["selection"] == "indexer" and r["misses"] > 0


def test_a_budget_below_one_request_is_oom(tmp_path):
    df = _run(tmp_path, "capacity.kv_budget_gb=0.001")
    assert (df["status"] == "oom").all() and df["error"].str.contains("one request needs").all()
    assert (df["max_batch"] == 0).all()


def test_a_listed_batch_above_the_maximum_is_invalid(tmp_path):
    df = _run(tmp_path, "backend=flashmla_sparse", "capacity.batch_sizes=[500]")
    by = df.set_index("capacity_point")
    assert by.loc["max", "status"] == "ok"
    assert by.loc["listed", "status"] == "invalid" and "above" in by.loc["listed", "error"]


@pytest.mark.parametrize("override, field", [("capacity.tp_size=3", "capacity.tp_size"),
                                             ("capacity.host_budget_gb=1e9", "capacity.host_budget_gb"),
                                             ("capacity.rest_of_layer=fast", "capacity.rest_of_layer"),
                                             ("selection=trace", "selection")])
def test_bad_input_exits_2_naming_the_field(tmp_path, override, field):
    r = run_harness(*POINT, override, f"hydra.run.dir={tmp_path}", check=False)
    assert r.returncode == 2 and field in r.stderr, r.stderr[-2000:]
