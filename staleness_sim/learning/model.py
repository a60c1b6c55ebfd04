"""The success model run along a schedule: real ES arithmetic on the task population.

Version by version: every used result dispatched at version v is evaluated at
``theta_v + sign * sigma * eps`` (its perturbation) on the job's D episodes of version v's
task batch (common random numbers); then the update v -> v + 1 shapes the rewards of the
results it uses, wherever they were evaluated, and adds ``sum alpha/N * weight * sign * Z_i
* eps_i``. Held-out success is the expected success of an untrained task at each version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from staleness_sim.core.trace import Trace
from staleness_sim.learning.schedule import Schedule, schedule_from_trace
from staleness_sim.learning.shaping import coefficients
from staleness_sim.learning.spec import LearningSpec
from staleness_sim.learning.tasks import TaskPopulation

# independent streams of one seed: perturbations, and each version's task batch
_PERTURBATIONS, _TASKS = 1, 2


@dataclass(frozen=True)
class LearningResult:
    success: np.ndarray  # held-out success at versions 0..U
    times: np.ndarray  # when each version was available (s)
    rewards: np.ndarray  # each used result's reward, in the schedule's order
    thetas: np.ndarray  # the parameters at versions 0..U
    target: float

    def hours_to_success(self) -> float | None:
        """First wall-clock hour at which held-out success reaches the target."""
        reached = np.flatnonzero(self.success >= self.target)
        return float(self.times[reached[0]] / 3600) if reached.size else None

    def outputs(self) -> dict[str, Any]:
        """The keys ``run --json`` gains."""
        return {
            "success_initial": float(self.success[0]),
            "success_final": float(self.success[-1]),
            "success_curve": [[v, float(s)] for v, s in enumerate(self.success)],
            "hours_to_success": self.hours_to_success(),
        }


def learn(schedule: Schedule, spec: LearningSpec, seed: int) -> LearningResult:
    """Run the model along ``schedule``; the same schedule, spec and seed give the same
    result to the bit."""
    tasks = TaskPopulation(spec)
    eps = perturbations(schedule, spec, seed)
    n = schedule.n_updates
    thetas = np.zeros((n + 1, spec.dimension))
    rewards = np.full(schedule.dispatch.size, np.nan)
    by_dispatch = _groups(schedule.dispatch, n)
    by_update = _groups(schedule.update, n)
    for v in range(n):
        rows = by_dispatch[v]
        if rows.size:
            points = (
                thetas[v]
                + (schedule.sign[rows] * spec.sigma)[:, None] * eps[schedule.perturbation[rows]]
            )
            rng = np.random.default_rng([seed, _TASKS, v])
            rewards[rows] = tasks.rewards(points, schedule.episodes[rows], rng)
        used = by_update[v]
        thetas[v + 1] = thetas[v]
        if used.size:
            c = coefficients(
                rewards[used], schedule.sign[used], schedule.weight[used], spec.alpha, spec.shaping
            )
            thetas[v + 1] += np.einsum("i,ik->k", c, eps[schedule.perturbation[used]])
    success = np.array([tasks.heldout_success(t) for t in thetas])
    return LearningResult(success, schedule.times, rewards, thetas, spec.target)


def perturbations(schedule: Schedule, spec: LearningSpec, seed: int) -> np.ndarray:
    """eps, one row per perturbation of the schedule (the member is ``theta + sign sigma eps``)."""
    rng = np.random.default_rng([seed, _PERTURBATIONS])
    return rng.standard_normal((schedule.n_perturbations, spec.dimension))


def learn_trace(
    trace: Trace, spec: LearningSpec, seed: int, episodes: int | None = None
) -> LearningResult:
    """The model on a trace (simulated or measured); ``episodes``: D where the jobs table
    records none and ``spec.episodes`` is unset."""
    d = spec.episodes if spec.episodes is not None else episodes
    return learn(schedule_from_trace(trace, d, spec.antithetic), spec, seed)


def _groups(index: np.ndarray, n: int) -> list[np.ndarray]:
    """The positions holding each value 0..n-1, in order."""
    order = np.argsort(index, kind="stable")
    bounds = np.searchsorted(index[order], np.arange(n + 1))
    return [order[bounds[i] : bounds[i + 1]] for i in range(n)]
