"""The analytic model: uniform-random page bound, per-stage roofline, projections, capacity."""
import itertools
import math
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis import capacity as cap
from harness.analysis import model as mdl
from harness.analysis import rows

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- page bound

def brute_force_pages(N, k, P):
    """Mean number of distinct pages over every k-subset of N positions (exact)."""
    total, n = Fraction(0), 0
    for subset in itertools.combinations(range(N), k):
        total += len({i // P for i in subset})
        n += 1
    return total / n


@pytest.mark.parametrize("N,k,P", [(8, 3, 2), (10, 3, 4), (12, 5, 3), (9, 9, 4), (7, 1, 3), (6, 4, 5)])
def test_expected_pages_matches_enumeration(N, k, P):
    assert mdl.expected_pages_uniform(N, k, P) == pytest.approx(float(brute_force_pages(N, k, P)), rel=1e-12)


def test_expected_pages_matches_exact_binomials():
    # P divides N: (N/P) * (1 - C(N-P,k)/C(N,k)) in exact rationals
    N, k, P = 1024, 50, 16
    exact = Fraction(N, P) * (1 - Fraction(math.comb(N - P, k), math.comb(N, k)))
    assert mdl.expected_pages_uniform(N, k, P) == pytest.approx(float(exact), rel=1e-12)
    # partial last page: 62 full pages of 16 and one of 8
    N = 1000
    exact = (62 * (1 - Fraction(math.comb(N - 16, k), math.comb(N, k)))
             + (1 - Fraction(math.comb(N - 8, k), math.comb(N, k))))
    assert mdl.expected_pages_uniform(N, k, P) == pytest.approx(float(exact), rel=1e-12)


def test_expected_pages_large_n_against_lgamma():
    N, k, P = 1 << 20, 2048, 64

    def lc(a, b):
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    want = (N / P) * (1 - math.exp(lc(N - P, k) - lc(N, k)))
    assert mdl.expected_pages_uniform(N, k, P) == pytest.approx(want, rel=1e-7)


# anchors.md B3: tokens loaded / k under a uniform-random top-k
ANCHORS = {
    (131072, 2048): (14.3, 25.3, 40.6, 55.5),
    (131072, 512): (15.5, 30.1, 56.7, 100.9),
    (32768, 2048): (10.3, 14.0, 15.7, 16.0),
}


@pytest.mark.parametrize("N,k", list(ANCHORS))
def test_amplification_matches_anchor_table(N, k):
    for P, want in zip((16, 32, 64, 128), ANCHORS[(N, k)]):
        assert mdl.expected_amplification_uniform(N, k, P) == pytest.approx(want, abs=0.051), (N, k, P)


def test_page_bound_edges():
    assert mdl.expected_pages_uniform(4096, 4096, 64) == pytest.approx(64)   # everything selected
    assert mdl.expected_pages_uniform(4096, 9999, 64) == pytest.approx(64)   # k clipped to N
    assert mdl.expected_pages_uniform(4096, 300, 1) == pytest.approx(300)    # token pages
    assert mdl.expected_pages_uniform(4096, 0, 64) == 0.0
    assert mdl.expected_amplification_uniform(4096, 300, 1) == pytest.approx(1.0)
    # 63 % of the context at N=128K, k=2048, P=64 (anchors.md)
    assert mdl.expected_pages_uniform(131072, 2048, 64) / 2048 == pytest.approx(0.63, abs=0.01)


# --------------------------------------------------------------------------- roofline

CEIL = mdl.Ceilings(name="test", hbm_gbps=1000.0, h2d_gbps=10.0, bf16_tflops=1.0, launch_us=5.0)


def hisparse_row(**kw):
    r = dict(backend="hisparse", model="dsv32", batch_size=2, context_len=1000, top_k=100, kv_row_bytes=656,
             device_buffer_size=200, steps=1, num_layers=1, tokens_selected=200,
             bytes_selected=200 * 656, bytes_h2d=100 * 656, status="ok")
    r.update(kw)
    return r


def test_stage_times_by_hand():
    work = mdl.stage_work(hisparse_row())
    t = {s: mdl.stage_time_us(w, CEIL) for s, w in work.items()}
    # select: index keys + logits 2*1000*(132+8) B = 0.28 µs at 1000 GB/s; FLOPs 2*1000*2*64*128
    # = 32.768e6 -> 32.768 µs at 1 TFLOP/s (compute-bound); 2 launches
    assert t["select"] == pytest.approx(2 * 5 + 32.768)
    # transform: 2*(8*100 + 12*200) B = 6400 B -> 0.0064 µs; 1 launch
    assert t["transform"] == pytest.approx(5 + 0.0064)
    # swap-in: 65600 B over 10 GB/s = 6.56 µs (HBM write 0.0656 µs is hidden)
    assert t["swap_in"] == pytest.approx(5 + 6.56)
    # attention: FLOPs 200 tokens * 2*128*(576+512) = 55.7056e6 -> 55.7056 µs
    # (bytes: 131200 + 2*128*2*1088 = 688256 B -> 0.688 µs)
    assert t["attention"] == pytest.approx(5 + 55.7056)
    assert work["attention"].hbm_bytes == 131200 + 557056


def test_connector_resolve_stage_by_hand():
    row = hisparse_row(backend="hisparse_connector", hot_requests=1, stage_resolve_us=23.12,
                       stage_attention_us=121.4112, latency_us_median=144.5312,
                       ceiling_hbm_gbps=1000.0, ceiling_h2d_gbps=10.0, ceiling_bf16_tflops=1.0)
    work = mdl.stage_work(row)
    assert set(work) == {"select", "resolve", "attention"}
    # lookups 2 requests x 100 x 12 B + the one hot request's 200 slots x 12 B + the copied rows
    # written to HBM: 2400 + 2400 + 65600 B; the 65600 B over the 10 GB/s link dominate (6.56 µs)
    assert work["resolve"].hbm_bytes == 2400 + 2400 + 65600
    assert mdl.stage_time_us(work["resolve"], CEIL) == pytest.approx(5 + 6.56)
    p = mdl.predict(pd.DataFrame([row])).iloc[0]      # select not measured: resolve + attention
    assert p["pred_total_us"] == pytest.approx(11.56 + 60.7056)
    assert p["ratio_resolve"] == pytest.approx(2.0) and p["ratio_attention"] == pytest.approx(2.0)
    assert pd.isna(p["pred_swap_in_us"]) and pd.isna(p["pred_transform_us"])
    # fully resident: no copy, no hot region: the lookups alone (2400 B at 1000 GB/s)
    res = mdl.stage_work(hisparse_row(backend="hisparse_connector", hot_requests=0, bytes_h2d=0))
    assert mdl.stage_time_us(res["resolve"], CEIL) == pytest.approx(5 + 0.0024)


def test_memory_bound_attention_and_flashmla_stages():
    # big rows, few FLOPs: attention becomes bandwidth-bound
    row = dict(backend="flashmla_sparse", model="dsv32", batch_size=1, context_len=100, top_k=10, kv_row_bytes=10**6,
               steps=2, num_layers=5, tokens_selected=100, bytes_selected=100 * 10**6)
    work = mdl.stage_work(row)
    assert set(work) == {"select", "transform", "attention"}
    # per layer step: 10 tokens, 1e7 B + q/o 2*128*1088*... over 1000 GB/s
    att = mdl.stage_time_us(work["attention"], CEIL)
    assert att == pytest.approx(5 + (10 * 10**6 + 128 * 2 * 1088) / 1e6)
    assert mdl.stage_time_us(work["transform"], CEIL) == pytest.approx(5 + 1 * 10 * 12 / 1e6)


def test_predict_ratio_and_measured_stage_subset():
    row = hisparse_row(latency_us_median=240.08, stage_select_us=85.536, stage_transform_us=10.0128,
                       stage_swap_in_us=23.12, stage_attention_us=121.4112,
                       ceiling_hbm_gbps=1000.0, ceiling_h2d_gbps=10.0, ceiling_bf16_tflops=1.0)
    p = mdl.predict(pd.DataFrame([row])).iloc[0]
    assert p["pred_total_us"] == pytest.approx(42.768 + 5.0064 + 11.56 + 60.7056)
    assert p["ratio_total"] == pytest.approx(2.0)
    for s in mdl.BACKEND_STAGES["hisparse"]:
        assert p[f"ratio_{s}"] == pytest.approx(2.0)
    assert pd.isna(p["pred_resolve_us"])          # the connector's stage, not hisparse's
    # a row that measured only attention is compared on attention only
    row2 = hisparse_row(latency_us_median=70.0, stage_attention_us=60.7056,
                        ceiling_hbm_gbps=1000.0, ceiling_h2d_gbps=10.0, ceiling_bf16_tflops=1.0)
    p2 = mdl.predict(pd.DataFrame([row2])).iloc[0]
    assert p2["pred_total_us"] == pytest.approx(60.7056)
    assert pd.isna(p2["pred_select_us"])
    # no measured ceilings (CPU run): no prediction
    p3 = mdl.predict(pd.DataFrame([hisparse_row(latency_us_median=1.0)])).iloc[0]
    assert pd.isna(p3["pred_total_us"])


def test_projection_scales_measured_stages():
    row = hisparse_row(latency_us_median=250.0, stage_select_us=85.536, stage_transform_us=10.0128,
                       stage_swap_in_us=23.12, stage_attention_us=121.4112,
                       ceiling_hbm_gbps=1000.0, ceiling_h2d_gbps=10.0, ceiling_bf16_tflops=1.0)
    faster_link = mdl.Ceilings(name="x", hbm_gbps=1000.0, h2d_gbps=20.0, bf16_tflops=1.0)
    pj = mdl.project(pd.DataFrame([row]), faster_link).iloc[0]
    # swap-in: 5 + 3.28 µs on the target vs 5 + 6.56 measured-hardware roofline; measured 23.12
    assert pj["proj_swap_in_us"] == pytest.approx(23.12 * 8.28 / 11.56)
    assert pj["proj_select_us"] == pytest.approx(85.536)
    # remainder (250 - sum of measured stages 240.08 = 9.92 µs) is carried over
    assert pj["proj_latency_us"] == pytest.approx(85.536 + 10.0128 + 23.12 * 8.28 / 11.56 + 121.4112 + 9.92)
    assert pj["projection_basis"] == "scaled-measured"
    # the h200 placeholder projects a run onto itself
    same = mdl.project(pd.DataFrame([row]), mdl.load_hardware(REPO / "conf/hardware/h200.yaml")).iloc[0]
    assert same["proj_latency_us"] == pytest.approx(250.0)
    # without measured ceilings: the target's pure roofline; failed rows: not projected
    cpu = hisparse_row(latency_us_median=999.0)
    pj2 = mdl.project(pd.DataFrame([cpu]), faster_link).iloc[0]
    assert pj2["projection_basis"] == "roofline-only"
    assert pj2["proj_latency_us"] == pytest.approx(42.768 + 5.0064 + (5 + 3.28) + 60.7056)
    # ... over the stages the row measured, when it measured any
    cpu_att = hisparse_row(latency_us_median=999.0, stage_attention_us=900.0)
    pj3 = mdl.project(pd.DataFrame([cpu_att]), faster_link).iloc[0]
    assert pj3["proj_latency_us"] == pytest.approx(60.7056)
    bad = mdl.project(pd.DataFrame([hisparse_row(status="oom")]), faster_link).iloc[0]
    assert pd.isna(bad["proj_latency_us"])


def test_hardware_files():
    hw = {p.stem: mdl.load_hardware(p) for p in (REPO / "conf/hardware").glob("*.yaml")}
    assert {"h200", "b200", "gh200"} <= set(hw)
    assert hw["h200"].is_placeholder and hw["h200"].hbm_capacity_gb == 141
    assert (hw["gh200"].h2d_gbps, hw["gh200"].hbm_gbps, hw["gh200"].bf16_tflops) == (375, 4000, 990)
    assert (hw["b200"].hbm_gbps, hw["b200"].h2d_gbps, hw["b200"].bf16_tflops) == (8000, 55, 2250)


def test_hardware_file_rejects_unknown_keys(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("hbm_gbps: 1\npcie: 3\n")
    with pytest.raises(ValueError, match="pcie"):
        mdl.load_hardware(f)


# --------------------------------------------------------------------------- capacity

DSV32 = mdl.model_preset("dsv32")


def test_kv_bytes_and_max_batch_by_hand():
    fm, fm_host = cap.kv_bytes_per_request(DSV32, "flashmla_sparse", 131072, 656)
    assert fm == 131072 * 61 * (656 + 132) == 6_300_368_896 and fm_host == 0
    hs, hs_host = cap.kv_bytes_per_request(DSV32, "hisparse", 131072, 656, device_buffer_size=4096, page_size=64)
    assert hs == (4096 + 64) * 61 * 656 + 131072 * 61 * 132 == 1_221_858_304
    assert hs_host == 131072 * 61 * 656
    assert cap.max_batch(51e9, fm) == 8 and cap.max_batch(51e9, hs) == 41
    # a short request keeps only its page-aligned length (SGLang alloc_device_buffer)
    short, _ = cap.kv_bytes_per_request(DSV32, "hisparse", 1000, 656, device_buffer_size=4096, page_size=64)
    assert short == (1024 + 64) * 61 * 656 + 1000 * 61 * 132


def test_step_time_scaling_and_throughput():
    a, b, how = cap.fit_step_time([4], [100.0])
    assert (a, b) == (0.0, 25.0) and how.startswith("proportional")
    assert cap.throughput_tokens_per_s(DSV32, 32, a + b * 32) == pytest.approx(4 / (61 * 100e-6))
    a, b, how = cap.fit_step_time([1, 4], [40.0, 100.0])
    assert (a, b) == pytest.approx((20.0, 20.0)) and how.startswith("affine")
    assert cap.throughput_tokens_per_s(DSV32, 8, a + b * 8) == pytest.approx(8 / (61 * 180e-6))
    assert cap.throughput_tokens_per_s(DSV32, 0, 10.0) == 0.0


def test_swap_in_includes_coordinator_when_transform_not_timed():
    # the harness times hisparse's bookkeeping + copy together as swap_in
    row = hisparse_row(latency_us_median=100.0, stage_swap_in_us=30.0, stage_attention_us=70.0,
                       ceiling_hbm_gbps=1000.0, ceiling_h2d_gbps=10.0, ceiling_bf16_tflops=1.0)
    p = mdl.predict(pd.DataFrame([row])).iloc[0]
    assert pd.isna(p["pred_transform_us"]) and pd.isna(p["pred_select_us"])
    assert p["pred_swap_in_us"] == pytest.approx((5 + 0.0064) + (5 + 6.56))
    assert p["pred_total_us"] == pytest.approx((5 + 0.0064) + (5 + 6.56) + (5 + 55.7056))


def test_counts_are_per_measured_layer_step_and_model_preset():
    # 5 steps, 2 of them warm-up, 2 layers: counts cover 6 layer steps
    row = hisparse_row(steps=5, warmup_steps=2, num_layers=2, tokens_selected=6 * 200,
                       bytes_selected=6 * 200 * 656, bytes_h2d=6 * 100 * 656)
    assert mdl.measured_layer_steps(row) == 6
    w = mdl.stage_work(row)
    assert w["attention"].flops == pytest.approx(200 * 2 * 128 * 1088)
    assert w["swap_in"].h2d_bytes == pytest.approx(100 * 656)
    # the tiny preset (conf/model/tiny.yaml): 16 heads, d_qk 256+64, d_v 256, indexer 16 x 64
    tiny = mdl.model_preset("tiny")
    assert (tiny.num_heads, tiny.d_qk, tiny.d_v, mdl.index_key_bytes(tiny), tiny.layers) == (16, 320, 256, 68, 61)
    assert (DSV32.num_heads, DSV32.d_qk, DSV32.d_v, mdl.index_key_bytes(DSV32), DSV32.layers) == (128, 576, 512, 132, 61)
    wt = mdl.stage_work(dict(row, model="tiny"))
    assert wt["attention"].flops == pytest.approx(200 * 2 * 16 * (320 + 256))
    assert wt["select"].hbm_bytes == pytest.approx(2 * 1000 * (68 + 8))
    assert wt["select"].flops == pytest.approx(2 * 1000 * 2 * 16 * 64)
    # a model given explicitly wins over the row's column
    assert mdl.stage_work(row, tiny)["attention"].flops == wt["attention"].flops
    # a row whose model has no preset (or names none) is refused, naming the presets
    for bad in ("no-such-model", None, float("nan")):
        with pytest.raises(ValueError, match=r"model=.*allowed \[.*'dsv32'.*'tiny'"):
            mdl.stage_work(dict(row, model=bad))


def test_measured_layer_steps_rows_and_frames_agree():
    """One function: a row gives a float, a frame a Series on its index, the same per row;
    warmup_steps missing counts as 0; n_samples where the steps give no positive count."""
    recs = [dict(steps=5, warmup_steps=2, num_layers=2, n_samples=99),   # 3 * 2
            dict(steps=5, warmup_steps=None, num_layers=3, n_samples=99),  # warm-up unknown: 5 * 3
            dict(steps=None, warmup_steps=1, num_layers=2, n_samples=7),   # steps unknown: n_samples
            dict(steps=2, warmup_steps=2, num_layers=4, n_samples=5),      # nothing measured: n_samples
            dict(steps=2, warmup_steps=2, num_layers=4, n_samples=None),   # neither: NaN
            dict(steps=3, warmup_steps=1, num_layers=None, n_samples=0)]   # neither: NaN
    want = [6.0, 15.0, 7.0, 5.0, float("nan"), float("nan")]
    df = pd.DataFrame(recs, index=[10, 11, 12, 13, 14, 15]).astype("Int64")
    per = rows.measured_layer_steps(df)
    assert list(per.index) == [10, 11, 12, 13, 14, 15] and per.dtype == "float64"
    assert per.tolist() == pytest.approx(want, nan_ok=True)
    for i, (r, w) in enumerate(zip(df.to_dict("records"), want)):
        got = rows.measured_layer_steps(r)
        assert isinstance(got, float) and got == pytest.approx(w, nan_ok=True), i
    # a frame without the warmup_steps and n_samples columns
    bare = df[["steps", "num_layers"]].iloc[:2]
    assert rows.measured_layer_steps(bare).tolist() == [10.0, 15.0]
