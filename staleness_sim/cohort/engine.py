"""The SimPy engine: G workers driven by a scheduling policy until ``updates`` commits.

Everything with feedback (who starts when, at which version, what happens to a result) is
a SimPy process obeying the policy; everything without feedback (episode durations, job
makespans) is sampled vectorised up front, in blocks, in job-id order.

Conventions for simultaneous events (tested in ``tests/sim/test_engine.py``):

1. A landing result is judged, and any cohort it completes is committed, *before* its
   worker asks for its next job. So the worker that completes a cohort starts its next
   job at the new version (as in the published system: with G workers, at most G - 1
   results of a cohort are one update old).
2. Idle workers are served first come, first served; a worker that lands joins the back
   of the queue. Serving stops at the first ``Wait`` (admission never depends on the
   worker).
3. A job dispatched at version v starts when v's weights are available (the coordinator
   applies updates one after another, each taking ``update_seconds``) plus
   ``sync_seconds`` per update the worker has missed since its previous job; that time is
   recorded as ``syncing``.
4. The run ends when the last update's weights are available. Jobs still running then,
   and results landing while the last update is applied, are ``cancelled``.

Two opt-in keys model measured runs (unset, nothing changes): ``dispatch_seconds`` is
added to every job's wait before it starts (recorded as ``syncing``), and
``version_effect`` multiplies the duration of each job by a factor drawn once for each
group of jobs of one dispatch version that start together (from a stream of its own, so
job durations stay common random numbers). ``contention`` makes busy jobs share one
machine: with k busy, each progresses at min(1, capacity / k) of its solo speed, the
durations drawn being solo durations (processor sharing, rescheduled at every start,
finish and cancel).
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import simpy

from staleness_sim.cohort.config import Scenario
from staleness_sim.core.driver import PolicyDriver, cancel_reason
from staleness_sim.core.policies import Cohort, Start, make_policy
from staleness_sim.core.settings import scenario_dict
from staleness_sim.core.trace import Trace, TraceRecorder
from staleness_sim.durations import DirectJob, make_duration, make_job, stream_blocks


class DurationStream:
    """Job durations in job-id order, drawn in growing vectorised blocks from one generator.

    Job k gets the same duration whatever the policy, so policies compared on one seed
    see common random numbers.
    """

    def __init__(self, job, rng: np.random.Generator):
        self.job, self._rng = job, rng
        self._values = np.empty(0)
        self._block, self._max_block = stream_blocks(job)

    def __getitem__(self, job_id: int) -> float:
        while job_id >= len(self._values):
            self._values = np.concatenate([self._values, self.job.sample(self._rng, self._block)])
            self._block = min(2 * self._block, self._max_block)
        return float(self._values[job_id])


_STREAMS: OrderedDict[str, DurationStream] = OrderedDict()
_STREAM_CACHE_SIZE = 16


def duration_stream(scenario: Scenario, job=None) -> DurationStream:
    """The scenario's job durations; scenarios sharing a job model and seed share one stream
    (a sweep over workers or policies samples each workload once per process)."""
    if job is not None:  # a caller-supplied job model is not keyed by the config
        return DurationStream(job, np.random.default_rng(scenario.seed))
    key = json.dumps([scenario.job.model_dump(mode="json"), scenario.seed], sort_keys=True)
    stream = _STREAMS.pop(key, None)
    if stream is None:
        stream = DurationStream(make_job(scenario.job), np.random.default_rng(scenario.seed))
    _STREAMS[key] = stream
    while len(_STREAMS) > _STREAM_CACHE_SIZE:
        _STREAMS.popitem(last=False)
    return stream


@dataclass
class Counters:
    """The run's tallies (the driver's verdict counts, the engine's time in each state),
    counted as the run goes rather than read from the trace (a cross-check for metrics)."""

    accepted: int = 0
    discarded: int = 0
    deferred: int = 0
    cancelled: int = 0
    commits: int = 0
    busy_s: float = 0.0
    idle_s: float = 0.0
    syncing_s: float = 0.0


class Simulation:
    def __init__(
        self, scenario: Scenario, job=None, on_commit: Callable[[int], None] | None = None
    ):
        self.scenario = scenario
        self.durations = duration_stream(scenario, job)
        self.job = self.durations.job
        self.on_commit = on_commit
        self.counters = Counters()
        self._dispatch_s = scenario.dispatch_seconds or 0.0
        self._factors = None
        if scenario.version_effect is not None:  # its own stream: job draws are unchanged
            effect = scenario.version_effect
            self._factors = DurationStream(
                DirectJob(make_duration(effect.factor)), np.random.default_rng([scenario.seed, 1])
            )
            self._window = effect.window if effect.window is not None else float("inf")
        self._capacity = scenario.contention.capacity if scenario.contention else None

    def run(self) -> Trace:
        sc = self.scenario
        self.env = env = simpy.Environment()
        self.policy = make_policy(sc.policy, sc.cohort, sc.drain_every)
        self.rec = TraceRecorder()
        self.driver = PolicyDriver(self.policy, self.rec)
        self._queue: deque[tuple[int, simpy.Event]] = deque()
        self._available = {0: 0.0}  # version -> time its weights are available
        self._running: dict[int, simpy.Process] = {}
        self._cancelled: dict[int, str] = {}  # cancelled before they started running
        self._state = [("idle", 0.0)] * sc.workers
        self._time_in = dict.fromkeys(("busy", "idle", "syncing"), 0.0)
        self._finished = False
        self._groups: dict[int, tuple[float, int]] = {}  # version -> (opened at, group)
        self._n_groups = 0
        self._shared: dict[int, list] = {}  # contention: job -> [work left, done event]
        self._shared_at, self._shared_token = 0.0, 0
        self._done = env.event()
        for w in range(sc.workers):
            env.process(self._worker(w))
        env.run(until=self._done)
        return self._finish()

    # -- the worker process ------------------------------------------------------------
    def _worker(self, w: int):
        env, synced = self.env, 0
        while not self._finished:
            self._set_state(w, "idle")
            # Fast path: with nobody ahead in the queue, ask the policy directly instead of
            # through a ticket event (same decision, one SimPy step fewer per job).
            start = None if self._queue else self.driver.idle(w, env.now)
            if not isinstance(start, Start):
                ticket = env.event()
                self._queue.append((w, ticket))
                self._pump()
                start = yield ticket
            job, version = start.job_id, start.version
            ready = max(env.now, self._available[version]) + self.scenario.sync_seconds * (
                version - synced
            )
            if self._dispatch_s:
                ready += self._dispatch_s
            synced = version
            if ready > env.now:
                self._set_state(w, "syncing")
                yield env.timeout(ready - env.now)
            if job in self._cancelled:  # cancelled while the worker was still syncing
                self.driver.stopped(job, self._cancelled.pop(job), end_time=env.now)
                continue
            self._set_state(w, "busy")
            self.rec.set_job(job, start_time=env.now)
            self._running[job] = env.active_process
            try:
                duration = self.durations[job]
                if self._factors is not None:
                    duration *= self._factors[self._group(version)]
                if self._capacity is None:
                    yield env.timeout(duration)
                else:
                    yield self._share(job, duration)
            except simpy.Interrupt as stop:
                self.driver.stopped(job, str(stop.cause), end_time=env.now)
                continue
            finally:
                self._running.pop(job, None)
                if job in self._shared:  # cancelled while sharing the machine
                    self._unshare(job)
            self.rec.set_job(job, end_time=env.now)
            if self._finished:
                self.driver.stopped(job, "landed after the last update")
            else:
                self._land(job)
        self._set_state(w, "idle")  # the run is over for this worker: idle until the end

    # -- contention: processor sharing of one machine ------------------------------
    def _rate(self) -> float:
        k = len(self._shared)
        return min(1.0, self._capacity / k) if k else 1.0

    def _advance(self) -> None:
        """Take the work done since the last change off every busy job."""
        now = self.env.now
        done = (now - self._shared_at) * self._rate()
        if done > 0:
            for entry in self._shared.values():
                entry[0] -= done
        self._shared_at = now

    def _share(self, job: int, work: float) -> simpy.Event:
        self._advance()
        event = self.env.event()
        self._shared[job] = [work, event]
        self._reschedule()
        return event

    def _unshare(self, job: int) -> None:
        self._advance()
        del self._shared[job]
        self._reschedule()

    def _reschedule(self) -> None:
        """Arm a timer for the next job to finish at the current rate (older timers lapse)."""
        self._shared_token += 1
        if not self._shared:
            return
        left = min(entry[0] for entry in self._shared.values())
        timer = self.env.timeout(max(0.0, left) / self._rate())
        timer.callbacks.append(lambda _, token=self._shared_token: self._finish_shared(token))

    def _finish_shared(self, token: int) -> None:
        if token != self._shared_token:
            return
        self._advance()
        left = min(entry[0] for entry in self._shared.values())
        for job in [j for j, e in self._shared.items() if e[0] <= left + 1e-9]:
            self._shared.pop(job)[1].succeed()
        self._reschedule()

    def _group(self, version: int) -> int:
        """The factor group of a job of ``version`` starting now (version_effect)."""
        now = self.env.now
        group = self._groups.get(version)
        if group is None or now - group[0] >= self._window:
            group = self._groups[version] = (now, self._n_groups)
            self._n_groups += 1
        return group[1]

    def _pump(self) -> None:
        """Serve waiting workers in order until the policy says Wait."""
        while self._queue and not self._finished:
            # The driver records the dispatch when the policy decides, not when the worker's
            # process resumes: another worker may be handed a later job id in between.
            decision = self.driver.idle(self._queue[0][0], self.env.now)
            if not isinstance(decision, Start):
                return
            self._queue.popleft()[1].succeed(decision)

    def _land(self, job: int) -> None:
        self.driver.land(job)
        while self.driver.ready() and not self._finished:
            self._commit(self.driver.commit())

    def _commit(self, cohort: Cohort) -> None:
        now = self.env.now
        applied = max(now, self._available[cohort.version - 1]) + self.scenario.update_seconds
        self._available[cohort.version] = applied
        self.driver.record_commit(cohort, time=applied, commit_time=now)
        for job in cohort.cancel:
            why = cancel_reason(cohort.version)
            self.driver.cancel(job, why)
            if job in self._running:
                self._running[job].interrupt(why)
            else:
                self._cancelled[job] = why
        if self.on_commit is not None:
            self.on_commit(cohort.version)
        if cohort.version >= self.scenario.updates:
            self._finished = True
            self.env.process(self._end_at(applied))

    def _end_at(self, time: float):
        yield self.env.timeout(time - self.env.now)
        self._done.succeed()

    def _set_state(self, w: int, state: str) -> None:
        previous, since = self._state[w]
        self._close(w, previous, since, self.env.now)
        self._state[w] = (state, self.env.now)

    def _close(self, w: int, state: str, start: float, end: float) -> None:
        if end > start:
            self.rec.interval(w, state, start, end)
            self._time_in[state] += end - start

    def _finish(self) -> Trace:
        end = self.env.now
        for w, (state, since) in enumerate(self._state):
            self._close(w, state, since, end)
        for job in self._running:
            self.driver.stopped(job, "run ended", end_time=end)
        c = self.counters
        counts = self.driver.counts  # (nothing here is ever dropped: that is the runner's update)
        c.accepted, c.discarded, c.deferred, c.commits = (
            counts[k] for k in ("accepted", "discarded", "deferred", "commits")
        )
        c.cancelled = len(self.rec.jobs["job_id"]) - c.accepted - c.discarded - c.deferred
        c.busy_s, c.idle_s, c.syncing_s = (self._time_in[s] for s in ("busy", "idle", "syncing"))
        meta = {
            "source": "simulation",
            "workers": self.scenario.workers,
            "wall_clock_s": end,
            "scenario": scenario_dict(self.scenario),
            "job_model": self.job.describe(),
            "counters": asdict(self.counters),
        }
        return self.rec.trace(meta)


def simulate(scenario: Scenario, **kwargs) -> Trace:
    """Run one scenario and return its trace."""
    return Simulation(scenario, **kwargs).run()
