"""Selections: shapes, validity, determinism, pattern structure and step overlap."""
import numpy as np
import pytest

from harness.selection import PATTERNS, PatternParams, Trace, distinct_counts, synthesize
from harness.workload import synthetic_seq_lens


def _sel(pattern, top_k=64, context=500, steps=5, batch=3, layers=2, overlap=0.8, seed=0, **kw):
    sl = synthetic_seq_lens(context, steps, batch)
    return sl, synthesize(PatternParams(pattern, **kw), sl, layers, top_k, overlap, seed)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_rows_are_distinct_valid_positions(pattern):
    sl, x = _sel(pattern, cluster_len=8, num_sinks=4, window=16)
    assert x.shape == (5, 2, 3, 64) and x.dtype == np.int32
    for s in range(5):
        for layer in range(2):
            for b in range(3):
                row = x[s, layer, b]
                assert (row >= 0).all()
                assert len(set(row.tolist())) == 64
                assert row.max() < sl[s, b]


def test_short_requests_are_padded_with_minus_one():
    sl, x = _sel("random", top_k=64, context=20, steps=3)
    for s in range(3):
        n = sl[s, 0]
        row = x[s, 0, 0]
        assert (row[:n] >= 0).all() and (row[n:] == -1).all()
        assert sorted(row[:n].tolist()) == list(range(n))


def test_deterministic_from_seed_and_seed_matters():
    _, a = _sel("mixed", num_sinks=4, window=8)
    _, b = _sel("mixed", num_sinks=4, window=8)
    _, c = _sel("mixed", num_sinks=4, window=8, seed=1)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize("overlap", [0.0, 0.5, 0.85, 1.0])
def test_step_overlap_fraction(overlap):
    _, x = _sel("random", top_k=128, context=4000, steps=4, overlap=overlap)
    for s in range(1, 4):
        for b in range(3):
            kept = len(set(x[s - 1, 0, b].tolist()) & set(x[s, 0, b].tolist()))
            # fresh draws may hit a dropped position again by chance (4000 candidates)
            assert round(overlap * 128) <= kept <= round(overlap * 128) + 12


def test_window_prefix_and_clusters():
    sl, x = _sel("sliding_window", top_k=32)
    assert sorted(x[2, 0, 0].tolist()) == list(range(sl[2, 0] - 32, sl[2, 0]))
    _, x = _sel("prefix", top_k=32)
    assert sorted(x[3, 1, 2].tolist()) == list(range(32))
    _, x = _sel("clustered", top_k=64, context=100000, overlap=0.0, cluster_len=16)
    row = np.sort(x[0, 0, 0])
    runs = 1 + int((np.diff(row) != 1).sum())
    assert runs <= 8  # 64 tokens in runs of 16: at most 4 runs unless two runs touch


def test_mixed_contains_sinks_and_window():
    sl, x = _sel("mixed", top_k=64, context=1000, overlap=0.0, num_sinks=8, window=16)
    row = set(x[0, 0, 0].tolist())
    assert set(range(8)) <= row
    assert set(range(sl[0, 0] - 16, sl[0, 0])) <= row


def test_distinct_counts_against_python():
    rng = np.random.default_rng(3)
    x = rng.integers(-1, 300, size=(4, 50)).astype(np.int32)
    tok, pages = distinct_counts(x, 16)
    for r in range(4):
        v = [p for p in x[r].tolist() if p >= 0]
        assert tok[r] == len(set(v))
        assert pages[r] == len({p // 16 for p in v})


def test_trace_round_trip(tmp_path):
    sl, x = _sel("clustered", cluster_len=4)
    path = Trace(x, sl).save(tmp_path / "t.npz")
    tr = Trace.load(path)
    assert np.array_equal(tr.topk, x) and np.array_equal(tr.seq_lens, sl)
    assert tr.topk.dtype == np.int32
