"""The factory of a run's workers, chosen by the config's ``placement``."""

from __future__ import annotations

from runner.config import RunConfig
from runner.workers.local import LocalWorker
from runner.workers.protocol import WorkerFactory
from runner.workers.ray_driver import RayWorkerPool


def worker_factory(config: RunConfig) -> WorkerFactory:
    """``LocalWorker`` (``placement: local``), or a pool of Ray actors (``placement: ray``).

    Ray itself is imported only when a Ray pool is built.
    """
    if config.placement == "ray":
        return RayWorkerPool(config)
    return LocalWorker
