"""The registry of micro-benchmarks (tritonbench style: each bench registers itself).

A bench is a function ``run(run: BenchRun) -> None`` in a module of ``harness.bench``,
registered with ``@register(name, description, options=...)``. It builds its inputs (pools,
page tables, pinned buffers: untimed set-up) and calls ``run.measure(fn, check=..., **columns)``
once per result row; the timing, the verdict of the check and the columns every row shares are
``BenchRun``'s job (``harness/bench/measure.py``). ``options(parser)`` adds the bench's own
command-line options to its ``argparse`` parser (``--quick``, ``--out``, ``--repeats`` and
``--warmup`` are common to every bench).

Adding a bench is one new module here with one registered function: ``benches()`` imports every
module of the package and so finds it.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Optional

if TYPE_CHECKING:
    from harness.bench.measure import BenchRun


@dataclass(frozen=True)
class Bench:
    name: str
    description: str                                   # one line, shown by ``list``
    run: Callable[["BenchRun"], None]
    options: Callable[[argparse.ArgumentParser], None]


BENCHES: Dict[str, Bench] = {}


def _no_options(parser: argparse.ArgumentParser) -> None:
    """A bench without options of its own."""


def register(name: str, description: str,
             options: Optional[Callable[[argparse.ArgumentParser], None]] = None):
    """Decorator: registers ``fn(run: BenchRun)`` as the bench ``name``.

    ``description`` is one line. A second bench of the same name is an error, except a module
    run as a script (``python -m harness.bench.attention``, module ``__main__``) that is then
    imported again under its own name: the imported copy replaces the script's.
    """
    if not name.isidentifier():
        raise ValueError(f"bench name must be an identifier, got {name!r}")
    if not description or "\n" in description:
        raise ValueError(f"bench {name!r}: the description must be one non-empty line")

    def deco(fn: Callable[["BenchRun"], None]) -> Callable[["BenchRun"], None]:
        old = BENCHES.get(name)
        if old is not None and "__main__" not in (old.run.__module__, fn.__module__):
            raise ValueError(f"bench {name!r} is registered twice ({old.run.__module__}, "
                             f"{fn.__module__})")
        if old is None or old.run.__module__ == "__main__":
            BENCHES[name] = Bench(name, description, fn, options or _no_options)
        return fn
    return deco


def benches() -> Dict[str, Bench]:
    """Every registered bench by name (imports every module of ``harness.bench`` first)."""
    import harness.bench as package
    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"harness.bench.{module.name}")
    return dict(sorted(BENCHES.items()))
