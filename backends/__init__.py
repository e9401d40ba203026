"""Backend adapters. Each backend serves the same top-k selection its own way behind one
interface (``backends.base.Backend``) and declares its settings, stages, columns and report
variant axes on its class; the registry below maps a config name to that class. Registering a
backend is one line here.

Kernel modules are imported with the backend modules, so the Triton mode (compiled or
interpreted, ``TRITON_INTERPRET``) must be chosen before ``backend_class`` is first called
(``harness.device.choose_triton_mode``).
"""
from __future__ import annotations

import importlib
from typing import Dict, List, Type

#: backend name -> "module:Class"
BACKENDS: Dict[str, str] = {
    "flashmla_sparse": "backends.flashmla_sparse:FlashMLASparseBackend",
    "hisparse": "backends.hisparse:HiSparseBackend",
    "hisparse_connector": "backends.hisparse_connector:HiSparseConnectorBackend",
}


def backend_class(name: str) -> Type:
    """The adapter class registered under ``name``."""
    if name not in BACKENDS:
        raise KeyError(f"backend={name!r}: allowed {sorted(BACKENDS)} or 'all'")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def backend_classes() -> List[Type]:
    """Every registered adapter class, in name order."""
    return [backend_class(n) for n in sorted(BACKENDS)]
