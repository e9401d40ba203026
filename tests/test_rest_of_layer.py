"""The rest of a MoE decode layer (harness/rest_of_layer.py) on the CPU at the tiny model's size:
weight bytes, FLOPs and bytes moved against counts from the shapes, outputs against the float32
per-token reference, routing statistics, validation messages and the CLI's quick run."""
import numpy as np
import pytest
import torch

from harness.config import ModelConfig, load_model_preset
from harness.rest_of_layer import (RestOfLayer, RestOfLayerPlan, check_scaled_mm, main,
                                   relative_errors)
from harness.rest_of_layer_ref import rest_of_layer_ref

TINY = ModelConfig(**load_model_preset("tiny"))
DSV32 = ModelConfig(**load_model_preset("dsv32"))
LAYOUTS = [(1, 1), (1, 2), (2, 2)]          # (tp_size, ep_size)



def _fp8_gemm_runs_on_the_cpu() -> bool:
    try:
        check_scaled_mm(torch.device("cpu"))
    except ValueError:
        return False
    return True


#: the fp8 GEMM on the CPU: torch's ``_scaled_mm`` with row-wise scales, which older CPU builds
#: of torch lack (torch 2.11's); the layer then names ``weight_dtype`` and what is allowed
#: (``test_fp8_gemm_unavailable_names_the_field``, with a stand-in for the missing kernel)
FP8_CPU = pytest.mark.skipif(not _fp8_gemm_runs_on_the_cpu(),
                             reason="this torch's _scaled_mm has no row-wise scales on the CPU")
FP8 = pytest.param("fp8", marks=FP8_CPU)


def mat(k, n, fp8, quantised=True):
    """Bytes of a [k, n] weight: e4m3 + one fp32 scale per output column, or bf16."""
    return k * n + 4 * n if (fp8 and quantised) else 2 * k * n


def expert_bytes(m, fp8):
    """One routed expert: w1, w3 [hidden, I] and w2 [I, hidden]."""
    return 2 * mat(m.hidden_size, m.moe_intermediate_size, fp8) + mat(m.moe_intermediate_size, m.hidden_size, fp8)


def dense_weight_bytes(m, tp, fp8):
    """Everything but the routed experts, matrix by matrix as DeepSeek's reference names them."""
    h = m.num_heads // tp
    shared = m.n_shared_experts * m.moe_intermediate_size // tp
    return (mat(m.hidden_size, m.q_lora_rank, fp8) + mat(m.hidden_size, m.d_nope + m.d_rope, fp8)   # wq_a, wkv_a
            + mat(m.q_lora_rank, h * (m.qk_nope_head_dim + m.d_rope), fp8)                     # wq_b
            + 2 * h * m.qk_nope_head_dim * m.d_nope + 2 * h * m.d_nope * m.v_head_dim           # W_UK, W_UV bf16
            + mat(h * m.v_head_dim, m.hidden_size, fp8)                                          # wo
            + mat(m.q_lora_rank, m.index_heads * m.index_dim, fp8) + mat(m.hidden_size, m.index_dim, fp8)
            + mat(m.hidden_size, m.index_heads, fp8, quantised=False)                            # weights_proj
            + mat(m.hidden_size, m.n_routed_experts, fp8, quantised=False)                       # router gate
            + 2 * mat(m.hidden_size, shared, fp8) + mat(shared, m.hidden_size, fp8))             # shared w1, w3, w2


def expected_weight_bytes(m, tp, ep, fp8):
    return dense_weight_bytes(m, tp, fp8) + m.n_routed_experts // ep * expert_bytes(m, fp8)


def dense_flops_per_token(m, tp):
    h = m.num_heads // tp
    shared = m.n_shared_experts * m.moe_intermediate_size // tp
    mk = (m.hidden_size * (m.q_lora_rank + m.d_nope + m.d_rope) + m.q_lora_rank * h * (m.qk_nope_head_dim + m.d_rope)
          + h * m.qk_nope_head_dim * m.d_nope + m.q_lora_rank * m.index_heads * m.index_dim
          + m.hidden_size * (m.index_dim + m.index_heads) + h * m.d_nope * m.v_head_dim
          + h * m.v_head_dim * m.hidden_size + m.hidden_size * m.n_routed_experts + 3 * m.hidden_size * shared)
    return 2 * mk


@pytest.mark.parametrize("dtype", [FP8, "bf16"])
@pytest.mark.parametrize("tp,ep", LAYOUTS)
def test_weight_bytes_equal_count_from_shapes(tp, ep, dtype):
    layer = RestOfLayer(TINY, tp_size=tp, ep_size=ep, weight_dtype=dtype, device="cpu", seed=1)
    want = expected_weight_bytes(TINY, tp, ep, dtype == "fp8")
    assert layer.weight_bytes() == want
    assert layer.allocated_bytes() == want
    assert len(layer.experts) == TINY.n_routed_experts // ep and layer.heads == TINY.num_heads // tp


def test_dsv32_weight_bytes_without_allocating():
    for tp in (1, 8):
        for dtype in ("fp8", "bf16"):
            plan = RestOfLayerPlan(DSV32, tp_size=tp, ep_size=8, weight_dtype=dtype)
            assert plan.weight_bytes() == expected_weight_bytes(DSV32, tp, 8, dtype == "fp8")
    # DP attention + EP8 in bf16: 3.31 GB per GPU, fp8 about half (W_UK/W_UV, gate stay bf16)
    bf16 = RestOfLayerPlan(DSV32, tp_size=1, ep_size=8, weight_dtype="bf16").weight_bytes()
    fp8 = RestOfLayerPlan(DSV32, tp_size=1, ep_size=8, weight_dtype="fp8").weight_bytes()
    assert 3.30e9 < bf16 < 3.32e9 and 0.50 < fp8 / bf16 < 0.51


@pytest.mark.parametrize("tp,ep", LAYOUTS)
def test_flops_and_bytes_moved_count_active_experts_only(tp, ep):
    plan = RestOfLayerPlan(TINY, tp_size=tp, ep_size=ep, weight_dtype="fp8", seed=3)
    m = TINY
    for batch in (1, 3, 64):
        counts = plan.expert_token_counts(batch)
        expert_mk = 3 * m.hidden_size * m.moe_intermediate_size
        assert plan.flops(batch) == batch * dense_flops_per_token(m, tp) + 2 * expert_mk * int(counts.sum())
        h = m.num_heads // tp
        shared = m.n_shared_experts * m.moe_intermediate_size // tp
        act_per_token = 2 * (m.hidden_size + (m.q_lora_rank + m.d_nope + m.d_rope)
                             + m.q_lora_rank + h * (m.qk_nope_head_dim + m.d_rope)
                             + h * (m.qk_nope_head_dim + m.d_nope)
                             + m.q_lora_rank + m.index_heads * m.index_dim
                             + 2 * m.hidden_size + m.index_dim + m.index_heads
                             + h * (m.d_nope + m.v_head_dim) + h * m.v_head_dim + m.hidden_size
                             + m.hidden_size + m.n_routed_experts
                             + m.hidden_size + 2 * shared + shared + m.hidden_size)
        act_expert = 2 * (m.hidden_size + 2 * m.moe_intermediate_size + m.moe_intermediate_size + m.hidden_size)
        active = int((counts > 0).sum())
        assert plan.bytes_moved(batch) == (dense_weight_bytes(m, tp, True) + active * expert_bytes(m, True)
                                           + batch * act_per_token
                                           + act_expert * int(counts.sum()))
    # batch 1 on one GPU: exactly top_k of the experts are read
    solo = RestOfLayerPlan(TINY, tp_size=1, ep_size=1, weight_dtype="bf16")
    assert int((solo.expert_token_counts(1) > 0).sum()) == TINY.num_experts_per_tok


def test_roofline_is_max_of_memory_and_compute():
    plan = RestOfLayerPlan(TINY, tp_size=1, ep_size=2, weight_dtype="fp8")
    batch = 16
    gemms = plan.gemms(batch)
    fp8_flops = sum(g.flops for g in gemms if g.shape.fp8)
    bf16_flops = plan.flops(batch) - fp8_flops
    assert fp8_flops > 0 and bf16_flops > 0
    mem_us = lambda gbps: plan.bytes_moved(batch) / (gbps * 1e3)                 # noqa: E731
    compute_us = lambda tf, tf8: (fp8_flops / tf8 + bf16_flops / tf) / 1e6      # noqa: E731
    tflops = 1e-3                                                                # 1 GFLOP/s
    balanced = plan.bytes_moved(batch) / 1e3 / compute_us(tflops, 2 * tflops)   # GB/s where both are equal
    for gbps in (balanced / 2, balanced * 2):                                   # memory-bound, compute-bound
        want = max(mem_us(gbps), compute_us(tflops, 2 * tflops))
        assert plan.roofline_us(batch, gbps, tflops) == pytest.approx(want, rel=1e-9)
    assert plan.roofline_us(batch, balanced / 2, tflops) == pytest.approx(mem_us(balanced / 2))
    assert plan.roofline_us(batch, 1e12, tflops, fp8_tflops=tflops) == pytest.approx(
        compute_us(tflops, tflops))


@pytest.mark.parametrize("dtype", [FP8, "bf16"])
@pytest.mark.parametrize("tp,ep", LAYOUTS)
def test_run_matches_float32_reference(tp, ep, dtype):
    layer = RestOfLayer(TINY, tp_size=tp, ep_size=ep, weight_dtype=dtype, device="cpu", seed=7)
    batch, tokens = 5, [0, 3]
    x, lat = layer.inputs(batch)
    assert x.dtype == torch.bfloat16 and x.std() > 0.5 and lat.shape == (batch, layer.heads, TINY.d_nope)
    out = layer.run(x, lat)
    routing = layer.routing(batch)
    recv = [r for r in range(layer.dp_size * batch) if r % batch in tokens]
    ref = rest_of_layer_ref(layer, x, lat, routing, tokens)
    errs = relative_errors(out, ref, tokens, recv)
    assert max(errs.values()) < 1e-2, errs
    assert out.q_attn.shape == (batch, layer.heads, TINY.d_nope + TINY.d_rope)
    assert out.routed_out.shape == (layer.dp_size * batch, TINY.hidden_size)
    local = (routing.experts < routing.n_local).any(dim=1)
    assert (out.routed_out[~local] == 0).all() and (out.routed_out[local].abs().sum(dim=1) > 0).all()
    for name in ("q_attn", "attn_out", "shared_out", "router_logits"):
        assert getattr(out, name).float().std() > 0.1, name   # real values, not zeros
    assert torch.equal(layer.step(batch).routed_out, out.routed_out)   # step = run on its inputs


def test_fp8_gemm_unavailable_names_the_field(monkeypatch):
    """Where torch's ``_scaled_mm`` has no row-wise scales on the device (older CPU builds), the
    fp8 layer stops at construction with the field and what is allowed there, not inside a step."""
    def no_rowwise(*args, **kwargs):
        raise RuntimeError("(scale_a.numel() == 1 && scale_b.numel() == 1) INTERNAL ASSERT FAILED\nmore")
    monkeypatch.setattr(torch, "_scaled_mm", no_rowwise)
    with pytest.raises(ValueError, match=r"weight_dtype='fp8'.*does not run on cpu.*INTERNAL ASSERT "
                                         r"FAILED\); allowed there: 'bf16'"):
        RestOfLayer(TINY, tp_size=1, ep_size=2, weight_dtype="fp8", device="cpu")
    assert RestOfLayer(TINY, tp_size=1, ep_size=2, weight_dtype="bf16", device="cpu").gemm == "matmul_bf16"


@FP8_CPU
def test_fp8_weights_are_e4m3_and_scaled_mm_runs():
    layer = RestOfLayer(TINY, tp_size=1, ep_size=2, weight_dtype="fp8", device="cpu")
    assert layer.gemm == "scaled_mm_fp8_rowwise"
    assert layer.q_b.weight.dtype == torch.float8_e4m3fn and layer.experts[0][0].weight.dtype == torch.float8_e4m3fn
    assert layer.gate.weight.dtype == torch.bfloat16 and layer.w_uk.weight.dtype == torch.bfloat16
    assert RestOfLayer(TINY, tp_size=1, ep_size=2, weight_dtype="bf16", device="cpu").gemm == "matmul_bf16"


def test_routing_per_gpu_expert_counts():
    m = TINY
    k = m.num_experts_per_tok
    solo = RestOfLayerPlan(m, tp_size=1, ep_size=1, weight_dtype="bf16", seed=5)
    r = solo.routing(33)
    assert r.experts.shape == (33, k)
    assert all(len(set(row)) == k for row in r.experts.tolist())
    assert int(solo.expert_token_counts(33).sum()) == 33 * k
    assert torch.allclose(r.weights.sum(dim=1), torch.ones(33))
    assert solo.routing(33) is r and torch.equal(
        RestOfLayerPlan(m, tp_size=1, ep_size=1, weight_dtype="bf16", seed=5).routing(33).experts, r.experts)
    batch = 4096
    for tp, ep in ((1, 2), (2, 2), (1, 8)):
        plan = RestOfLayerPlan(m, tp_size=tp, ep_size=ep, weight_dtype="bf16", seed=11)
        counts = plan.expert_token_counts(batch)
        assert counts.shape == (m.n_routed_experts // ep,)
        assert plan.routing(batch).experts.shape[0] == batch * ep // tp     # dp_size x batch received
        mean = batch * k / tp                                                # expected pairs on this GPU
        assert abs(counts.sum() - mean) < 0.03 * mean
        per_expert = mean / len(counts)
        assert np.all(np.abs(counts - per_expert) < 0.15 * per_expert), counts


@pytest.mark.parametrize("kwargs,field,allowed", [
    (dict(tp_size=3, ep_size=3, weight_dtype="bf16"), "tp_size", "(1, 2, 4, 8)"),
    (dict(tp_size=16, ep_size=16, weight_dtype="bf16"), "tp_size", "(1, 2, 4, 8)"),
    (dict(tp_size=2, ep_size=1, weight_dtype="bf16"), "ep_size", "multiple of tp_size"),
    (dict(tp_size=1, ep_size=3, weight_dtype="bf16"), "ep_size", "n_routed_experts (16)"),
    (dict(tp_size=1, ep_size=32, weight_dtype="bf16"), "ep_size", "n_routed_experts (16)"),
    (dict(tp_size=1, ep_size=2, weight_dtype="fp16"), "weight_dtype", "('fp8', 'bf16')"),
])
def test_bad_layout_names_field_and_allowed_values(kwargs, field, allowed):
    with pytest.raises(ValueError) as e:
        RestOfLayer(TINY, device="cpu", **kwargs)
    assert str(e.value).startswith(f"{field}=") and allowed in str(e.value)


def test_bad_batch_and_inputs():
    layer = RestOfLayer(TINY, tp_size=1, ep_size=2, weight_dtype="bf16", device="cpu")
    for batch in (0, -2, 1.5):
        with pytest.raises(ValueError, match=r"^batch="):
            layer.step(batch)
    x, lat = layer.inputs(2)
    with pytest.raises(ValueError, match="attn_latent"):
        layer.run(x, lat[:, :1])


@FP8_CPU
def test_cli_quick(capsys):
    rows = main(["--quick", "--tp", "1,2", "--ep", "2", "--dtype", "fp8,bf16", "--batch", "3"])
    assert [(r["tp_size"], r["weight_dtype"]) for r in rows] == [(1, "fp8"), (1, "bf16"), (2, "fp8"), (2, "bf16")]
    for r in rows:
        assert r["status"] == "ok" and r["max_rel_err"] < 1e-2 and r["us"] > 0
        assert r["weight_bytes"] == expected_weight_bytes(TINY, r["tp_size"], 2, r["weight_dtype"] == "fp8")
    assert "roofline us" in capsys.readouterr().out


@pytest.mark.parametrize("flags,field", [(["--tp", "3"], "tp_size"), (["--ep", "3"], "ep_size"),
                                         (["--dtype", "fp16"], "weight_dtype"), (["--batch", "0"], "batch")])
def test_cli_bad_input_exits_2_before_running(flags, field, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--quick"] + flags)
    assert e.value.code == 2 and capsys.readouterr().err.startswith(f"error: {field}=")


@FP8_CPU
def test_step_with_no_token_on_this_gpus_experts():
    seed = next(s for s in range(1000)
                if RestOfLayerPlan(TINY, tp_size=2, ep_size=2, weight_dtype="fp8", seed=s)
                .expert_token_counts(1).sum() == 0)
    layer = RestOfLayer(TINY, tp_size=2, ep_size=2, weight_dtype="fp8", device="cpu", seed=seed)
    out = layer.step(1)
    assert (out.routed_out == 0).all() and out.shared_out.float().abs().sum() > 0
    assert [g.shape.name for g in layer.gemms(1) if g.shape.name.startswith("expert_")] == []
    ref = rest_of_layer_ref(layer, *layer.inputs(1), layer.routing(1), [0])
    assert max(relative_errors(out, {k: v for k, v in ref.items() if k != "routed_out"}, [0], []).values()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
def test_cuda_step_and_graph_replay_match_reference(dtype):
    layer = RestOfLayer(TINY, tp_size=2, ep_size=4, weight_dtype=dtype, device="cuda", seed=2)
    batch, tokens = 6, [0, 5]
    recv = [r for r in range(layer.dp_size * batch) if r % batch in tokens]
    ref = rest_of_layer_ref(layer, *layer.inputs(batch), layer.routing(batch), tokens)
    replay = layer.prepare(batch)
    for out in (layer.step(batch), replay(), replay()):
        errs = relative_errors(out, ref, tokens, recv)
        assert max(errs.values()) < 2e-2, errs
    assert layer.allocated_bytes() == layer.weight_bytes()
