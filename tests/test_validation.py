"""Bad input stops before any kernel runs with one message naming the field and what is allowed."""
import numpy as np
import pytest

from cli import run_harness
from harness.selection import Trace
from harness.validate import ConfigError, check_value


@pytest.mark.parametrize("field,value,needle", [
    ("page_size", 48, "power of two"),
    ("page_size", 0, "power of two"),
    ("top_k", 0, ">= 1"),
    ("batch_size", -3, ">= 1"),
    ("pattern", "zipf", "random, sliding_window, prefix, clustered, mixed"),
    ("backend", "flashinfer", "flashmla_sparse, hisparse, hisparse_connector, all"),
    ("kv_dtype", "fp16", "bf16, fp8_ds_mla"),
    ("step_overlap", 1.5, "[0, 1]"),
    ("hisparse.coordinator", "vllm", "triton, sglang"),
    ("hisparse.host_alloc", "hugetlb", "pinned, registered, thp"),
])
def test_check_value_names_field_and_allowed(field, value, needle):
    with pytest.raises(ConfigError) as e:
        check_value(field, value)
    assert f"{field}={value!r}" in str(e.value) and needle in str(e.value)


@pytest.mark.parametrize("field,value", [("page_size", 256), ("top_k", 1), ("pattern", "mixed"),
                                         ("backend", "all"), ("step_overlap", 0.0)])
def test_check_value_accepts_valid(field, value):
    check_value(field, value)


def _run(*args):
    return run_harness(*args, check=False)


def test_cli_rejects_bad_page_size_without_running(tmp_path):
    r = _run("page_size=48", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 2
    assert "page_size=48" in r.stderr and "power of two" in r.stderr
    assert not (tmp_path / "run" / "result.parquet").exists()


def test_sweep_rejected_before_any_job(tmp_path):
    r = _run("-m", "top_k=16,0", "page_size=16", f"hydra.sweep.dir={tmp_path}/sw")
    assert r.returncode == 2
    assert "top_k=0" in r.stderr and "sweep rejected before any job ran" in r.stderr
    assert not list((tmp_path).rglob("result.parquet"))


def test_trace_shape_mismatch(tmp_path):
    rng = np.random.default_rng(0)
    topk = np.stack([rng.permutation(100)[:8] for _ in range(3 * 2 * 2)]).reshape(3, 2, 2, 8).astype(np.int32)
    seq = np.full((3, 2), 100, np.int32)
    path = Trace(topk, seq).save(tmp_path / "t.npz")
    r = _run("selection=trace", f"selection.path={path}", "steps=4", "num_layers=2", "batch_size=2",
             "top_k=8", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 2
    assert "selection.path" in r.stderr and "[steps, num_layers, batch_size, top_k] = [4, 2, 2, 8]" in r.stderr


def test_hisparse_buffer_smaller_than_top_k(tmp_path):
    r = _run("backend=hisparse", "top_k=64", "hisparse.device_buffer_size=32", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 2 and "hisparse.device_buffer_size=32" in r.stderr and ">= top_k (64)" in r.stderr


def test_cuda_graph_needs_a_gpu(tmp_path):
    r = _run("timing.cuda_graph=true", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 2 and "timing.cuda_graph=True" in r.stderr and "device=cuda" in r.stderr


def test_unreadable_trace(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a trace")
    r = _run("selection=trace", f"selection.path={bad}", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 2 and "selection.path=" in r.stderr and "cannot read a trace" in r.stderr
