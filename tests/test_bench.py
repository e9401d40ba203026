"""``python -m harness.bench``: the registry and CLI, and every bench's ``--quick`` run (CPU,
Triton interpreter), asserting on the Parquet rows it writes (``harness.results`` schema)."""
import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from backends.copy_engines import UvaKernelEngine
from backends.kernels import vllm_peer
from backends.kernels.flashmla_peer import PeerUnavailable
from harness import report, results
from harness.bench import attention as attention_bench
from harness.bench import indexer as indexer_bench
from harness.bench import swap_in as swap_in_bench
from harness.bench.__main__ import main
from harness.bench.measure import BenchRun, Check
from harness.bench.registry import BENCHES, benches, register
from harness.bench.table import format_table

sys.path.insert(0, str(Path(__file__).parent))
from test_report import synthetic_grid, write_sweep  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
REPEATS = 2
#: untimed calls before the timed ones: none, the row's checked first call already ran the kernel
#: (in the interpreter each call costs as much as a timed one; the default --quick warm-up is
#: covered by the cumsum bench's runs)
WARMUP = 0
#: columns every bench row carries
SHARED = ("schema_version", "bench", "kernel", "device", "status", "git_sha", "torch_version",
          "triton_version", "gpu_name", "hostname", "host_virtualized", "repro_command",
          "timestamp", "cold_l2", "cuda_graph")


def run_bench(tmp_path, name, *options):
    """Runs ``run NAME --quick`` into tmp_path/NAME; returns (exit code, its rows)."""
    out = tmp_path / name
    rc = main(["run", name, "--quick", "--repeats", str(REPEATS), "--warmup", str(WARMUP),
               "--out", str(out), *options])
    return rc, results.load(out)


def assert_measured(df, name):
    """Every ok row was timed REPEATS times (p10 <= median <= p90, all > 0) and passed its
    check; every row carries the shared columns."""
    assert set(df["bench"]) == {name}
    assert df[list(SHARED)].notna().all().all(), df[list(SHARED)].isna().sum()
    assert (df["repro_command"].str.startswith(f"python -m harness.bench run {name} --quick")).all()
    ok = df[df["status"] == "ok"]
    assert len(ok), df["status"].value_counts()
    assert (ok["n_samples"] == REPEATS).all()
    assert (ok["latency_us_p10"] > 0).all()
    assert ((ok["latency_us_p10"] <= ok["latency_us_median"])
            & (ok["latency_us_median"] <= ok["latency_us_p90"])).all()
    checked = ok[ok["tolerance"].notna()]
    assert (checked["max_rel_err"] <= checked["tolerance"]).all()
    return ok


# ------------------------------------------------------------------------ registry and CLI

def test_list_shows_every_bench(capsys):
    assert list(benches()) == ["attention", "indexer", "peers", "swap_in", "swap_in_peer"]
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == list(benches())
    assert all(len(ln.split(None, 1)[1]) > 20 for ln in lines)      # a description each


def test_register_refuses_a_second_bench_of_the_same_name():
    with pytest.raises(ValueError, match="registered twice"):
        register("attention", "another attention bench")(lambda run: None)
    with pytest.raises(ValueError, match="one non-empty line"):
        register("two_lines", "first\nsecond")


@pytest.fixture
def cumsum_bench(monkeypatch):
    """A small real bench: ``torch.cumsum`` of fresh random data against numpy's; ``--wrong``
    perturbs the output (its rows must then be incorrect), ``--none`` measures nothing."""
    def options(p):
        p.add_argument("--wrong", action="store_true")
        p.add_argument("--none", action="store_true")

    def bench(run: BenchRun):
        if run.args.none:
            return
        x = torch.from_numpy(np.random.default_rng(0).random(1000))
        ref = np.cumsum(x.numpy())
        shift = 1.0 if run.args.wrong else 0.0
        run.measure(lambda: torch.cumsum(x, 0) + shift,
                    check=lambda out: Check(float(np.abs(out.numpy() - ref).max() / ref.max()), 1e-9),
                    kernel="cumsum", batch_size=1, context_len=1000)
    monkeypatch.delitem(BENCHES, "cumsum", raising=False)
    register("cumsum", "torch.cumsum against numpy", options=options)(bench)
    yield
    BENCHES.pop("cumsum", None)


def test_run_writes_rows_to_out_and_the_old_spelling_is_run(tmp_path, monkeypatch, cumsum_bench,
                                                           capsys):
    monkeypatch.setenv("OUT", str(tmp_path / "from_env"))
    assert main(["cumsum", "--quick", "--repeats", "3"]) == 0              # = run cumsum
    df = results.load(tmp_path / "from_env")
    assert len(df) == 1 and df["status"][0] == "ok" and df["n_samples"][0] == 3
    assert df["max_rel_err"][0] <= 1e-12 and df["latency_us_median"][0] > 0
    assert df["repro_command"][0] == "python -m harness.bench run cumsum --quick --repeats 3"
    out = capsys.readouterr().out
    assert "cumsum" in out and "median_us" in out.splitlines()[-3]        # the table, last
    rc = main(["run", "cumsum", "--quick", "--out", str(tmp_path / "wrong"), "--wrong"])
    assert rc == 1
    bad = results.load(tmp_path / "wrong")
    assert bad["status"][0] == "incorrect" and "tolerance" in bad["error"][0]
    assert bad["latency_us_median"][0] > 0                       # timed anyway, flagged
    assert main(["run", "cumsum", "--quick", "--out", str(tmp_path / "none"), "--none"]) == 1
    assert not (tmp_path / "none").exists()


def test_a_bench_killed_with_sigterm_keeps_the_rows_it_measured(tmp_path, monkeypatch, capsys):
    """``timeout`` (SIGTERM) in the middle of a bench: the rows measured so far are written, the
    run fails (exit 1), and SIGTERM's handler is restored afterwards."""
    import os
    import signal

    def bench(run: BenchRun):
        x = torch.from_numpy(np.random.default_rng(1).random(500))
        ref = np.cumsum(x.numpy())
        for n in range(3):
            if n == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            run.measure(lambda: torch.cumsum(x, 0),
                        check=lambda out: Check(float(np.abs(out.numpy() - ref).max()), 1e-9),
                        kernel="cumsum", variant=f"v{n}", batch_size=1, context_len=500)
    monkeypatch.delitem(BENCHES, "killed", raising=False)
    register("killed", "measures two rows, then is sent SIGTERM")(bench)
    before = signal.getsignal(signal.SIGTERM)
    try:
        assert main(["run", "killed", "--quick", "--repeats", "2", "--out", str(tmp_path)]) == 1
    finally:
        BENCHES.pop("killed", None)
    df = results.load(tmp_path)
    assert sorted(df["variant"]) == ["v0", "v1"] and set(df["status"]) == {"ok"}
    assert "interrupted" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) == before


def test_bad_input_stops_before_any_kernel(tmp_path, capsys):
    assert main(["run", "nosuch"]) == 2
    assert "unknown bench 'nosuch'" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
    for bad, what in ((["--formats", "fp4"], "unknown KV format"),
                      (["--repeats", "0"], "--repeats must be an integer >= 1")):
        with pytest.raises(SystemExit) as e:
            main(["run", "attention", "--quick", "--out", str(tmp_path / "x"), *bad])
        assert e.value.code == 2 and what in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_module_spelling_runs_the_registered_bench():
    """``python -m harness.bench.swap_in --help`` (BENCHMARKS.md's spelling) is ``run swap_in``."""
    p = subprocess.run([sys.executable, "-m", "harness.bench.swap_in", "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "python -m harness.bench run swap_in" in p.stdout and "--repeats" in p.stdout


# ------------------------------------------------------------------------ the benches

def test_attention_quick(tmp_path):
    """Every kernel variant and KV format checked and timed; sweep rows and bench rows load
    together."""
    rc, df = run_bench(tmp_path, "attention")
    assert rc == 0
    ok = assert_measured(df, "attention")
    assert len(ok) == len(df)
    sz = attention_bench.QUICK
    shape = sz.shapes[0]
    conv = df[df["kernel"] == "convert_req_index_to_global_index"]
    assert len(conv) == 1 and conv["max_rel_err"].iloc[0] == 0
    att = df[df["kernel"] == "sparse_mla_decode"]
    assert sorted(zip(att["kv_dtype"], att["variant"])) == sorted(
        (f, v) for f in ("bf16", "fp8_ds_mla") for v in shape.variants)
    for _, r in att.iterrows():
        assert json.loads(r["launch_config"]) == attention_bench.VARIANTS[r["variant"]]
        assert r["max_lse_err"] <= attention_bench.LSE_TOL[r["kv_dtype"]]
        assert (r["batch_size"], r["num_heads"], r["top_k"], r["head_dim"], r["head_dim_v"]) == (
            shape.batch, shape.heads, shape.top_k, sz.d_qk, sz.d_v)
        assert r["flops"] == shape.batch * 2 * shape.heads * shape.top_k * (sz.d_qk + sz.d_v)
        assert r["bytes_hbm_read"] == shape.batch * shape.top_k * r["kv_row_bytes"]
        assert r["tflops"] == pytest.approx(r["flops"] / r["latency_us_median"] / 1e6)
    assert set(att["kv_row_bytes"]) == {2 * sz.d_qk, sz.d_v + 4 * sz.d_v // 128 + 2 * (sz.d_qk - sz.d_v)}
    # one loader, one frame: a sweep beside the bench rows; the report analyses the sweep's
    grid = synthetic_grid()
    write_sweep(tmp_path / "sweep", grid)
    both = results.load(tmp_path)
    assert len(both) == len(df) + len(grid)
    assert both["bench"].isna().sum() == len(grid) == both["backend"].notna().sum()
    assert len(report.analyse(tmp_path).df) == len(grid)
    table = format_table(df)
    assert len(table.splitlines()) == len(df) + 2 and "rel_err" in table


def test_attention_quick_flags_a_wrong_kernel(tmp_path, monkeypatch):
    """A kernel whose output is off is recorded as incorrect (the check is not vacuous)."""
    real = attention_bench.sparse_mla_decode

    def off(*a, **kw):
        out, lse = real(*a, **kw)
        return out * 1.05, lse
    monkeypatch.setattr(attention_bench, "sparse_mla_decode", off)
    rc, df = run_bench(tmp_path, "attention", "--formats", "bf16", "--variants", "default")
    att = df[df["kernel"] == "sparse_mla_decode"]
    assert rc == 1 and list(att["status"]) == ["incorrect"]
    assert att["max_rel_err"].iloc[0] > att["tolerance"].iloc[0]


def test_swap_in_quick(tmp_path):
    """Every section but the gather (``tests/test_copy_engines.py`` runs it: its persistent
    launches cost the interpreter one step per row and program)."""
    sz = swap_in_bench.QUICK
    rc, df = run_bench(tmp_path, "swap_in", "--section", "all_misses,all_hits,steady_state,context",
                       "--resolve-kernel", "triton,cuda", "--host-alloc", "pinned,registered,thp")
    assert rc == 0
    ok = assert_measured(df, "swap_in")
    assert len(ok) == len(df) and (df["max_rel_err"] == 0).all()
    engines = {"uva_kernel", "memcpy", "staged"}
    swap = df[df["kernel"] == "swap_in_selected_pages"]
    for case in ("all_misses", "all_hits", "steady_state"):
        assert engines <= set(swap[swap["case"] == case]["copy_engine"])
    a = swap[swap["case"] == "all_misses"]
    assert (a["misses"] == sz.top_k).all() and (a["bytes_h2d"] == sz.top_k * sz.row_bytes).all()
    assert (a["h2d_gbps"] > 0).all()
    assert (swap[swap["case"] == "all_hits"]["misses"] == 0).all()
    c = swap[swap["case"] == "steady_state"]
    assert ((0 < c["misses"]) & (c["misses"] < sz.batch * sz.top_k)).all()
    assert (c["hits"] + c["misses"] == sz.batch * sz.top_k).all()
    assert c["hit_rate"].between(0, 1, inclusive="neither").all()
    assert set(c["variant"].dropna()) == {f"rows{r}" for r in sz.uva_rows_sweep if r != 4}
    copies = df[df["kernel"] == "copy"]
    assert {"scattered_rows", "contiguous_rows"} == set(copies["case"])
    assert set(copies["variant"].dropna()) == {f"rows{r}" for r in sz.uva_rows_sweep}
    resolve = df[(df["kernel"] == "resolve_selection") & (df["case"] == "all_hits")]
    assert sorted(resolve["batch_size"]) == [1, sz.batch]
    # context: equal misses at every context, in every host pool, with the host translations
    # as the cycle of steps leaves them and evicted before each call (+cold)
    ctx = swap[swap["case"].str.startswith("context")]
    cases = {c + t for c in ("context", "context+registered", "context+thp") for t in ("", "+cold")}
    assert (ctx["cold_host_translations"] == ctx["case"].str.endswith("+cold")).all()
    # the CUDA resolve cannot run on the CPU: skipped with its reason
    assert set(ctx["case"]) == cases
    assert set(ctx["context_len"]) == set(sz.context_lens)
    per_step = sz.context_batch * (sz.top_k - round(sz.overlap_c * sz.top_k))
    assert (ctx["misses"] == per_step).all()


def _quick_run(name: str) -> BenchRun:
    args = argparse.Namespace(quick=True, repeats=REPEATS, warmup=WARMUP)
    return BenchRun(name, args, torch.device("cpu"), f"test {name}")


def test_swap_in_flags_wrong_device_rows(monkeypatch):
    """A copy engine that corrupts a loaded row makes the swap-in rows incorrect."""
    real = UvaKernelEngine._copy

    def corrupting(self, host_layer, device_layer, plan, batch, unit_rows):
        real(self, host_layer, device_layer, plan, batch, unit_rows)
        m = (plan.shape[1] - 1) // 2
        if batch and int(plan[0, 0]):
            device_layer[int(plan[0, 1 + m])] ^= 1
    monkeypatch.setattr(UvaKernelEngine, "_copy", corrupting)
    run = _quick_run("swap_in")
    swap_in_bench.all_misses(run, swap_in_bench.QUICK)
    rows = pd.DataFrame(run.rows)
    uva = rows[rows["copy_engine"] == "uva_kernel"]
    assert set(uva["status"]) == {"incorrect"} and (uva["max_rel_err"] > 0).all()
    assert set(rows[rows["copy_engine"] != "uva_kernel"]["status"]) == {"ok"}


def test_indexer_quick_with_launch_variants(tmp_path):
    rc, df = run_bench(tmp_path, "indexer", "--tune")
    assert rc == 0
    ok = assert_measured(df, "indexer")
    assert len(ok) == len(df)
    idx = df[df["kernel"] == "indexer_logits_paged"]
    fp8 = idx[idx["kv_dtype"] == "fp8"]
    assert sorted(fp8[fp8["context_len"] == 700]["variant"]) == sorted(indexer_bench.INDEXER_VARIANTS)
    assert list(fp8[fp8["context_len"] == 96]["variant"]) == ["default"]
    assert list(idx[idx["kv_dtype"] == "bf16"]["context_len"]) == [700]
    assert (idx["max_rel_err"] <= indexer_bench.INDEXER_TOL).all()
    for _, r in fp8.iterrows():
        assert json.loads(r["launch_config"]) == asdict(indexer_bench.INDEXER_VARIANTS[r["variant"]])
        assert r["bytes_hbm_read"] == 2 * r["context_len"] * (32 + 4)   # fp8 keys + a scale
    ours = df[df["kernel"] == "topk_per_row"]
    assert sorted(ours["variant"]) == sorted(indexer_bench.TOPK_VARIANTS)
    assert (ours["peer"] == "torch.topk").all() and (ours["ratio_to_peer"] > 0).all()
    assert (ours["max_rel_err"] == 0).all()
    fused = df[(df["kernel"] == "topk_transform") & (df["variant"] == "fused")]
    assert list(fused["peer"]) == ["topk_transform unfused"] and fused["ratio_to_peer"].iloc[0] > 0
    assert {"plan_topk", "torch.topk"} <= set(df["kernel"])


def test_indexer_topk_check_catches_a_wrong_selection():
    logits = torch.randn(2, 300)
    lens = torch.tensor([300, 120], dtype=torch.int32)
    pos = torch.topk(logits[:, :120], 16, dim=1).indices.sort(dim=1).values.to(torch.int32)
    assert indexer_bench.topk_error(pos, logits, lens, 16) == "top-k row 0: score set differs from torch.topk"
    pos[0] = torch.topk(logits[0], 16).indices.sort().values
    assert indexer_bench.topk_error(pos, logits, lens, 16) == ""
    pos[1, 3] = pos[1, 2]
    assert "duplicate" in indexer_bench.topk_error(pos, logits, lens, 16)


@pytest.mark.slow
def test_peers_quick(tmp_path):
    """Attention and conversion peers are absent on the CPU (unavailable rows, ours measured);
    the swap-in comparison runs against the Python model of SGLang's kernel: same misses per
    request on both sides, every device row right."""
    sz = swap_in_bench.QUICK
    rc, df = run_bench(tmp_path, "peers")
    assert rc == 0
    assert_measured(df, "peers")
    flashmla = df[df["kernel"] == "flashmla"]
    assert len(flashmla) == 2 and set(flashmla["status"]) == {"unavailable"}
    attn = df[df["kernel"] == "sparse_mla_decode"]
    assert set(attn["status"]) == {"ok"} and attn["ratio_to_peer"].isna().all()
    # vLLM's conversion kernel runs where it is staged (.peer_build/vllm), else is unavailable
    vllm = df[df["kernel"] == "vllm_convert_req_index_to_global_index"]
    conv = df[df["kernel"] == "convert_req_index_to_global_index"]
    assert len(vllm) == 1 and set(conv["status"]) == {"ok"}
    try:
        vllm_peer.vllm_convert_kernel()
        staged = True
    except PeerUnavailable:
        staged = False
    if staged:
        assert set(vllm["status"]) == {"ok"} and (conv["ratio_to_peer"] > 0).all()
    else:
        assert set(vllm["status"]) == {"unavailable"} and conv["ratio_to_peer"].isna().all()
    swap = df[df["case"].notna() & df["kernel"].str.contains("swap_in|sglang")]
    assert len(swap) == 12 and set(swap["status"]) == {"ok"} and (swap["max_rel_err"] == 0).all()
    assert set(swap["lru_order"].dropna()) == {"upstream", "position"}    # ours in both orders
    misses = swap.groupby("case")["misses"].first()
    assert misses["all_misses"] == sz.top_k and misses["all_hits"] == 0
    assert 0 < misses["steady_state"] < sz.batch * sz.top_k
    mine = swap[swap["kernel"] == "swap_in_selected_pages"]
    assert (mine["peer"] == "sglang_model_kernel").all() and (mine["ratio_to_peer"] > 0).all()
    assert set(swap["kernel"]) == {"swap_in_selected_pages", "sglang_model_call", "sglang_model_kernel"}


@pytest.mark.gpu
def test_every_bench_quick_on_the_gpu(tmp_path):
    """On CUDA, --quick times graph replays too; FlashMLA at the quick sizes is invalid (16 heads)
    or unavailable (not installed)."""
    rc = main(["run", "all", "--quick", "--repeats", "3", "--out", str(tmp_path)])
    df = results.load(tmp_path)
    assert rc == 0, df[~df["status"].isin(["ok"])][["bench", "kernel", "status", "error"]]
    assert set(df["bench"]) == set(benches())
    for name in ("attention", "indexer"):
        assert df[(df["bench"] == name) & df["cuda_graph"]]["status"].eq("ok").any()
    assert (df[df["status"] == "ok"]["ceiling_hbm_gbps"] > 0).all()
    assert set(df[df["kernel"] == "flashmla"]["status"]) <= {"invalid", "unavailable"}
