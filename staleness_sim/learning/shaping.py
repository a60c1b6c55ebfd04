"""Fitness shaping and the update's coefficients, the runner's arithmetic in numpy.

``runner.es`` may not be imported here (the simulator installs without the runner); the
rule is small, so it is written again and ``tests/sim/test_learning_rule.py`` proves the
coefficients equal ``runner.es.UpdateRule``'s on the same rewards, seeds and shaping.
"""

from __future__ import annotations

import numpy as np

ZSCORE_EPS = 1e-8


def shape(rewards: np.ndarray, shaping: str) -> np.ndarray:
    """Per-result weights Z_i: ``zscore`` (population std + 1e-8), ``centered_rank``
    (ranks on [-0.5, 0.5], ties averaged) or ``raw``."""
    r = np.asarray(rewards, dtype=np.float64)
    if shaping == "zscore":
        return (r - r.mean()) / (r.std() + ZSCORE_EPS)
    if shaping == "centered_rank":
        if r.size == 1:
            return np.zeros(1)
        _, inverse, counts = np.unique(r, return_inverse=True, return_counts=True)
        # average rank of each distinct value: ranks below it plus the middle of its ties
        below = np.concatenate(([0], np.cumsum(counts)[:-1]))
        mean_rank = below + (counts - 1) / 2.0
        return mean_rank[inverse] / (r.size - 1) - 0.5
    if shaping == "raw":
        return r.copy()
    raise ValueError(f"shaping must be one of zscore, centered_rank, raw, got {shaping!r}")


def coefficients(
    rewards: np.ndarray, signs: np.ndarray, weights: np.ndarray, alpha: float, shaping: str
) -> np.ndarray:
    """``alpha / N * weight * sign * Z_i`` over the N results an update uses."""
    z = shape(rewards, shaping)
    return alpha / len(z) * np.asarray(weights, float) * np.asarray(signs, float) * z
