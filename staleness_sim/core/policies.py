"""Scheduling policies: small, pure state machines shared by the simulator and the real runner.

A policy owns the logical clock of training, the *version* (number of committed updates),
and decides four things, each with a reason that ends up in the trace:

* ``on_idle(worker)``: may an idle worker start a job now, and at which version?
  Returns :class:`Start` (the policy assigns the job id) or :class:`Wait`.
* ``on_result(job_id)``: what happens to a finished result: :class:`Accept` into the current
  cohort, :class:`Discard` as too stale, or :class:`Defer` to a later version.
* ``ready()``: is the cohort complete?
* ``commit()``: close the cohort, advance the version, and return a :class:`Cohort`
  (which may name in-flight jobs to cancel).

No clock, no SimPy, no asyncio, no I/O: the SimPy engine (simulated time) and the runner's
orchestrator (wall-clock time) feed the same events in the same order and obey the same
decisions, so a simulated and a real run of one policy differ only in where durations
come from. Decisions never depend on the worker's identity, so a driver may serve idle
workers in any order and stop at the first ``Wait`` (admission is monotone).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Start:
    job_id: int
    version: int
    reason: str = "dispatch"


@dataclass(frozen=True, slots=True)
class Wait:
    reason: str


@dataclass(frozen=True, slots=True)
class Accept:
    lag: int
    reason: str


@dataclass(frozen=True, slots=True)
class Discard:
    lag: int
    reason: str


@dataclass(frozen=True, slots=True)
class Defer:
    lag: int
    until_version: int
    reason: str


Decision = Start | Wait
Verdict = Accept | Discard | Defer


@dataclass(frozen=True, slots=True)
class Cohort:
    """One committed update: ``version`` is the version the update produces."""

    version: int
    job_ids: tuple[int, ...]
    lags: tuple[int, ...]
    cancel: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return len(self.job_ids)


class Policy:
    """Bookkeeping shared by every policy; subclasses override the three hooks."""

    kind = "base"

    def __init__(self, cohort: int) -> None:
        if cohort < 1:
            raise ValueError(f"cohort must be >= 1, got {cohort}")
        self.cohort_size = cohort
        self.version = 0
        self._next_job = 0
        self._in_flight: dict[int, int] = {}  # job id -> dispatch version, in dispatch order
        self._members: list[tuple[int, int]] = []  # (job id, lag) of the open cohort

    # -- state a driver may read -------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def results_pending(self) -> int:
        """Results that must still land before the open cohort can commit."""
        return self._needed() - len(self._members)

    def dispatch_version(self, job_id: int) -> int:
        return self._in_flight[job_id]

    # -- the four decisions ------------------------------------------------------------
    def on_idle(self, worker: int) -> Decision:
        blocked = self._admission()
        if blocked is not None:
            return Wait(blocked)
        job_id = self._next_job
        self._next_job += 1
        self._in_flight[job_id] = self.version
        self._started(job_id)
        return Start(job_id, self.version)

    def on_result(self, job_id: int) -> Verdict:
        try:
            dispatched = self._in_flight.pop(job_id)
        except KeyError:
            raise KeyError(f"job {job_id} is not in flight") from None
        verdict = self._judge(job_id, self.version - dispatched)
        if isinstance(verdict, Accept):
            self._members.append((job_id, verdict.lag))
        return verdict

    def ready(self) -> bool:
        return len(self._members) >= self._needed()

    def commit(self) -> Cohort:
        if not self.ready():
            raise RuntimeError(
                f"cohort incomplete: {len(self._members)} of {self._needed()} results"
            )
        job_ids = tuple(j for j, _ in self._members)
        lags = tuple(lag for _, lag in self._members)
        self.version += 1
        self._members = []
        cancel = self._advanced()
        return Cohort(self.version, job_ids, lags, cancel)

    def on_cancel(self, job_id: int) -> None:
        """The driver stopped an in-flight job (asked for by ``Cohort.cancel``, or because
        the worker running it crashed or the run was interrupted)."""
        dispatched = self._in_flight.pop(job_id, None)
        if dispatched is not None:
            self._cancelled(job_id, dispatched)

    # -- hooks -------------------------------------------------------------------------
    def _admission(self) -> str | None:
        """None if a job may start now, else the reason to wait."""
        return None

    def _started(self, job_id: int) -> None:
        """Called after a job is admitted."""

    def _judge(self, job_id: int, lag: int) -> Verdict:
        return Accept(lag, "fresh" if lag == 0 else f"lag {lag}")

    def _needed(self) -> int:
        return self.cohort_size

    def _advanced(self) -> tuple[int, ...]:
        """Called after the version advanced; returns in-flight jobs to cancel."""
        return ()

    def _cancelled(self, job_id: int, dispatch_version: int) -> None:
        """Called after an in-flight job was cancelled."""


class Unbounded(Policy):
    """Dispatch continuously, accept every result whatever its lag."""

    kind = "unbounded"


class Synchronous(Policy):
    """Exactly ``quota`` jobs per version, then a barrier until the update commits."""

    kind = "sync"

    def __init__(self, cohort: int) -> None:
        super().__init__(cohort)
        self._dispatched_this_version = 0

    def _quota(self) -> int:
        return self.cohort_size

    def _admission(self) -> str | None:
        if self._dispatched_this_version >= self._quota():
            return f"barrier: all {self._quota()} jobs of version {self.version} dispatched"
        return None

    def _started(self, job_id: int) -> None:
        self._dispatched_this_version += 1

    def _cancelled(self, job_id: int, dispatch_version: int) -> None:
        # A job of this version that will never land frees its place behind the barrier,
        # so a replacement is dispatched (else the cohort could never fill).
        if dispatch_version == self.version:
            self._dispatched_this_version -= 1

    def _advanced(self) -> tuple[int, ...]:
        self._dispatched_this_version = 0
        return ()


class ControlledDelay(Synchronous):
    """The published Async-4/8 ablation: cohorts of fresh results plus results held back
    by exactly ``delay`` updates.

    Each version dispatches a barrier-synchronised batch so that every result is fresh;
    the first ``n_delayed`` results of version v are deferred to version v + delay, the
    rest fill the cohort. After warm-up a cohort holds ``round(N * (1 - fraction))`` fresh
    results and ``n_delayed`` results of lag exactly ``delay``; during the first ``delay``
    updates nothing has matured yet, so cohorts are all fresh (and each of those versions
    runs ``n_delayed`` extra jobs to feed later cohorts).
    """

    kind = "controlled_delay"

    def __init__(self, cohort: int, fraction: float, delay: int) -> None:
        super().__init__(cohort)
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"fraction must be in [0, 1), got {fraction}")
        if delay < 1:
            raise ValueError(f"delay must be >= 1, got {delay}")
        n_fresh = round(cohort * (1.0 - fraction))
        if n_fresh < 1:
            raise ValueError(f"fraction {fraction} leaves no fresh result in a cohort of {cohort}")
        self.delay = delay
        self.n_delayed = cohort - n_fresh
        self._deferred: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self._deferred_this_version = 0

    def _fresh_needed(self) -> int:
        matured = self.n_delayed if self.version >= self.delay else 0
        return self.cohort_size - matured

    def _quota(self) -> int:
        return self._fresh_needed() + self.n_delayed

    def _judge(self, job_id: int, lag: int) -> Verdict:
        if lag != 0:  # cannot happen behind the barrier; kept as a guard for drivers
            return Discard(lag, "not fresh")
        if self._deferred_this_version < self.n_delayed:
            self._deferred_this_version += 1
            until = self.version + self.delay
            self._deferred[until].append((job_id, self.version))
            return Defer(0, until, f"held back {self.delay} updates")
        return Accept(0, "fresh")

    def _advanced(self) -> tuple[int, ...]:
        super()._advanced()
        self._deferred_this_version = 0
        for job_id, dispatched in self._deferred.pop(self.version, []):
            self._members.append((job_id, self.version - dispatched))
        return ()

    def _needed(self) -> int:
        return self.cohort_size

    @property
    def results_pending(self) -> int:
        # results of this version still to be held back land before the cohort fills
        return super().results_pending + self.n_delayed - self._deferred_this_version

    @property
    def held(self) -> int:
        """Results deferred and not yet released into a cohort."""
        return sum(len(v) for v in self._deferred.values())


class BoundedStaleness(Policy):
    """Continuous dispatch with a bound ``max_lag`` on the lag of accepted results.

    ``on_stale``:

    * ``drop`` (published): every job starts at once; a result whose lag exceeds the bound
      is discarded when it lands.
    * ``cancel``: as ``drop``, but a job is cancelled at the commit that dooms it, so its
      worker stops wasting time on it.
    * ``pace``: admission control, no result is ever discarded. A job may start only if no
      in-flight job could exceed the bound: with ``o`` the oldest in-flight dispatch
      version, ``v`` the version, ``m`` the open cohort's results and ``f`` the jobs in
      flight, the commit that would make that job too stale needs
      ``R = (o + max_lag + 1 - v) * N - m`` more results, so a start is allowed only while
      ``f < R``: even if every other job landed first, they could not complete it.
    """

    kind = "bounded"
    ON_STALE = ("drop", "pace", "cancel")

    def __init__(self, cohort: int, max_lag: int, on_stale: str = "drop") -> None:
        super().__init__(cohort)
        if max_lag < 0:
            raise ValueError(f"max_lag must be >= 0, got {max_lag}")
        if on_stale not in self.ON_STALE:
            raise ValueError(
                f"on_stale must be one of {', '.join(self.ON_STALE)}, got {on_stale!r}"
            )
        self.max_lag = max_lag
        self.on_stale = on_stale

    def _admission(self) -> str | None:
        if self.on_stale != "pace" or not self._in_flight:
            return None
        oldest = next(iter(self._in_flight.values()))  # dicts keep dispatch order
        room = (oldest + self.max_lag + 1 - self.version) * self.cohort_size - len(self._members)
        if len(self._in_flight) >= room:
            return f"pace: a job dispatched at version {oldest} could exceed max_lag {self.max_lag}"
        return None

    def _judge(self, job_id: int, lag: int) -> Verdict:
        if lag > self.max_lag:
            return Discard(lag, f"lag {lag} > max_lag {self.max_lag}")
        return Accept(lag, "fresh" if lag == 0 else f"lag {lag} <= max_lag {self.max_lag}")

    def _advanced(self) -> tuple[int, ...]:
        if self.on_stale != "cancel":
            return ()
        oldest_ok = self.version - self.max_lag
        return tuple(j for j, d in self._in_flight.items() if d < oldest_ok)


class Draining:
    """Every ``every`` updates, drain before committing (the published run's checkpoints).

    While building a cohort whose version is a multiple of ``every``, no job starts once
    the jobs in flight could complete the cohort; the cohort then commits with nothing in
    flight, so the checkpoint is quiescent and the next cohort is all fresh. Results that
    are discarded on landing reopen dispatch, so draining never deadlocks.
    """

    def __init__(self, inner: Policy, every: int) -> None:
        if every < 1:
            raise ValueError(f"drain_every must be >= 1, got {every}")
        self.inner = inner
        self.every = every
        self.kind = inner.kind

    def __getattr__(self, name: str):  # read-only state (version, in_flight, ...)
        return getattr(self.inner, name)

    def on_idle(self, worker: int) -> Decision:
        upcoming = self.inner.version + 1
        if upcoming % self.every == 0 and self.inner.in_flight >= self.inner.results_pending:
            return Wait(f"draining before the checkpoint at version {upcoming}")
        return self.inner.on_idle(worker)

    def on_result(self, job_id: int) -> Verdict:
        return self.inner.on_result(job_id)

    def ready(self) -> bool:
        return self.inner.ready()

    def commit(self) -> Cohort:
        return self.inner.commit()

    def on_cancel(self, job_id: int) -> None:
        self.inner.on_cancel(job_id)


def make_policy(spec, cohort: int, drain_every: int = 0) -> Policy | Draining:
    """Build a policy from a config mapping or model with a ``kind`` field."""
    fields = dict(spec) if isinstance(spec, dict) else spec.model_dump()
    kind = fields.pop("kind")
    builders = {
        "sync": Synchronous,
        "unbounded": Unbounded,
        "bounded": BoundedStaleness,
        "controlled_delay": ControlledDelay,
    }
    if kind not in builders:
        raise ValueError(f"policy.kind must be one of {', '.join(builders)}, got {kind!r}")
    policy = builders[kind](cohort, **fields)
    return Draining(policy, drain_every) if drain_every else policy
