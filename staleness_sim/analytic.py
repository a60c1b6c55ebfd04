"""Closed forms: sanity anchors for tests and for users checking a simulation.

* Synchronous ES with at least as many workers as the cohort (G >= N): every version runs
  N jobs at once and waits for the slowest, so results per second are
  ``N / (E[max of N durations] + update_seconds + sync_seconds)``. For exponential
  durations E[max of N] = mean * H_N (the N-th harmonic number); in general
  E[max of N] = integral_0^inf 1 - F(x)^N dx.
* Uncapped asynchrony (no update or sync time, nothing discarded): each worker is a renewal
  process, so results per second are ``G / E[D]``.
* Mean lag of uncapped asynchrony: every commit happens when one result lands; at that
  moment the other G - 1 jobs are in flight and each gains one unit of lag, and the cohort
  holds N results. So the mean lag is ``(G - 1) / N`` when the completing worker starts its
  next job after the commit (this simulator's convention, as published), and ``G / N``
  when it starts before. This holds for any duration distribution.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate


def harmonic(n: int) -> float:
    return math.fsum(1.0 / k for k in range(1, n + 1))


def expected_max(model, n: int) -> float:
    """E[max of n iid draws] of a duration model with a ``cdf`` (and optional ``cap``)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")

    def tail(x: float) -> float:
        return 1.0 - float(np.asarray(model.cdf(np.asarray([x])))[0]) ** n

    upper = getattr(model, "cap", None) or np.inf
    value, _ = integrate.quad(tail, 0.0, upper, limit=200)
    return value


def expected_max_exponential(mean: float, n: int) -> float:
    return mean * harmonic(n)


def sync_results_per_second(
    expected_max_duration: float,
    cohort: int,
    update_seconds: float = 0.0,
    sync_seconds: float = 0.0,
) -> float:
    """Synchronous throughput for G >= N: one round = slowest of N jobs + update + sync."""
    return cohort / (expected_max_duration + update_seconds + sync_seconds)


def async_results_per_second(mean_duration: float, workers: int) -> float:
    """Uncapped asynchronous throughput: G renewal processes."""
    return workers / mean_duration


def async_mean_lag(workers: int, cohort: int, dispatch_after_commit: bool = True) -> float:
    """Mean lag of accepted results under uncapped asynchrony (see the module docstring)."""
    return (workers - 1 if dispatch_after_commit else workers) / cohort
