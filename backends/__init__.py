"""Backend adapters. Each backend serves the same top-k selection its own way behind one
interface (``backends.base.Backend``); the registry maps a config name to its class, imported
lazily so that choosing a device (and the Triton interpreter) happens before any kernel module
is imported.
"""
from __future__ import annotations

import importlib
from typing import Dict, Type

#: backend name -> "module:Class"
BACKENDS: Dict[str, str] = {
    "flashmla_sparse": "backends.flashmla_sparse:FlashMLASparseBackend",
    "hisparse": "backends.hisparse:HiSparseBackend",
}


def backend_class(name: str) -> Type:
    """The adapter class registered under ``name``."""
    if name not in BACKENDS:
        raise KeyError(f"backend={name!r}: allowed {sorted(BACKENDS)} or 'all'")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)
