"""pattern=calibrated: exact-LRU miss rates against the published ones, reuse-distance and
overlap statistics against the parameters, validity, determinism, validation."""
import dataclasses

import numpy as np
import pytest

from harness.calibrated_selection import reuse_survival
from harness.config import SelectionConfig
from harness.selection import PatternParams, synthesize
from harness.selection_calibration import (QUICK, TARGET_MISS, CalibrationProtocol, lru_miss_rate,
                                           optimal_miss_rate, overlap, selections)
from harness.validate import ConfigError, check_value
from harness.workload import synthetic_seq_lens

CAL = PatternParams("calibrated")


def _cal(seq_lens, layers=2, top_k=64, seed=0, **kw):
    return synthesize(dataclasses.replace(CAL, **kw), seq_lens, layers, top_k, 0.85, seed)


def _check_miss_rates(protocol):
    topk, seq_lens = selections(protocol, CAL)
    for layer in range(protocol.layers):  # every layer, inherited positions or not
        for mult, target in TARGET_MISS.items():
            got = lru_miss_rate(topk, seq_lens, mult * protocol.top_k, protocol.warmup_steps,
                                layers=[layer])
            assert abs(got - target) <= 0.02, (layer, mult, got, target)
    return topk, seq_lens


def test_lru_miss_rates_match_published_at_reduced_size():
    """QUICK: top_k 256 at 4K context; the model is scale-free, so the targets hold."""
    topk, seq_lens = _check_miss_rates(QUICK)
    # the offline optimum never misses more than LRU on the same selections
    for mult in (2, 4):
        k = mult * QUICK.top_k
        assert optimal_miss_rate(topk, seq_lens, k, QUICK.warmup_steps) <= \
            lru_miss_rate(topk, seq_lens, k, QUICK.warmup_steps, layers=[0])


@pytest.mark.slow
def test_lru_miss_rates_match_published_at_full_size():
    """top_k 2048, 32K context, 8 requests x 2 layers, 48 warm-up + 64 measured steps."""
    _check_miss_rates(CalibrationProtocol())


def test_optimal_miss_rate_against_brute_force_belady():
    """One request, a tiny buffer: Belady by hand (evict the resident next wanted furthest)."""
    seq_lens = synthetic_seq_lens(40, 12, 1)
    topk = _cal(seq_lens, layers=1, top_k=8, seed=3)
    C, warm = 12, 2
    resident = list(range(C))  # after prefill
    hits = misses = 0
    for s in range(12):
        n = int(seq_lens[s, 0])
        want = [p for p in topk[s, 0, 0].tolist() if p != n - 1]

        def next_use(p, s=s):
            return next((t for t in range(s + 1, 12) if p in topk[t, 0, 0]), 99)
        miss = [p for p in want if p not in resident]
        spare = sorted((p for p in resident if p not in want), key=next_use, reverse=True)
        for _ in range(len(resident) + len(miss) - C):
            resident.remove(spare.pop(0))
        resident += miss
        if s >= warm:
            hits, misses = hits + 8 - len(miss), misses + len(miss)
    got = optimal_miss_rate(topk, seq_lens, C, warm)
    assert got == pytest.approx(misses / (hits + misses))


@pytest.mark.parametrize("reuse_overlap,reuse_alpha", [(0.7, 0.45), (0.5, 0.8)])
def test_reuse_distance_survival_follows_parameters(reuse_overlap, reuse_alpha):
    """P(reuse distance > d) of the tokens selected at the first steps, every layer, against
    (1 - reuse_overlap) d^-reuse_alpha."""
    steps, batch, k = 40, 4, 256
    seq_lens = synthetic_seq_lens(16384, steps, batch)
    x = _cal(seq_lens, layers=2, top_k=k, reuse_overlap=reuse_overlap, reuse_alpha=reuse_alpha)
    want = reuse_survival(reuse_overlap, reuse_alpha)
    for layer in range(2):
        later = {d: [] for d in (1, 2, 4, 8, 16)}
        for b in range(batch):
            member = np.zeros((steps, int(seq_lens.max())), dtype=bool)
            for s in range(steps):
                member[s, x[s, layer, b]] = True
            for s in range(8):
                tok = x[s, layer, b]
                first = np.argmax(member[s + 1:, tok], axis=0) + 1
                first[~member[s + 1:, tok].any(axis=0)] = steps
                for d in later:
                    later[d].append(first > d)
        for d, seen in later.items():
            assert np.concatenate(seen).mean() == pytest.approx(want[d], abs=0.02), (layer, d)


@pytest.mark.parametrize("reuse_overlap,layer_share", [(0.7, 0.85), (0.5, 0.6), (0.9, 0.0)])
def test_step_and_layer_overlap_follow_parameters(reuse_overlap, layer_share):
    k, context = 256, 8192
    seq_lens = synthetic_seq_lens(context, 12, 4)
    x = _cal(seq_lens, layers=3, top_k=k, reuse_overlap=reuse_overlap, layer_share=layer_share)
    assert overlap(x[1:], x[:-1]) == pytest.approx(reuse_overlap, abs=0.01)
    chance = k / context  # the rest of two layers' rows overlaps like independent selections
    want = layer_share + (1 - layer_share) * chance
    assert overlap(x[:, 1:], x[:, :-1]) == pytest.approx(want, abs=0.02)


def test_layer_share_one_repeats_layer_zero_and_zero_is_independent():
    seq_lens = synthetic_seq_lens(4096, 5, 3)
    same = np.sort(_cal(seq_lens, layers=3, layer_share=1.0), axis=-1)  # the same sets
    assert np.array_equal(same[:, 1], same[:, 0]) and np.array_equal(same[:, 2], same[:, 0])
    apart = _cal(seq_lens, layers=2, layer_share=0.0)
    assert overlap(apart[:, 1], apart[:, 0]) < 0.05


def test_overlap_against_python_sets():
    rng = np.random.default_rng(5)
    a = np.stack([rng.permutation(50)[:20] for _ in range(6)])
    b = np.stack([rng.permutation(50)[:20] for _ in range(6)])
    b[0, 15:] = -1
    a[1, 10:] = -1
    want = np.mean([len(set(a[i]) & set(b[i]) - {-1}) / (a[i] >= 0).sum() for i in range(6)])
    assert overlap(a, b) == pytest.approx(want)


@pytest.mark.parametrize("contexts", [[4000, 4000, 4000], [30, 63, 64, 70, 300, 5000]])
def test_rows_are_distinct_valid_positions(contexts):
    """Distinct positions < seq_len; -1 padding exactly where seq_len < top_k, where every
    position is selected; requests of different lengths in one batch."""
    k, steps = 64, 6
    seq_lens = np.stack([synthetic_seq_lens(c, steps, 1)[:, 0] for c in contexts], axis=1)
    x = _cal(seq_lens, layers=3, top_k=k)
    assert x.shape == (steps, 3, len(contexts), k) and x.dtype == np.int32
    for s in range(steps):
        for layer in range(3):
            for b, n in enumerate(seq_lens[s]):
                row = x[s, layer, b]
                m = min(k, int(n))
                assert (row[m:] == -1).all()
                assert len(set(row[:m].tolist())) == m and row[:m].min() >= 0 and row.max() < n
                if n <= k:
                    assert sorted(row[:m].tolist()) == list(range(n))


def test_decoded_tokens_are_ordinary_positions():
    """As in the random pattern, the tokens decoded during the run (the newest included) are
    candidates like any other: some are selected, the newest is not always selected."""
    seq_lens = synthetic_seq_lens(2048, 30, 8)
    x = _cal(seq_lens, layers=1, top_k=256)
    assert (x[:, 0] >= seq_lens[0, 0]).any()
    newest = (x[:, 0] == (seq_lens - 1)[:, :, None]).any(-1)
    assert 0 < newest.mean() < 0.5


def test_deterministic_from_seed_and_seed_matters():
    seq_lens = synthetic_seq_lens(3000, 5, 3)
    a, b, c = _cal(seq_lens), _cal(seq_lens), _cal(seq_lens, seed=1)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert (a != c).mean() > 0.5


def test_config_defaults_are_the_fitted_parameters():
    sel = SelectionConfig()
    assert (sel.reuse_overlap, sel.reuse_alpha, sel.layer_share) == \
        (CAL.reuse_overlap, CAL.reuse_alpha, CAL.layer_share)


@pytest.mark.parametrize("field,value,allowed", [
    ("selection.reuse_overlap", 1.2, "fraction in [0, 1]"),
    ("selection.layer_share", -0.1, "fraction in [0, 1]"),
    ("selection.reuse_alpha", -0.5, ">= 0"),
    ("selection.reuse_alpha", "heavy", ">= 0"),
])
def test_bad_parameters_are_rejected_naming_the_field(field, value, allowed):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as e:
        check_value(field, value)
    assert allowed in str(e.value)
    check_value("pattern", "calibrated")
