"""The pure-Python reference model itself: hand-worked cases and invariants."""
import numpy as np
import pytest

from harness.lru_model import CoordinatorModel, HotBufferModel


def test_token_mode_hand_worked_step_position_order():
    m = HotBufferModel(device_buffer_size=4, page_size=2, load_granularity="token",
                       lru_order="position")
    m.prefill(10)                       # hot: slots 0..3 hold positions 0..3, LRU [0,1,2,3]
    assert m.slot_unit == [0, 1, 2, 3] and m.lru == [0, 1, 2, 3]
    m.begin_step(11)                    # newest token 10 -> reserved offset 4
    r = m.step(11, [7, 2, 10, -1, 5, 2])
    # hits: 2 (slot 2) and the newest 10; misses 5, 7 take LRU evictables 0, 1 (ascending)
    assert r.offsets == [1, 2, 4, -1, 0, 2]
    assert (r.hits, r.misses, r.tokens_loaded, r.pages_loaded) == (2, 2, 2, 0)
    assert m.slot_unit == [5, 7, 2, 3]
    assert m.lru == [3, 0, 1, 2]        # untouched 3, misses (5->0, 7->1), hit 2
    r = m.step(11, [3, 9])              # 3 hit (slot 3); 9 takes LRU slot 0 (held 5)
    assert r.offsets == [3, 0] and (r.hits, r.misses) == (1, 1)
    assert m.lru == [1, 2, 0, 3] and m.slot_unit == [9, 7, 2, 3]
    r = m.step(11, [3, 7])              # hits 3 (slot 3), 7 (slot 1): ascending position
    assert m.lru == [2, 0, 3, 1] and r.misses == 0


def test_token_mode_hand_worked_step_upstream_order():
    m = HotBufferModel(device_buffer_size=4, page_size=2, load_granularity="token")
    m.prefill(10)
    m.begin_step(11)
    r = m.step(11, [7, 2, 10, -1, 5, 2])
    # misses in selection order: 7 -> LRU evictable 0, 5 -> 1; hit 2; newest 10 reserved
    assert r.offsets == [0, 2, 4, -1, 1, 2] and r.loaded == [(7, 0), (5, 1)]
    assert (r.hits, r.misses, r.tokens_loaded, r.pages_loaded) == (2, 2, 2, 0)
    assert m.slot_unit == [7, 5, 2, 3] and m.lru == [3, 0, 1, 2]
    r = m.step(11, [3, 9])              # 3 hit (slot 3); 9 takes LRU slot 0 (held 7)
    assert r.offsets == [3, 0] and (r.hits, r.misses) == (1, 1)
    assert m.lru == [1, 2, 0, 3] and m.slot_unit == [9, 5, 2, 3]
    r = m.step(11, [3, 5])              # hits 5 (slot 1), 3 (slot 3): the order the walk meets
    assert m.lru == [2, 0, 1, 3] and r.misses == 0
    r = m.step(11, [3, 5])              # the same hits again: already the walk's order
    assert m.lru == [2, 0, 1, 3]


def test_page_mode_hand_worked_miss_order():
    """Pages as units: upstream takes misses by their first entry, position by page."""
    sel = [11, 1, 8, 10, 0, 12]         # pages 5, 0, 4, 5, 0, 6 (6: newest, reserved)
    want = {"upstream": ([3, 1, 4, 2, 0, 8], [0, 5, 4, 3], [(5, 1), (4, 2)]),
            "position": ([5, 1, 2, 4, 0, 8], [0, 4, 5, 3], [(4, 1), (5, 2)])}
    for order, (offsets, slots, loaded) in want.items():
        m = HotBufferModel(8, 2, "page", order)   # 4 page slots holding pages 0..3
        m.prefill(12)
        m.begin_step(13)
        r = m.step(13, sel)
        assert r.offsets == offsets and m.slot_unit == slots and r.loaded == loaded, order
        assert m.lru == [3, 1, 2, 0]
        assert (r.hits, r.misses, r.tokens_loaded, r.pages_loaded, r.pages_needed) == \
            (2, 2, 4, 2, 3)


def test_page_mode_hand_worked_step_and_overflow():
    m = HotBufferModel(device_buffer_size=4, page_size=2, load_granularity="page")  # 2 pages
    m.prefill(9)                        # hot pages 0, 1 (positions 0..3)
    m.begin_step(10)                    # newest 9 -> page 4 is the reserved page
    r = m.step(10, [8, 9, 5, 1])
    # page 4 (8, 9): reserved hit; page 0 (1): hit in slot 0; page 2 (5): miss -> slot 1
    assert r.offsets == [4, 5, 3, 1]
    assert (r.hits, r.misses, r.tokens_loaded, r.pages_loaded, r.pages_needed) == (2, 1, 2, 1, 2)
    assert m.slot_unit == [0, 2] and m.lru == [1, 0]
    before = (list(m.slot_unit), list(m.lru))
    r = m.step(10, [0, 3, 5])           # pages 0, 1, 2: 3 > 2 slots
    assert r.overflow and r.pages_needed == 3 and r.offsets == [-1, -1, -1]
    assert (list(m.slot_unit), list(m.lru)) == before


def test_short_request_is_position_ordered():
    for gran in ("token", "page"):
        m = HotBufferModel(8, 4, gran)
        m.prefill(5)
        m.begin_step(6)
        r = m.step(6, [5, 0, 3, 3, -1])
        assert r.offsets == [5, 0, 3, 3, -1]
        assert r.misses == 0 and r.hits == (3 if gran == "token" else 2)


@pytest.mark.parametrize("order", ["upstream", "position"])
@pytest.mark.parametrize("gran", ["token", "page"])
def test_random_invariants(gran, order):
    """After every step: LRU is a permutation, each unit is held at most once, every selected
    unit is resident (or the step overflowed), hits + misses = distinct selected units."""
    rng = np.random.default_rng(7)
    D, P, K = 12, 3, 6
    m = HotBufferModel(D, P, gran, order)
    seq = 20
    m.prefill(seq - 1)
    for _ in range(40):
        m.begin_step(seq)
        sel = rng.integers(-1, seq, K).tolist()
        r = m.step(seq, sel)
        assert sorted(m.lru) == list(range(m.C))
        held = [u for u in m.slot_unit if u >= 0]
        assert len(held) == len(set(held))
        unit = P if gran == "page" else 1
        wanted = {p // unit for p in sel if p >= 0}
        if not r.overflow:
            assert r.hits + r.misses == len(wanted)
            assert wanted - {(seq - 1) // unit} <= set(held)
        seq += int(rng.integers(0, 2))


def test_bad_lru_order_names_the_choices():
    with pytest.raises(ValueError, match="lru_order must be one of"):
        HotBufferModel(8, 4, "token", "fifo")


def test_coordinator_model_keys_layers_and_requests_apart():
    cm = CoordinatorModel(num_layers=2, device_buffer_size=4, page_size=2,
                          load_granularity="token")
    cm.prefill([0, 1], [6, 6])
    cm.begin_step([0, 1], [7, 7])
    cm.swap_in([0], [7], [[5]], layer=0)
    assert cm.buffer(0, 0).slot_unit == [5, 1, 2, 3]
    assert cm.buffer(1, 0).slot_unit == [0, 1, 2, 3]
    assert cm.buffer(0, 1).slot_unit == [0, 1, 2, 3]
