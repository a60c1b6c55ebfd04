"""The queue pipeline's metrics, computed from its trace alone (the keys ``run --json`` adds
for ``pipeline: queue``, after the cohort engine's own keys, which keep their meaning:
jobs are samples, updates are trainer steps, workers are rollout slots).

* ``mean_staleness``, ``staleness_hist``: staleness of the samples the trainer used (the
  trainer's version when it took the batch minus the version the sample generated under).
* ``rho``: measured rollout throughput over trainer throughput, both while busy:
  (C / mean generated duration) / (B / mean step time); null if steps took no time.
* ``m_tail``: mean over finished groups of their slowest sample's duration, over the mean
  duration of those samples (E[max of S] / E[length]).
* ``trainer_idle_fraction``: share of the run the trainer was not in a step.
* ``rollout_idle_fraction``: share of slot time not generating (idle or syncing weights).
* ``samples_dropped``: samples thrown away (queue overflow or too old).
* ``mean_generated_duration``: mean duration of every sample that finished generating;
  ``mean_consumed_duration``: of the samples the trainer used.
* ``closed_form_staleness``: the published queue-drop closed form at the measured rho and
  m_tail and the scenario's C, B and q (see ``analytic.queue_drop_mean_staleness``), for
  comparison whatever the rule; null when it does not apply (an unbounded queue at rho > 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from staleness_sim.core.analytic import queue_drop_mean_staleness
from staleness_sim.core.metrics import lag_histogram, state_fractions, wall_clock
from staleness_sim.core.trace import Trace

QUEUE_KEYS = (
    "mean_staleness",
    "staleness_hist",
    "rho",
    "m_tail",
    "trainer_idle_fraction",
    "rollout_idle_fraction",
    "samples_dropped",
    "mean_generated_duration",
    "mean_consumed_duration",
)


def trainer_busy_seconds(trace: Trace) -> np.ndarray:
    """Seconds each update kept the trainer busy: from max(its commit, the previous update's
    availability) to its own availability (a commit waits while the trainer is busy)."""
    up = trace.updates.sort_values("version")
    time = up["time"].to_numpy(dtype=float)
    commit = up["commit_time"].to_numpy(dtype=float)
    previous = np.r_[0.0, time[:-1]]
    return time - np.maximum(commit, previous)


def queue_summary(trace: Trace) -> dict[str, Any]:
    jobs, meta = trace.jobs, trace.meta
    verdict = jobs["verdict"]
    used = (verdict == "accepted").to_numpy()
    generated = jobs["generated"].to_numpy(dtype=bool)
    duration = (jobs["end_time"] - jobs["start_time"]).to_numpy(dtype=float)
    lags = jobs.loc[used, "lag"].to_numpy(dtype=np.int64)
    wall = wall_clock(trace)
    busy = trainer_busy_seconds(trace)
    gen = duration[generated]
    mean_gen = float(gen.mean()) if len(gen) else float("nan")
    workers = int(meta.get("workers") or trace.workers["worker"].nunique())
    batch = float(trace.updates["cohort_size"].mean()) if len(trace.updates) else float("nan")
    mean_step = float(busy.mean()) if len(busy) else float("nan")
    rho = (workers / mean_gen) / (batch / mean_step) if mean_step > 0 and mean_gen > 0 else None
    m_tail = _m_tail(jobs["group"].to_numpy(), duration, generated)
    fractions = state_fractions(trace)
    out: dict[str, Any] = {
        "mean_staleness": float(lags.mean()) if len(lags) else 0.0,
        "staleness_hist": lag_histogram(jobs.loc[used, "lag"]),
        "rho": rho,
        "m_tail": m_tail,
        "trainer_idle_fraction": 1.0 - float(busy.sum()) / wall if wall > 0 else 0.0,
        "rollout_idle_fraction": fractions["idle"] + fractions["syncing"],
        "samples_dropped": int((verdict == "discarded").sum()),
        "mean_generated_duration": mean_gen,
        "mean_consumed_duration": float(duration[used].mean()) if used.any() else float("nan"),
        # beyond the contract
        "samples_generated": int(generated.sum()),
        "mean_queue_wait_s": _mean_wait(jobs, used),
        "mean_step_seconds": mean_step,
        "closed_form_staleness": _closed_form(meta, rho, m_tail, workers, batch),
    }
    return out


def _m_tail(group: np.ndarray, duration: np.ndarray, generated: np.ndarray) -> float:
    """E[max of a group] / E[length] over groups whose samples all finished generating."""
    if not len(group):
        return float("nan")
    size = np.bincount(group)
    finished = np.bincount(group, weights=generated.astype(float)) == size
    keep = finished[group]
    if not keep.any():
        return float("nan")
    g, d = group[keep], duration[keep]
    slowest = np.full(len(size), -np.inf)
    np.maximum.at(slowest, g, d)
    return float(slowest[finished].mean() / d.mean())


def _mean_wait(jobs, used: np.ndarray) -> float:
    if not used.any():
        return float("nan")
    wait = jobs["take_time"].to_numpy(dtype=float) - jobs["group_end_time"].to_numpy(dtype=float)
    return float(wait[used].mean())


def _closed_form(meta, rho, m_tail, workers, batch) -> float | None:
    if rho is None or not np.isfinite(m_tail):
        return None
    capacity = meta.get("capacity_samples")
    q = capacity / batch if capacity is not None else None
    value = queue_drop_mean_staleness(rho, workers, batch, m_tail, q)
    return float(value) if np.isfinite(value) else None
