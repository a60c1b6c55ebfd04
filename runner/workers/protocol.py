"""What the orchestrator may ask of a worker, whatever runs it (this process, a Ray actor).

A worker holds its own backend (a copy of the weights) and runs one job at a time. It
never receives weights: before a job it replays the updates it has missed from the update
log (seeds and coefficients), as every ES worker does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from runner.config import RunConfig
    from runner.es import UpdateRecord
    from runner.rollouts import JobOutcome, JobSpec
    from runner.terminal.images import ImageBuilder


class Worker(Protocol):
    """One worker, as the orchestrator sees it (``LocalWorker``, ``RayWorker``)."""

    index: int

    @property
    def base_hash(self) -> str | None:
        """sha256 of the base weights (every worker of a run must hold the same)."""

    def es_config(self) -> dict[str, Any]:
        """The ES optimizer's configuration (written to the run's checkpoint)."""

    def sync(self, log: Sequence[UpdateRecord]) -> int:
        """Bring the weights to version ``len(log)`` by replaying the records it lacks."""

    def run_job(self, job: JobSpec, abort: threading.Event) -> JobOutcome:
        """Run one job on the perturbed weights; its episodes stop early once ``abort`` is set."""

    def close(self) -> None:
        """Release the backend (and, for an actor, the actor and its containers)."""


class WorkerFactory(Protocol):
    """What builds worker ``index``: ``LocalWorker`` itself, or a ``RayWorkerPool``.

    A factory may also have ``shutdown()``, called once at the end of the run.
    """

    def __call__(
        self,
        index: int,
        config: RunConfig,
        client: Any,
        builder: ImageBuilder,
        clock: Callable[[], float],
    ) -> Worker: ...
