"""Workers: each holds its own backend (a copy of the weights) and runs one job at a time.

- :mod:`~runner.workers.protocol`: :class:`Worker`, what the orchestrator may ask of one;
- :mod:`~runner.workers.local`: :class:`LocalWorker`, a worker in this process (its
  backend, batcher and episode settings, and the one call of :func:`runner.rollouts.run_job`);
- :mod:`~runner.workers.ray_actor`: the Ray actor, which wraps a ``LocalWorker`` in its own
  process; :mod:`~runner.workers.ray_driver`: the orchestrator's handle on an actor
  (:class:`RayWorker`) and the pool that starts them (``placement: ray``, ``docs/scaling.md``);
- :mod:`~runner.workers.factory`: :func:`worker_factory` picks one from the config.

Imports go one way: protocol <- local <- ray_actor <- ray_driver <- factory. Nothing here
imports torch or Ray until a backend or an actor is built.
"""

from runner.workers.factory import worker_factory
from runner.workers.local import LocalWorker, build_backend, episode_config, worker_device
from runner.workers.protocol import Worker, WorkerFactory

__all__ = [
    "LocalWorker",
    "Worker",
    "WorkerFactory",
    "build_backend",
    "episode_config",
    "worker_device",
    "worker_factory",
]
