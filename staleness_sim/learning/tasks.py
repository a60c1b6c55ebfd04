"""The population of tasks: binary success with a logistic response to the parameters.

A task t has a base logit ``b_t ~ N(mu, spread^2)`` and a direction
``w_t = sqrt(shared) * u + sqrt(1 - shared) * v_t``: ``u`` (the first coordinate) is common
to every task, ``v_t ~ N(0, I / dimension)`` is the task's own. At parameters ``x`` it
succeeds with probability ``sigmoid(b_t + effect * w_t . x)``. ``mu`` is set so that the
expected success at ``x = 0`` is ``base_rate``.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit

from staleness_sim.learning.spec import LearningSpec

# Gauss-Hermite nodes for E[sigmoid(m + s Z)], Z ~ N(0, 1): exact to ~1e-10 here
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(48)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()


def mean_sigmoid(mean: float, sd: float) -> float:
    """E[sigmoid(X)] for X ~ N(mean, sd^2)."""
    return float(expit(mean + sd * _NODES) @ _WEIGHTS)


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` without BLAS threads: these products are small, and a threaded BLAS on a
    loaded machine spends far longer waiting for its threads than computing."""
    return np.einsum("ij,jk->ik", a, b)


class TaskPopulation:
    def __init__(self, spec: LearningSpec) -> None:
        self.spec = spec
        self.shared_gain = spec.effect * np.sqrt(spec.shared)
        self.own_gain = spec.effect * np.sqrt(1.0 - spec.shared)
        rate = spec.base_rate
        self.mu = brentq(lambda m: mean_sigmoid(m, spec.spread) - rate, -60.0, 60.0, xtol=1e-12)

    def heldout_success(self, theta: np.ndarray) -> float:
        """Expected success of a task not trained on: its own direction is independent of
        ``theta``, so its logit is ``N(mu + shared part, spread^2 + own part's variance)``."""
        mean = self.mu + self.shared_gain * theta[0]
        var = self.spec.spread**2 + self.own_gain**2 * float(theta @ theta) / self.spec.dimension
        return mean_sigmoid(mean, np.sqrt(var))

    def rewards(
        self, points: np.ndarray, episodes: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        """Each row of ``points`` evaluated on one batch of tasks with common random numbers
        (the same tasks; the same uniform draw per episode, or with probability
        ``1 - coupling`` the row's own): row i on the first ``episodes[i]`` of them; its
        reward is the fraction that succeed."""
        spec = self.spec
        n_tasks = int(episodes.max())
        base = self.mu + spec.spread * rng.standard_normal(n_tasks)
        draws = rng.random(n_tasks)
        # The rows' projections on the tasks' own directions V (tasks x dimension, iid
        # N(0, 1/dimension)), jointly exact without drawing V: for any L with
        # L L^T = points points^T, L @ N(0, 1/dimension) has the law of points @ V^T.
        values, vectors = np.linalg.eigh(_dot(points, points.T))
        root = vectors * np.sqrt(np.clip(values, 0.0, None))
        own = _dot(root, rng.standard_normal((root.shape[1], n_tasks))) / np.sqrt(spec.dimension)
        logits = base + self.shared_gain * points[:, :1] + self.own_gain * own
        if spec.coupling < 1.0:  # some episodes leave the shared draw
            apart = rng.random(logits.shape) >= spec.coupling
            draws = np.where(apart, rng.random(logits.shape), draws)
        success = draws < expit(logits)
        mask = np.arange(n_tasks) < episodes[:, None]
        return (success & mask).sum(axis=1) / episodes
