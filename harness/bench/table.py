"""The one table printer of the benches: result rows (dicts, or a DataFrame in
``harness.results``' schema) as a fixed-width text table. A column empty in every row is left
out, and so is ``bench`` when all rows come from one bench.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Mapping, Sequence, Tuple, Union

import pandas as pd


def _fraction(num: str, den: str) -> Callable[[Mapping], float]:
    return lambda r: _get(r, num) / _get(r, den)


def _get(row: Mapping, column: str) -> float:
    v = row.get(column)
    return float("nan") if v is None or pd.isna(v) else float(v)


#: (header, column or function of the row, format) in the order printed
TABLE: List[Tuple[str, Union[str, Callable[[Mapping], object]], str]] = [
    ("bench", "bench", "s"), ("kernel", "kernel", "s"), ("variant", "variant", "s"),
    ("case", "case", "s"), ("kv", "kv_dtype", "s"), ("engine", "copy_engine", "s"),
    ("B", "batch_size", "d"), ("H", "num_heads", "d"), ("top_k", "top_k", "d"),
    ("ctx", "context_len", "d"), ("graph", "cuda_graph", "yes"), ("status", "status", "s"),
    ("median_us", "latency_us_median", ".1f"), ("p10_us", "latency_us_p10", ".1f"),
    ("p90_us", "latency_us_p90", ".1f"), ("TFLOP/s", "tflops", ".1f"),
    ("HBM_GB/s", "hbm_gbps", ".0f"), ("of_HBM", _fraction("hbm_gbps", "ceiling_hbm_gbps"), "%"),
    ("H2D_GB/s", "h2d_gbps", ".2f"), ("of_H2D", _fraction("h2d_gbps", "ceiling_h2d_gbps"), "%"),
    ("misses", "misses", "d"), ("rel_err", "max_rel_err", ".2e"), ("lse_err", "max_lse_err", ".2e"),
    ("vs", "peer", "s"), ("ratio", "ratio_to_peer", ".2f"), ("error", "error", "s60"),
]


def _cell(value: object, fmt: str) -> str:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if fmt == "yes":
        return "yes" if value else ""
    if fmt == "%":
        return f"{100 * float(value):.0f}%"
    if fmt == "d":
        return str(int(value))
    if fmt.startswith("s"):
        text = str(value).replace("\n", " ")
        width = int(fmt[1:] or 0)
        return text[:width] if width else text
    return format(float(value), fmt)


def format_table(rows: Union[pd.DataFrame, Iterable[Mapping]],
                 table: Sequence[Tuple[str, Union[str, Callable], str]] = TABLE) -> str:
    """Rows as text: one line per row, the columns of ``table`` that hold a value somewhere."""
    records: List[Dict] = (rows.to_dict("records") if isinstance(rows, pd.DataFrame)
                           else [dict(r) for r in rows])
    columns = []
    for header, source, fmt in table:
        cells = [_cell(source(r) if callable(source) else r.get(source), fmt) for r in records]
        if not any(cells) or (source == "bench" and len(set(cells)) == 1):
            continue
        numeric = fmt not in ("yes",) and not fmt.startswith("s")
        width = max(len(header), *(len(c) for c in cells))
        columns.append([(header.rjust(width) if numeric else header.ljust(width))]
                       + [c.rjust(width) if numeric else c.ljust(width) for c in cells])
    if not columns:
        return "(no rows)"
    lines = [" ".join(col[i] for col in columns).rstrip() for i in range(len(records) + 1)]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])
