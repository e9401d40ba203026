"""notebooks/tradeoffs.ipynb runs headless on a small results set and shows the expected outputs."""
import sys
from pathlib import Path

import pytest

# part of the [test] extra (installed by make test); the GPU machine runs without it
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

sys.path.insert(0, str(Path(__file__).parent))
from test_report import HS, make_row, synthetic_grid, write_sweep  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "tradeoffs.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert "DSA_RUN_DIR" in "".join(c.source for c in nb.cells)


def test_notebook_executes(tmp_path, monkeypatch):
    # the grid plus a hisparse sweep over device_buffer_size so that every figure kind renders
    rows = synthetic_grid(skip={(256, 2048, HS)})
    rows += [make_row(HS, 64, 2048, 150.0, device_buffer_size=D, hit_rate=h)
             for D, h in ((2048, 0.5), (8192, 0.95))]
    run = write_sweep(tmp_path / "sweep", rows)
    monkeypatch.setenv("DSA_RUN_DIR", str(run))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()   # raises on error

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    html = "\n".join(o.get("data", {}).get("text/html", "") for o in outputs)
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert f"{len(rows)} rows from {run}" in text
    assert "winner" in html and "missing" in html                       # trade-off table
    assert "holds" in html and "not enough data" in html                 # claims
    assert "tokens_per_s_at_max_batch" in html                           # capacity
    assert "PROJECTION onto gh200" in "\n".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    # heatmap, latency vs top-k, amplification, stage breakdown, hit rate
    assert len(pngs) >= 5


def test_notebook_on_a_cpu_sweep(tmp_path, monkeypatch):
    """The notebook on results the harness itself produced (a tiny CPU sweep, both backends)."""
    from cli import run_harness
    from harness import results
    sweep = tmp_path / "cpu_sweep"
    run_harness("-m", "page_size=16,64", "top_k=32", "context_len=200", "steps=3",
                "timing.warmup_steps=1", "batch_size=2", "report=false", f"hydra.sweep.dir={sweep}")
    from backends import BACKENDS
    n = len(results.load(sweep))
    assert n == 2 * len(BACKENDS)
    monkeypatch.setenv("DSA_RUN_DIR", str(sweep))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    html = "\n".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert f"{n} rows from {sweep}" in text
    assert "flashmla_sparse" in html and "hisparse" in html and "winner" in html
