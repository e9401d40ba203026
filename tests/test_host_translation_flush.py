"""The host translation flush (``harness.timing.HostTranslationFlusher``) and its kernel."""
import numpy as np
import pytest
import torch

from backends.kernels.host_copy import touch_pages_kernel
from harness.timing import HostTranslationFlusher


def test_touch_pages_kernel_sums_the_first_word_of_every_page():
    """Through the interpreter: program p stores the sum of the first words of pages
    ``p*BLOCK .. p*BLOCK+BLOCK-1``, pages past ``n_pages`` (the last program's tail) masked,
    no other word read into the sums."""
    page_words, block, n_pages = 64, 16, 37
    g = torch.Generator().manual_seed(1)
    buf = torch.randint(-1000, 1000, (n_pages + 5, page_words), dtype=torch.int32, generator=g)
    sums = torch.full((3,), 12345, dtype=torch.int32)
    touch_pages_kernel[(3,)](buf, n_pages, sums, PAGE_WORDS=page_words, BLOCK=block)
    first = buf[:n_pages, 0].numpy().astype(np.int64)
    want = [first[i * block:(i + 1) * block].sum() for i in range(3)]
    assert sums.tolist() == want


def test_flusher_is_a_no_op_on_the_cpu():
    f = HostTranslationFlusher("cpu", nbytes=1 << 20)
    f()
    assert f.host is None and f.last_sum == 0 and f.n_pages == 256


@pytest.mark.gpu
def test_flusher_reads_every_page_of_its_host_buffer():
    f = HostTranslationFlusher("cuda", nbytes=(64 << 20) + 4096 * 3)   # not whole blocks
    assert f.host.tensor.is_pinned()
    f()
    torch.cuda.synchronize()
    words = f.host.tensor.view(torch.int32).view(f.n_pages, -1)[:, 0]
    assert words.abs().sum() > 0                      # random words, not zeros
    assert f.last_sum == int(words.long().sum())     # each block's sum fits int32 (BLOCK * 2^20)


def test_every_timed_sample_and_no_warmup_call_follows_a_flush():
    """``time_fn(host_flush=...)``: the flush runs once before each timed sample, after its
    setup and not before warm-up calls, and the CPU path keeps working."""
    from harness.timing import time_fn
    events = []

    def flush():
        events.append("flush")
    t = time_fn(lambda: events.append("call"), "cpu", warmup=2, repeats=5,
                setup=lambda: events.append("setup"), host_flush=flush)
    assert t.n == 5
    assert events == ["setup", "call"] * 2 + ["setup", "flush", "call"] * 5


def test_a_run_records_its_host_translation_mode(tmp_path):
    from cli import run_harness
    from harness import results
    run_harness("backend=hisparse", "timing.cold_host_translations=true", "context_len=300",
                "steps=2", "timing.warmup_steps=1", "num_layers=1", "batch_size=2", "top_k=32",
                "report=false", f"hydra.run.dir={tmp_path}")
    df = results.load(tmp_path)
    assert (df["status"] == "ok").all(), df["error"]
    assert df["cold_host_translations"].tolist() == [True]


def test_a_flush_buffer_that_cannot_be_allocated_is_an_oom_row(monkeypatch, tmp_path):
    """On a GPU whose host cannot give the flush its 4 GiB: the point is an ``oom`` row naming
    the setting, nothing raised (the sweep goes on). Driven through the runner with CUDA
    reported present and the flusher's allocation failing."""
    import harness.runner as runner
    from harness.timing import HostTranslationFlusher
    from cli import compose

    def no_memory(device):
        raise MemoryError("cudaHostRegister of 4294967296 bytes failed")
    monkeypatch.setattr(HostTranslationFlusher, "shared", staticmethod(no_memory))
    monkeypatch.setattr(runner, "is_cuda", lambda device: True)
    cfg = compose("backend=hisparse", "timing.cold_host_translations=true", "context_len=300",
                  "steps=2", "timing.warmup_steps=1", "num_layers=1", "batch_size=2",
                  "top_k=32", "report=false")
    rows = runner.run_point(cfg, torch.device("cpu"), tmp_path, "python -m harness ...", "h")
    assert [r["status"] for r in rows] == ["oom"]
    assert "timing.cold_host_translations" in rows[0]["error"]
