"""Fitness shaping: rewards of the accepted cohort -> per-result weights Z_i (float64)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

ZSCORE_EPS = 1e-8


def zscore(rewards: Sequence[float]) -> np.ndarray:
    """Z_i = (R_i - mean) / (std + 1e-8), population std (ddof=0), as published."""
    r = np.asarray(rewards, dtype=np.float64)
    return (r - r.mean()) / (r.std() + ZSCORE_EPS)


def centered_rank(rewards: Sequence[float]) -> np.ndarray:
    """Ranks mapped linearly onto [-0.5, 0.5]; ties share their average rank."""
    r = np.asarray(rewards, dtype=np.float64)
    n = r.size
    if n == 1:
        return np.zeros(1)
    order = np.argsort(r, kind="stable")
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.arange(n, dtype=np.float64)
    # Average the ranks of tied rewards so that equal rewards get equal weights.
    _, inverse, counts = np.unique(r, return_inverse=True, return_counts=True)
    sums = np.zeros(counts.size)
    np.add.at(sums, inverse, ranks)
    ranks = sums[inverse] / counts[inverse]
    return ranks / (n - 1) - 0.5


def raw(rewards: Sequence[float]) -> np.ndarray:
    """The rewards unchanged."""
    return np.asarray(rewards, dtype=np.float64).copy()


SHAPINGS: dict[str, Callable[[Sequence[float]], np.ndarray]] = {
    "zscore": zscore,
    "centered_rank": centered_rank,
    "raw": raw,
}


def get_shaping(name: str) -> Callable[[Sequence[float]], np.ndarray]:
    try:
        return SHAPINGS[name]
    except (KeyError, TypeError):
        raise ValueError(f"shaping must be one of {sorted(SHAPINGS)}, got {name!r}") from None
