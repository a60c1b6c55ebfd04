"""The cohort engine's scenario: G workers, a cohort of N, a policy, a job model, costs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from staleness_sim.core.settings import ConfigError, _Strict, describe_error
from staleness_sim.durations import CpuShare, DurationSpec, EngineSpec, TurnsSpec
from staleness_sim.learning.spec import LearningSpec


class SyncPolicy(_Strict):
    kind: Literal["sync"]


class BoundedPolicy(_Strict):
    kind: Literal["bounded"]
    max_lag: Annotated[int, Field(ge=0)]
    on_stale: Literal["drop", "pace", "cancel"] = "drop"


class ControlledDelayPolicy(_Strict):
    kind: Literal["controlled_delay"]
    fraction: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    delay: Annotated[int, Field(ge=1)]


class UnboundedPolicy(_Strict):
    kind: Literal["unbounded"]


PolicySpec = Annotated[
    SyncPolicy | BoundedPolicy | ControlledDelayPolicy | UnboundedPolicy,
    Field(discriminator="kind"),
]


class JobSpec(_Strict):
    """A job is one perturbation's evaluation: a direct duration, D episodes over C
    sessions, or (opt-in) D episodes of ``turns`` over C sessions sharing one ``engine``
    (``staleness_sim.durations.turns``)."""

    duration: DurationSpec | None = None
    episodes: Annotated[int, Field(ge=1)] | None = None
    concurrency: Annotated[int, Field(ge=1)] | None = None
    episode: DurationSpec | None = None
    turns: TurnsSpec | None = None
    engine: EngineSpec | None = None
    cpu: CpuShare | None = None  # the turn model on a CPU its containers share

    @model_validator(mode="after")
    def _one_form(self) -> JobSpec:
        if (self.turns is None) != (self.engine is None):
            raise ValueError("turns and engine go together (the turn model)")
        if self.cpu is not None and self.turns is None:
            raise ValueError("cpu (cores shared by containers and engine) needs turns + engine")
        composed = (self.episodes, self.concurrency, self.episode or self.turns)
        if self.duration is not None:
            if any(x is not None for x in composed):
                raise ValueError("give either duration, or episodes + concurrency + episode")
        elif self.episode is not None and self.turns is not None:
            raise ValueError("give either episode or turns + engine, not both")
        elif any(x is None for x in composed):
            raise ValueError(
                "needs duration, or all of episodes, concurrency and episode (or turns + engine)"
            )
        return self


class VersionEffect(_Strict):
    """A factor shared by the jobs of one dispatch version that start together.

    The first job of version v to start opens a group at its start time t0; the jobs of v
    that start before t0 + ``window`` join it, a later one opens the next group. Each
    group draws one ``factor`` (mean about 1) that multiplies its jobs' durations. Without
    ``window`` a group is the whole version.
    """

    factor: DurationSpec
    window: Annotated[float, Field(gt=0)] | None = None


class Contention(_Strict):
    """Workers that share one machine: with k jobs busy, each progresses at
    min(1, capacity / k) of its solo speed (processor sharing), and job durations are
    solo durations. ``capacity``: how many jobs the machine runs at full speed at once."""

    capacity: Annotated[float, Field(gt=0)]


class Scenario(_Strict):
    name: str = "scenario"
    seed: Annotated[int, Field(ge=0)] = 0
    workers: Annotated[int, Field(ge=1)]
    cohort: Annotated[int, Field(ge=1)]
    updates: Annotated[int, Field(ge=1)]
    policy: PolicySpec
    job: JobSpec
    update_seconds: Annotated[float, Field(ge=0.0)] = 0.0
    sync_seconds: Annotated[float, Field(ge=0.0)] = 0.0
    drain_every: Annotated[int, Field(ge=0)] = 0
    # Opt-in modelling of measured runs (unset: the model above, unchanged).
    # dispatch_seconds: a fixed latency between a worker being handed a job and the job
    # starting (the controller's bookkeeping, journal and table writes), spent syncing.
    dispatch_seconds: Annotated[float, Field(ge=0.0)] | None = None
    # version_effect: jobs of one dispatch version share their tasks and sampling seed
    # (common random numbers), and jobs that run side by side share the machine, so their
    # durations move together: see VersionEffect.
    version_effect: VersionEffect | None = None
    # contention: workers share one machine (a CPU run): see Contention.
    contention: Contention | None = None
    # learning: held-out success along the schedule (staleness_sim.learning; docs/success.md)
    learning: LearningSpec | None = None

    @model_validator(mode="after")
    def _learning_episodes(self) -> Scenario:
        learning = self.learning
        if learning is not None and learning.episodes is None and self.job.episodes is None:
            raise ValueError("learning.episodes is required when job has no episodes")
        return self

    def learning_episodes(self) -> int:
        """D, the episodes of a job the success model evaluates."""
        assert self.learning is not None
        return self.learning.episodes or self.job.episodes


def validate_cohort(data: dict[str, Any], source: str = "config") -> Scenario:
    """Validate a cohort scenario; mistakes raise a one-line ConfigError."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: {describe_error(e, data, root=Scenario)}") from None
