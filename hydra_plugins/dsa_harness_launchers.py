"""Hydra launcher plugin of ``hydra/launcher=local_gpus`` (``conf/hydra/launcher/local_gpus.yaml``).

Hydra instantiates launchers only from the ``hydra_plugins`` namespace package, so the class
lives here; what it does (GPU slots, pinning, Hydra's joblib launcher underneath) is in
``harness.launchers``. This module is imported by Hydra's plugin scan at every start, so it
imports nothing but Hydra.
"""
from typing import Any, Optional, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class LocalGpusLauncher(Launcher):
    """One worker per GPU slot of this host, each pinned to its own GPU. ``gpus``: the number of
    slots (``None``: every visible GPU; on the CPU, simulated slots, default 1)."""

    def __init__(self, gpus: Optional[int] = None) -> None:
        self.gpus = gpus
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
               ) -> Sequence[JobReturn]:
        from harness.launchers import launch_local_gpus
        return launch_local_gpus(self, job_overrides, initial_job_idx)
