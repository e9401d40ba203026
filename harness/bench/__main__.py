"""``python -m harness.bench [NAME ...] [--quick]``: the kernel benchmarks, one after another in
one process (attention, swap_in, indexer, peers). Each prints its own table; with ``$OUT`` set
each also writes JSON there."""
from __future__ import annotations

import importlib
import sys
import traceback

BENCHES = ("attention", "swap_in", "indexer", "peers")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = []
    while argv and argv[0] in BENCHES + tuple(n for n in argv[:1] if not n.startswith("-")):
        names.append(argv.pop(0))
    names = names or list(BENCHES)
    flags = argv  # everything from the first option on goes to each bench
    bad = [n for n in names if n not in BENCHES]
    if bad:
        print(f"error: unknown bench {bad}; allowed: {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    failed = 0
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        try:
            mod = importlib.import_module(f"harness.bench.{name}")
            mod.main(flags)
        except SystemExit as e:
            failed += bool(e.code)
        except Exception:  # one broken bench must not hide the others' numbers
            traceback.print_exc()
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
