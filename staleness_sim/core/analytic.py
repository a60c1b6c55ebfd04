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
* The queue pipeline: M_tail of a duration model and group size, and the published
  queue-drop closed form for mean staleness (derivation and assumptions below).
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


def async_mean_lag(workers: int, cohort: int, dispatch_after_commit: bool = True) -> float:
    """Mean lag of accepted results under uncapped asynchrony (see the module docstring)."""
    return (workers - 1 if dispatch_after_commit else workers) / cohort


# -- the queue pipeline (pipeline: queue) ------------------------------------------------
#
# Mean staleness of queue-drop asynchronous RL (the published closed form: Applied Compute,
# "Predicting and Controlling Staleness in Fully Asynchronous RL Training", 2026; our
# transcription, second-hand). C samples in flight, groups of S, batches of B samples, a
# queue of q * B samples that drops its oldest group on overflow, the trainer taking the
# oldest B; rho = rollout throughput / trainer throughput = C * E[step] / (B * E[length]):
#
#   rho < 1:  C * M_tail / B + rho
#   rho > 1:  C * M_tail / (rho * B) + (2q + rho - 1) / (2 rho)
#
# with M_tail = E[max of the S lengths of a group] / E[length]. Our derivation, which shows
# the assumptions: a sample's staleness is the number of steps that end between its start
# and the take of its batch. Its group is done M_tail * E[length] after it starts (its
# members start together). rho < 1 (rollout-bound): steps are taken every
# P = B E[length] / C, the trainer is idle when a batch fills (no queueing), so the takes
# during generation number M_tail E[length] / P = C M_tail / B, plus the step already in
# progress when the sample starts (probability = the trainer's utilisation, rho). rho > 1
# (trainer-bound): the trainer is never idle and the queue is full at every take, so the
# taken B are the oldest of the last q B arrivals, which waited (q - 1/2) B / arrival rate
# = (q - 1/2) E[step] / rho; steps ending during generation and wait number
# (C M_tail / (rho B) + (q - 1/2) / rho) plus 1/2 on average (a start falls uniformly
# within a step). Uniform phase between starts and steps is assumed throughout: constant
# lengths and constant steps lock the phase and break it.


def m_tail(model, group_size: int) -> float:
    """M_tail = E[max of group_size lengths] / E[length] for a duration model (with a cdf)."""
    mean = model.mean()
    if not np.isfinite(mean) or mean <= 0:
        return math.inf
    return expected_max(model, group_size) / mean


def queue_rho(concurrency: int, batch: int, mean_length: float, mean_step: float) -> float:
    """Rollout throughput C / E[length] over trainer throughput B / E[step]."""
    return (concurrency / mean_length) / (batch / mean_step)


def queue_drop_mean_staleness(
    rho: float, concurrency: int, batch: int, m_tail: float, capacity: float | None
) -> float:
    """The published queue-drop closed form (see above); ``capacity`` is q, in batches
    (None: unbounded, so staleness grows without bound when rho > 1)."""
    if rho <= 0:
        raise ValueError(f"rho must be > 0, got {rho}")
    c_over_b = concurrency / batch
    if rho < 1:
        return c_over_b * m_tail + rho
    if capacity is None:
        return math.inf
    return c_over_b * m_tail / rho + (2 * capacity + rho - 1) / (2 * rho)
