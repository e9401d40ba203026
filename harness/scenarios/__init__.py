"""Scenarios: what kind of point runs (``scenario=NAME``, a Hydra group). Each is a class in its
own module (``harness.scenarios.base.Scenario``) registered here with one line; the one point loop
of ``harness.runner`` drives every scenario's steps the same way."""
from __future__ import annotations

import importlib
from typing import Dict, List, Type

#: scenario name -> "module:Class"
SCENARIOS: Dict[str, str] = {
    "decode": "harness.scenarios.decode:DecodeScenario",
    "extend": "harness.scenarios.extend:ExtendScenario",
    "capacity": "harness.scenarios.capacity:CapacityScenario",
}


def scenario_class(name: str) -> Type:
    """The scenario class registered under ``name``."""
    if name not in SCENARIOS:
        raise KeyError(f"scenario={name!r}: allowed {sorted(SCENARIOS)}")
    module, cls = SCENARIOS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def scenario_classes() -> List[Type]:
    """Every registered scenario class, in registration order."""
    return [scenario_class(n) for n in SCENARIOS]
