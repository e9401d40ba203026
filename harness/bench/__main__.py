"""``python -m harness.bench``: the registered kernel micro-benchmarks.

    python -m harness.bench list                  # every bench: name and one line
    python -m harness.bench run NAME [--quick] [--out DIR] [--repeats N] [--warmup N] [options]
    python -m harness.bench run NAME --help       # NAME's own options
    python -m harness.bench run all [--quick] [--out DIR] [--repeats N] [--warmup N]
    python -m harness.bench NAME [options]        # shorthand for run NAME
    python -m harness.bench show DIR              # the table of bench results stored under DIR

A run writes its rows to DIR/result.parquet in the sweep's schema (``harness.results.load``
reads them beside sweep results): DIR is --out, else $OUT when set, else
results/bench/NAME-<UTC time>/; ``run all`` writes DIR/NAME/ for every bench. Each bench prints
one line per row as it goes and its table last. Without CUDA a full run falls back to --quick
(tiny sizes on the Triton interpreter: correctness runs, not performance figures). Exit status:
0 when every row is ok, unavailable or invalid; 1 when a row is incorrect or error, or a bench
failed or measured nothing; 2 for bad input.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pandas as pd
import torch

from harness import results
from harness.bench.measure import BenchRun
from harness.bench.registry import Bench, benches
from harness.bench.table import format_table
from harness.config import ROOT

#: statuses that do not fail a run (a peer that is absent or does not support a shape)
PASSING = ("ok", "unavailable", "invalid")
#: (full, quick) defaults of the common options
REPEATS, WARMUP = (20, 3), (3, 1)


def _count(kind: str, least: int):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = least - 1
        if n < least:
            raise argparse.ArgumentTypeError(f"{kind} must be an integer >= {least}, got {text!r}")
        return n
    return parse


def parser_for(bench: Optional[Bench]) -> argparse.ArgumentParser:
    """The command-line parser of ``bench`` (common options only for ``None``: ``run all``)."""
    name = bench.name if bench else "all"
    p = argparse.ArgumentParser(prog=f"python -m harness.bench run {name}",
                                description=bench.description if bench else "every bench")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes: a smoke run (Triton interpreter without a GPU)")
    p.add_argument("--out", default=None, help="result directory (default: $OUT, else "
                   "results/bench/NAME-<time>)")
    p.add_argument("--repeats", type=_count("--repeats", 1), default=None,
                   help=f"timed calls per row (default {REPEATS[0]}; {REPEATS[1]} with --quick)")
    p.add_argument("--warmup", type=_count("--warmup", 0), default=None,
                   help=f"untimed calls before them (default {WARMUP[0]}; {WARMUP[1]} with --quick)")
    if bench:
        bench.options(p)
    return p


def _repro(name: str, argv: List[str]) -> str:
    """The command that repeats this measurement (the output directory left out)."""
    kept, skip = [], False
    for a in argv:
        if skip or a == "--out" or a.startswith("--out="):
            skip = a == "--out"
            continue
        kept.append(a)
    return shlex.join(["python", "-m", "harness.bench", "run", name, *kept])


def _interrupt(signum, frame):
    """SIGTERM -> KeyboardInterrupt, so an interrupted bench still writes the rows it has."""
    raise KeyboardInterrupt


def run_bench(bench: Bench, args: argparse.Namespace, out_dir: Path, repro: str
              ) -> Tuple[List[Dict], bool]:
    """Runs ``bench``, writes its rows to ``out_dir``, prints its table. Returns (rows, passed)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.quick:
        print(f"[{bench.name}] no CUDA device: running the --quick sizes on the CPU", flush=True)
        args.quick = True
    args.repeats = args.repeats or REPEATS[args.quick]
    args.warmup = WARMUP[args.quick] if args.warmup is None else args.warmup
    run = BenchRun(bench.name, args, device, repro)
    passed = True
    previous = signal.signal(signal.SIGTERM, _interrupt)   # `timeout`, a scheduler's kill
    try:
        bench.run(run)
    except (Exception, KeyboardInterrupt) as e:  # its rows so far are still written
        if isinstance(e, KeyboardInterrupt):
            print(f"[{bench.name}] interrupted", flush=True)
        else:
            traceback.print_exc()
        print(f"[{bench.name}] failed after {len(run.rows)} rows", flush=True)
        passed = False
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not run.rows:
        print(f"[{bench.name}] measured nothing", flush=True)
        return [], False
    path = results.write_results(out_dir, run.rows)
    passed = passed and all(r["status"] in PASSING for r in run.rows)
    print(f"\n== {bench.name}: {len(run.rows)} rows -> {path} ({device.type}"
          f"{', quick' if args.quick else ''}) ==\n{format_table(run.rows)}", flush=True)
    return run.rows, passed


def _default_dir(name: str) -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return ROOT / "results" / "bench" / f"{name}-{stamp}"


def _run_all(registry: Dict[str, Bench], argv: List[str]) -> int:
    """Every bench with the common options ``argv``, each into ROOT/NAME; a summary last."""
    common = parser_for(None).parse_args(argv)
    root = Path(common.out) if common.out else _default_dir("all")
    summary, failed = [], 0
    for name, bench in registry.items():
        rows, passed = run_bench(bench, parser_for(bench).parse_args(argv), root / name,
                                 _repro(name, argv))
        failed += not passed
        statuses = pd.Series([r["status"] for r in rows], dtype="string").value_counts()
        summary.append({"name": name, "rows": len(rows), **statuses.to_dict(),
                        "passed": "yes" if passed else "NO"})
    seen = [s for s in results.STATUSES if any(s in r for r in summary)]
    print(f"\n== every bench -> {root} ==")
    print(format_table(summary, [("bench", "name", "s"), ("rows", "rows", "d"),
                                 *[(s, s, "d") for s in seen], ("passed", "passed", "s")]))
    return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    registry = benches()
    if argv and argv[0] in registry:                   # the older spelling: NAME [options]
        argv.insert(0, "run")
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "list":
        width = max(len(n) for n in registry)
        print("\n".join(f"{n.ljust(width)}  {b.description}" for n, b in registry.items()))
        return 0
    if command == "show" and len(rest) == 1:
        df = results.load(rest[0])
        print(format_table(df[df["bench"].notna()]))
        return 0
    if command != "run" or not rest or rest[0].startswith("-"):
        print(f"error: expected list, show DIR, or run NAME; bench names: "
              f"{', '.join(registry)}, all", file=sys.stderr)
        return 2
    name, options = rest[0], rest[1:]
    if name == "all":
        return _run_all(registry, options)
    if name not in registry:
        print(f"error: unknown bench {name!r}; registered: {', '.join(registry)} (or all)",
              file=sys.stderr)
        return 2
    bench = registry[name]
    args = parser_for(bench).parse_args(options)
    _, passed = run_bench(bench, args, Path(args.out) if args.out else _default_dir(name),
                          _repro(name, options))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
