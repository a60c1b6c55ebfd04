"""Scenarios of the queue pipeline (``pipeline: queue``): rollout slots, groups, a bounded
queue of finished groups, and a trainer that takes time per step.

The keys below are a public contract (see ``docs/queue.md``)::

    pipeline: queue
    updates: 1000                  # trainer steps
    rollout:
      concurrency: 128             # C: samples in flight; a slot starts the next sample when one ends
      group_size: 8                # S: a group is finished when its slowest sample is
      sample: {dist: lognormal, mean: 1.0, cv: 0.27}   # or job: (the ES job forms)
      sync_seconds: 0              # per missed version, before a slot's next sample
    trainer:
      batch: 128                   # B: samples per step, whole groups
      step: {dist: constant, value: 2.0}
    queue:
      capacity: 2                  # q, in batches (q * B samples); null: unbounded
      rule: drop_oldest            # block | drop_oldest | max_staleness | cohort
      max_staleness: null          # K: for rule max_staleness and for admission
      admission: false             # no sample starts that could exceed K
      policy: null                 # rule cohort: an ES policy (the cohort engine's rules)
      drain_every: 0               # rule cohort: drain before every k-th commit
    in_flight_updates: false       # true: samples in flight take each new version

Cross-field mistakes are reported like every other one: one line naming the field.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, ValidationError, model_validator

from staleness_sim.cohort.config import JobSpec, PolicySpec, Scenario
from staleness_sim.core.settings import ConfigError, _Strict, describe_error
from staleness_sim.durations import DurationSpec, make_duration

RULES = ("block", "drop_oldest", "max_staleness", "cohort")
PIPELINES = ("cohort", "queue")


class RolloutSpec(_Strict):
    concurrency: Annotated[int, Field(ge=1)]
    group_size: Annotated[int, Field(ge=1)] = 1
    sample: DurationSpec | None = None
    job: JobSpec | None = None
    sync_seconds: Annotated[float, Field(ge=0.0)] = 0.0

    @model_validator(mode="after")
    def _one_duration(self) -> RolloutSpec:
        if (self.sample is None) == (self.job is None):
            raise ValueError("give exactly one of sample (a duration model) or job (the ES forms)")
        return self

    def job_spec(self) -> JobSpec:
        """The sample's duration as the cohort engine's job spec (same sampler, same draws)."""
        return self.job if self.job is not None else JobSpec(duration=self.sample)


class TrainerSpec(_Strict):
    batch: Annotated[int, Field(ge=1)]
    step: DurationSpec


class QueueSpec(_Strict):
    capacity: Annotated[float, Field(ge=1.0, allow_inf_nan=False)] | None = None
    rule: Literal["block", "drop_oldest", "max_staleness", "cohort"] = "block"
    max_staleness: Annotated[int, Field(ge=0)] | None = None
    admission: bool = False
    policy: PolicySpec | None = None
    drain_every: Annotated[int, Field(ge=0)] = 0


class QueueScenario(_Strict):
    pipeline: Literal["queue"]
    name: str = "scenario"
    seed: Annotated[int, Field(ge=0)] = 0
    updates: Annotated[int, Field(ge=1)]
    rollout: RolloutSpec
    trainer: TrainerSpec
    queue: QueueSpec = Field(default_factory=QueueSpec)
    in_flight_updates: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> QueueScenario:
        problem = _cross_field_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    # read-only views shared with the cohort engine's scenarios (compare, plots)
    @property
    def workers(self) -> int:
        return self.rollout.concurrency

    @property
    def cohort(self) -> int:
        return self.trainer.batch

    @property
    def capacity_samples(self) -> int | None:
        """The queue's capacity in samples: q * B rounded down to whole groups (None: unbounded)."""
        if self.queue.capacity is None:
            return None
        s = self.rollout.group_size
        return math.floor(self.queue.capacity * self.trainer.batch / s + 1e-9) * s


def _cross_field_problem(sc: QueueScenario) -> str | None:
    """The first inconsistency between fields, as 'field: what is wrong', or None."""
    q, r, s = sc.queue, sc.rollout, sc.rollout.group_size
    given = q.model_fields_set
    if sc.trainer.batch % s:
        return (
            f"trainer.batch: must be a multiple of rollout.group_size ({s}), "
            f"since a step takes whole groups (got {sc.trainer.batch})"
        )
    if q.rule == "cohort":
        if q.policy is None:
            return "queue.policy: required by rule cohort (an ES policy, e.g. {kind: sync})"
        if s != 1:
            return f"rollout.group_size: rule cohort takes groups of one job (got {s})"
        for key in ("capacity", "max_staleness", "admission"):
            if key in given and getattr(q, key) not in (None, False):
                return f"queue.{key}: not used by rule cohort (its policy decides)"
        if sc.in_flight_updates:
            return "in_flight_updates: not available with rule cohort (jobs keep their version)"
        return None
    for key in ("policy", "drain_every"):
        if key in given and getattr(q, key) not in (None, 0):
            return f"queue.{key}: only used by rule cohort (got rule {q.rule})"
    spec = r.sample if r.sample is not None else (r.job.duration or r.job.episode)
    if not make_duration(spec).mean() > 0:
        where = "rollout.sample" if r.sample is not None else "rollout.job"
        return f"{where}: durations must not all be 0 (samples would never take time)"
    step = make_duration(sc.trainer.step)
    if float(step.cdf(np.zeros(1))[0]) > 0:
        return (
            "trainer.step: a step must take time (this model gives 0 with positive "
            "probability); for instantaneous updates use rule cohort"
        )
    needs_k = q.rule == "max_staleness" or q.admission
    if needs_k and q.max_staleness is None:
        why = "rule max_staleness" if q.rule == "max_staleness" else "queue.admission"
        return f"queue.max_staleness: required by {why}"
    if not needs_k and q.max_staleness is not None:
        return "queue.max_staleness: only used by rule max_staleness or queue.admission"
    if sc.in_flight_updates and r.sync_seconds > 0:
        return "rollout.sync_seconds: not modelled with in_flight_updates (use 0)"
    return None


def validate_queue(data: dict[str, Any], source: str = "config") -> QueueScenario:
    """Validate a ``pipeline: queue`` scenario; mistakes raise a one-line ConfigError."""
    pipeline = data.get("pipeline")
    if pipeline != "queue":
        raise ConfigError(
            f"{source}: pipeline: must be one of {', '.join(PIPELINES)} (got {pipeline!r})"
        )
    try:
        return QueueScenario.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        if not err["loc"] and err["type"] == "value_error":  # a cross-field check: names its field
            raise ConfigError(f"{source}: {err['msg'].removeprefix('Value error, ')}") from None
        raise ConfigError(f"{source}: {describe_error(e, data, root=QueueScenario)}") from None


def es_as_queue(scenario: Scenario) -> dict[str, Any]:
    """An ES scenario of the cohort engine written in the queue pipeline: groups of one job,
    B = N, the update as the trainer's (constant) step, and the cohort rule (the ES policy)."""
    job = scenario.job
    rollout: dict[str, Any] = {"concurrency": scenario.workers, "group_size": 1}
    if job.duration is not None:
        rollout["sample"] = job.duration.model_dump(mode="json", exclude_none=True)
    else:
        rollout["job"] = job.model_dump(mode="json", exclude_none=True)
    if scenario.sync_seconds:
        rollout["sync_seconds"] = scenario.sync_seconds
    queue: dict[str, Any] = {"rule": "cohort", "policy": scenario.policy.model_dump(mode="json")}
    if scenario.drain_every:
        queue["drain_every"] = scenario.drain_every
    return {
        "pipeline": "queue",
        "name": scenario.name,
        "seed": scenario.seed,
        "updates": scenario.updates,
        "rollout": rollout,
        "trainer": {
            "batch": scenario.cohort,
            "step": {"dist": "constant", "value": scenario.update_seconds},
        },
        "queue": queue,
    }
