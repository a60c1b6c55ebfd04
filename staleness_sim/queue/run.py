"""A run of a queue rule (``block``, ``drop_oldest``, ``max_staleness``): the rule, the
event loop or, when nothing makes a producer wait, the vectorised rollout, and the trace.
Conventions: ``staleness_sim.queue.engine``."""

from __future__ import annotations

import numpy as np
import pandas as pd

from staleness_sim.core.trace import JOB_COLUMNS, UPDATE_COLUMNS, Trace
from staleness_sim.durations import make_duration, make_job
from staleness_sim.queue.config import QueueScenario
from staleness_sim.queue.groups import GroupQueue, producers_never_wait
from staleness_sim.queue.loop import EventLoop
from staleness_sim.queue.parts import (
    DROPPED_FULL,
    DROPPED_STALE,
    EXTRA_JOB_COLUMNS,
    GENERATING,
    HELD,
    QUEUED,
    TAKEN,
    VERDICT_CODES,
    StepDurations,
    trace_meta,
)
from staleness_sim.queue.rules import QUEUE_FULL, make_rule, too_old
from staleness_sim.queue.slots import Samples, SlotDurations, slot_intervals
from staleness_sim.queue.vectorised import FreeRollout


class QueueRun:
    def __init__(self, sc: QueueScenario, vectorised: bool = True) -> None:
        self.sc = sc
        self.vectorised = vectorised  # False: always the event loop (tests compare the two)
        self.job = make_job(sc.rollout.job_spec())
        self.step_model = make_duration(sc.trainer.step)
        self.durations = SlotDurations(self.job, sc.seed, sc.rollout.concurrency)
        self.steps = StepDurations(self.step_model, sc.seed)

    def run(self) -> Trace:
        rule = make_rule(self.sc)
        free = self.vectorised and producers_never_wait(self.sc, rule)
        path = (FreeRollout if free else EventLoop)(self.sc, rule, self.durations, self.steps)
        samples = path.run()
        return queue_trace(path, self.job, self.step_model, samples)


def queue_trace(q: GroupQueue, job, step_model, samples: Samples) -> Trace:
    """The trace of a queue-rule run: the samples as jobs (a group's fate is its samples'),
    the trainer's steps as updates, the slots' intervals as workers."""
    n, slot, v0, v1, tdisp, t0, dur = samples
    end, S = q.end, q.S
    ids = np.arange(n, dtype=np.int64)
    landed = v1 >= 0
    started = ~np.isnan(t0)
    end_time = np.where(landed, t0 + dur, np.where(started, end, np.nan))
    g = ids // S
    g_state = np.asarray(q.g_state, dtype=np.int8)[g]
    g_v = np.asarray(q.g_v, dtype=np.int64)[g]
    used = v1 if q.in_flight else v0
    accepted = g_state == TAKEN
    dropped = (g_state == DROPPED_FULL) | (g_state == DROPPED_STALE)
    keep = accepted | dropped
    lag = np.where(keep, g_v - used, 0)
    reason = np.zeros(n, dtype=np.int8)
    for code, mask in (
        (1, accepted),
        (2, g_state == DROPPED_FULL),
        (3, g_state == DROPPED_STALE),
        (4, landed & ((g_state == QUEUED) | (g_state == HELD))),
        (5, landed & (g_state == GENERATING)),
        (6, ~started),
    ):
        reason[mask] = code
    verdict = np.where(accepted, 1, np.where(dropped, 2, 0)).astype(np.int8)
    jobs = pd.DataFrame(
        {
            "job_id": ids,
            "worker": slot,
            "seed": ids,
            "dispatch_version": v0,
            "dispatch_time": tdisp,
            "start_time": t0,
            "end_time": end_time,
            "completion_version": pd.arrays.IntegerArray(np.where(landed, v1, 0), ~landed),
            "verdict": pd.Categorical.from_codes(verdict, categories=list(VERDICT_CODES)),
            "lag": pd.arrays.IntegerArray(lag.astype(np.int64), ~keep),
            "reward": np.full(n, np.nan),
            "reason": pd.Categorical.from_codes(reason, categories=_reasons(q.sc)),
            "group": g,
            "group_end_time": np.asarray(q.g_end, dtype=np.float64)[g],
            "take_time": np.asarray(q.g_take, dtype=np.float64)[g],
            "generated": landed,
        },
        columns=list(JOB_COLUMNS + EXTRA_JOB_COLUMNS),
    )
    updates = _updates(q, g_v[accepted], (g_v - used)[accepted])
    meta = trace_meta(q.sc, job, step_model, end, samples_started=n)
    workers = slot_intervals(q.sc.rollout.concurrency, end, slot, tdisp, t0, end_time)
    return Trace(jobs, updates, workers, meta)


def _reasons(sc: QueueScenario) -> list[str]:
    """The samples' reasons, by code (see queue_trace)."""
    return [
        "run ended",
        "taken by the trainer",
        QUEUE_FULL.reason,
        too_old(sc.queue.max_staleness).reason,
        "in the queue when the run ended",
        "group incomplete when the run ended",
        "never finished",
    ]


def _updates(q: GroupQueue, take_v: np.ndarray, lags: np.ndarray) -> pd.DataFrame:
    steps = len(q.u_time)
    size = np.bincount(take_v, minlength=steps)[:steps]
    total = np.bincount(take_v, weights=lags, minlength=steps)[:steps]
    biggest = np.full(steps, -1, dtype=np.int64)
    order = np.lexsort((lags, take_v))  # the last of each step's run holds its largest lag
    if len(order):
        last = np.r_[take_v[order][1:] != take_v[order][:-1], True]
        biggest[take_v[order][last]] = lags[order][last]
    return pd.DataFrame(
        {
            "version": np.arange(1, steps + 1, dtype=np.int64),
            "time": np.asarray(q.u_time, dtype=np.float64),
            "commit_time": np.asarray(q.u_commit[:steps], dtype=np.float64),
            "cohort_size": size.astype(np.int64),
            "mean_lag": total / np.maximum(size, 1),
            "max_lag": biggest,
        },
        columns=list(UPDATE_COLUMNS),
    )
