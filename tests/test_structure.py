"""The project's structure: dependency direction, names with one source, the scenario group."""
import ast
from pathlib import Path

import pytest

from cli import compose

from backends import BACKENDS, backend_class
from backends.base import ConfigError
from harness import results
from harness.analysis import tables
from harness.scenarios import SCENARIOS, scenario_class
from harness.validate import CHOICES, validate

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path):
    """Top-level module names every import statement of ``path`` names (function-level too)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


@pytest.mark.parametrize("package", ["backends"])
def test_backends_and_kernels_never_import_the_harness(package):
    offenders = [f"{p.relative_to(ROOT)}: {m}" for p in sorted((ROOT / package).rglob("*.py"))
                 for m in _imports(p) if m == "harness" or m.startswith("harness.")]
    assert not offenders, offenders


POINT = ["device=cpu", "model=tiny", "top_k=16", "context_len=64", "batch_size=2", "steps=3"]


def test_scenario_group_and_phase_alias():
    assert compose(*POINT).scenario == "decode"
    for name in SCENARIOS:
        cfg = compose(f"scenario={name}", *POINT)
        assert cfg.scenario == name
    cfg = compose("phase=extend", *POINT)
    validate(cfg)
    assert cfg.scenario == "extend"
    with pytest.raises(ConfigError, match="phase"):  # two names for one thing, disagreeing
        validate(compose("phase=decode", "scenario=extend", *POINT))


def test_every_declared_setting_is_a_config_node_with_checked_choices():
    cfg = compose(*POINT)
    for name in BACKENDS:
        cls = backend_class(name)
        if cls.settings is not None:
            assert name in cfg, f"backend {name}'s settings are not composed under {name}.*"
        for field, allowed in cls.choices.items():
            assert CHOICES[f"{name}.{field}"] == allowed
    with pytest.raises(ConfigError, match="hisparse.copy_engine"):
        validate(compose("hisparse.copy_engine=dma", *POINT))


def test_declared_stages_and_columns_have_result_columns():
    for name in BACKENDS:
        cls = backend_class(name)
        for st in (*cls.stages, *cls.extend_stages):
            assert f"stage_{st}_us" in results.COLUMNS and f"stage_{st}_us" in results.STEP_COLUMNS
        for col in cls.columns:
            assert col in results.COLUMNS
        for axis in cls.variant_axes:
            assert axis in tables.VARIANT_AXES
    for name in SCENARIOS:
        for col in scenario_class(name).columns:
            assert col in results.COLUMNS
