"""The one driver of a policy: the events every clock feeds a policy, and the bookkeeping
that follows from its decisions.

A clock (the SimPy engine, the queue pipeline's cohort rule, the runner's ``RunState``, the
GPU check) owns time and workers. It tells the driver what happened (a worker idles, a
result lands, the cohort is complete, a job was stopped) and obeys the answer; the driver
asks the policy and owns what every clock would otherwise write again: the verdicts and
their names, lags, reasons, commits, the trace rows they produce and a tally of verdicts.

Rows go to a recorder with :class:`~staleness_sim.core.trace.TraceRecorder`'s three write
methods (``dispatch``, ``set_job``, ``update``), passed in so that this module needs no
pandas (the GPU check loads it as a single file); without one, nothing is recorded.

Imports nothing but the standard library and the policies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from staleness_sim.core.policies import Accept, Cohort, Defer, Discard, Start, Wait

VERDICT_NAMES = {Accept: "accepted", Discard: "discarded", Defer: "deferred"}
ACCEPTED, CANCELLED, DROPPED = "accepted", "cancelled", "dropped"


def cancel_reason(version: int) -> str:
    """Why the commit that produced ``version`` cancels a job (``on_stale: cancel``)."""
    return f"cancelled at version {version}: would exceed the bound"


class _NoRows:
    """A recorder that keeps nothing (a clock that needs only the decisions)."""

    def dispatch(self, *args: Any, **values: Any) -> None:
        pass

    def set_job(self, *args: Any, **values: Any) -> None:
        pass

    def update(self, **values: Any) -> None:
        pass


class PolicyDriver:
    """Feeds a policy the events of one run and records what its decisions mean.

    ``seed_of(job_id)`` is the seed a job's row records (default: its id).
    """

    def __init__(self, policy, rec=None, seed_of: Callable[[int], int] | None = None) -> None:
        self.policy = policy
        self.rec = _NoRows() if rec is None else rec
        self._seed_of = seed_of
        self.counts = {"accepted": 0, "discarded": 0, "deferred": 0, "dropped": 0, "commits": 0}
        self._held: set[int] = set()  # deferred results not yet released into a cohort

    @property
    def version(self) -> int:
        return self.policy.version

    def ready(self) -> bool:
        return self.policy.ready()

    # -- the events ---------------------------------------------------------------------
    def idle(self, worker: int, time: float) -> Start | Wait:
        """A worker is idle: the policy's ``Start`` (its dispatch row written) or ``Wait``."""
        decision = self.policy.on_idle(worker)
        if isinstance(decision, Start):
            job = decision.job_id
            seed = job if self._seed_of is None else self._seed_of(job)
            self.rec.dispatch(job, worker, seed=seed, version=decision.version, time=time)
        return decision

    def land(self, job: int, **row: Any) -> Accept | Discard | Defer:
        """A result landed: the policy's verdict, recorded with ``row`` (further columns).
        An accepted result is counted when its cohort commits."""
        verdict = self.policy.on_result(job)
        name = VERDICT_NAMES[type(verdict)]
        self.rec.set_job(
            job,
            completion_version=self.policy.version,
            lag=verdict.lag,
            reason=verdict.reason,
            verdict=name,
            **row,
        )
        if name != ACCEPTED:
            self.counts[name] += 1
            if name == "deferred":
                self._held.add(job)
        return verdict

    def commit(self) -> Cohort:
        """Close the complete cohort, its members in dispatch order (job ids are handed out
        in it), not in the order they landed: what is made of a cohort (an update's entries,
        their float sum) then depends on the results alone, not on which worker was faster.
        The clock then records it with :meth:`record_commit` once it knows the times, and
        stops each job in ``cohort.cancel`` with ``cancel(job, cancel_reason(version))``."""
        cohort = self.policy.commit()
        members = sorted(zip(cohort.job_ids, cohort.lags, strict=True))
        return replace(
            cohort, job_ids=tuple(j for j, _ in members), lags=tuple(lag for _, lag in members)
        )

    def record_commit(
        self,
        cohort: Cohort,
        time: float,
        commit_time: float,
        job_row: dict[str, Any] | None = None,
        dropped: dict[int, str] | None = None,
        weights: dict[int, float] | None = None,
        **update_row: Any,
    ) -> None:
        """The cohort's members become ``accepted`` at their lag of use (with ``job_row``'s
        columns), and the update's row is written (with ``update_row``'s columns).

        Where the update itself decides too (the runner's ``es.staleness`` and
        ``es.antithetic``), ``dropped`` names the members it did not use after all, with
        why (recorded ``dropped``, so that no trace calls them used), and ``weights`` the
        weight it gave each member it used (a ``weight`` column)."""
        extra = job_row or {}
        dropped = dropped or {}
        for job, lag in zip(cohort.job_ids, cohort.lags, strict=True):
            if job in dropped:
                self.rec.set_job(job, verdict=DROPPED, lag=lag, reason=dropped[job], **extra)
            elif weights is not None:
                self.rec.set_job(job, verdict=ACCEPTED, lag=lag, weight=weights[job], **extra)
            else:
                self.rec.set_job(job, verdict=ACCEPTED, lag=lag, **extra)
            if job in self._held:
                self._held.discard(job)
                self.counts["deferred"] -= 1
        self.counts["accepted"] += cohort.size - len(dropped)
        self.counts["dropped"] += len(dropped)
        self.counts["commits"] += 1
        self.rec.update(
            version=cohort.version,
            time=time,
            commit_time=commit_time,
            cohort_size=cohort.size,
            mean_lag=sum(cohort.lags) / cohort.size,
            max_lag=max(cohort.lags),
            **update_row,
        )

    def cancel(self, job: int, reason: str, **row: Any) -> None:
        """An in-flight job is stopped (the commit asked, a worker crashed, the run ended)."""
        self.policy.on_cancel(job)
        self.stopped(job, reason, **row)

    def stopped(self, job: int, reason: str, **row: Any) -> None:
        """Record why a job's result never counted, without telling the policy (the job was
        cancelled earlier and its worker stops now, or its result came after the end)."""
        self.rec.set_job(job, verdict=CANCELLED, reason=reason, **row)
