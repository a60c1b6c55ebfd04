"""The cohort rule on the queue pipeline's loop: an ES policy forms the batches, so an ES
scenario written in this pipeline reproduces the cohort engine exactly."""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from staleness_sim.core.driver import PolicyDriver, cancel_reason
from staleness_sim.core.policies import Start, make_policy
from staleness_sim.core.trace import (
    Trace,
    TraceRecorder,
)
from staleness_sim.durations import make_duration, make_job
from staleness_sim.queue.config import QueueScenario
from staleness_sim.queue.parts import (
    BUSY,
    EXTRA_JOB_COLUMNS,
    IDLE,
    INF,
    SYNCING,
    SampleDurations,
    SlotStates,
    StepDurations,
    trace_meta,
)

# -- the cohort rule: an ES policy forms the batches ------------------------------------

_LAND, _BEGIN = 0, 1


class CohortRun:
    """The cohort engine's semantics on this pipeline's loop: the policy admits jobs, judges
    each landing result and closes cohorts of B; the trainer applies them in order, each
    taking a step time; a job dispatched at version v starts when v's weights are available
    plus ``sync_seconds`` per version its slot missed."""

    def __init__(self, sc: QueueScenario) -> None:
        self.sc = sc
        self.job = make_job(sc.rollout.job_spec())
        self.step_model = make_duration(sc.trainer.step)
        self.durations = SampleDurations(self.job, sc.seed)
        self.steps = StepDurations(self.step_model, sc.seed)

    def run(self) -> Trace:
        sc = self.sc
        C = sc.rollout.concurrency
        self.policy = make_policy(sc.queue.policy, sc.trainer.batch, sc.queue.drain_every)
        self.rec = TraceRecorder(EXTRA_JOB_COLUMNS)
        self.driver = PolicyDriver(self.policy, self.rec)
        self.available = [0.0]  # version -> when its weights are available
        self.heap: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind, job, slot)
        self.seq = 0
        self.idle: deque[int] = deque()
        self.synced = [0] * C
        self.slots = SlotStates(C, merge=False)
        self.running: dict[int, int] = {}  # job -> slot, generating
        self.interrupted: set[int] = set()  # landing events to ignore
        self.cancel_pending: dict[int, str] = {}  # cancelled while their slot was syncing
        self.finished = False
        self.end, self.end_seq = INF, -1
        for slot in range(C):
            self.idle.append(slot)
            self._pump(0.0)
        while self.heap:
            t, seq, kind, job, slot = self.heap[0]
            if self.finished and (t > self.end or (t == self.end and seq > self.end_seq)):
                break
            heapq.heappop(self.heap)
            if kind == _BEGIN:
                self._begun(job, slot, t)
            elif job not in self.interrupted:
                self._landed(job, slot, t)
        if not self.finished:
            raise RuntimeError("queue pipeline stalled: the policy never completed a cohort")
        self.slots.close(self.end)
        for job in self.running:
            self.driver.stopped(job, "run ended", end_time=self.end)
        meta = trace_meta(self.sc, self.job, self.step_model, self.end)
        trace = self.rec.trace(meta)
        trace.workers = self.slots.frame()
        jobs = trace.jobs
        jobs["group"] = jobs["group"].astype(np.int64)
        for c in ("group_end_time", "take_time"):
            jobs[c] = jobs[c].astype("float64")
        jobs["generated"] = jobs["generated"].astype("boolean").fillna(False).astype(bool)
        return trace

    def _push(self, t: float, kind: int, job: int, slot: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, job, slot))

    def _pump(self, now: float) -> None:
        while self.idle and not self.finished:
            decision = self.driver.idle(self.idle[0], now)
            if not isinstance(decision, Start):
                return
            self._dispatch(self.idle.popleft(), decision, now)

    def _dispatch(self, slot: int, start: Start, now: float) -> None:
        job, version = start.job_id, start.version
        self.rec.set_job(job, group=job)
        ready = max(now, self.available[version]) + self.sc.rollout.sync_seconds * (
            version - self.synced[slot]
        )
        self.synced[slot] = version
        if ready > now:
            self.slots.set(slot, SYNCING, now)
            self._push(now + (ready - now), _BEGIN, job, slot)
        else:
            self._begun(job, slot, now)

    def _begun(self, job: int, slot: int, now: float) -> None:
        if job in self.cancel_pending:  # cancelled while its slot was syncing
            self.driver.stopped(job, self.cancel_pending.pop(job), end_time=now)
            self._to_idle(slot, now)
            return
        self.slots.set(slot, BUSY, now)
        self.rec.set_job(job, start_time=now)
        self.running[job] = slot
        values = self.durations.values
        while job >= len(values):
            self.durations.extend()
        self._push(now + values[job], _LAND, job, slot)

    def _to_idle(self, slot: int, now: float) -> None:
        self.slots.set(slot, IDLE, now)
        if not self.finished:
            self.idle.append(slot)
            self._pump(now)

    def _landed(self, job: int, slot: int, now: float) -> None:
        del self.running[job]
        self.rec.set_job(job, end_time=now, generated=True, group_end_time=now)
        if self.finished:
            self.driver.stopped(job, "landed after the last update")
            self.slots.set(slot, IDLE, now)
            return
        self.driver.land(job)
        stopped: list[int] = []
        while self.driver.ready() and not self.finished:
            stopped += self._commit(self.driver.commit(), now)
        self._to_idle(slot, now)
        for other in stopped:  # slots of cancelled jobs, in the order they were stopped
            self._to_idle(other, now)

    def _commit(self, cohort, now: float) -> list[int]:
        applied = max(now, self.available[cohort.version - 1]) + self.steps.next()
        self.available.append(applied)
        self.driver.record_commit(cohort, time=applied, commit_time=now, job_row={"take_time": now})
        stopped = []
        for job in cohort.cancel:
            why = cancel_reason(cohort.version)
            self.driver.cancel(job, why)
            if job in self.running:  # it stops now
                self.rec.set_job(job, end_time=now)
                self.interrupted.add(job)
                stopped.append(self.running.pop(job))
            else:  # it stops once its slot has synced
                self.cancel_pending[job] = why
        if cohort.version >= self.sc.updates:
            self.finished = True
            self.end = now + (applied - now)
            self.end_seq = self.seq
        return stopped
