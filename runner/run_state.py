"""A run's state, changed only by events: the policy, the trace, the update log, episodes.

Every change goes through one method here, which applies it and returns the event that
records it; the orchestrator appends that event to the journal. Resuming a run feeds the
journalled events back through the same methods (:meth:`RunState.replay`), which
rebuilds the scheduling policy's state exactly (it is a pure state machine) and checks
that every decision comes out as it was recorded.

The scheduling policy is the simulator's own (``staleness_sim.core.policies.make_policy``),
driven by the simulator's own driver (``staleness_sim.core.driver.PolicyDriver``): the same
classes and bookkeeping as the SimPy engine, called in the same order for the same events.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from runner.config import RunConfig
from runner.es import Result, UpdateRecord, UpdateRule
from runner.machine import CPU_USE_KEYS
from runner.precheck import cohort_figures
from runner.seeds import derive_seed
from staleness_sim.core import policies
from staleness_sim.core.driver import VERDICT_NAMES, PolicyDriver, cancel_reason
from staleness_sim.core.trace import Trace, TraceRecorder

EXTRA_JOB_COLUMNS = (
    "sign",
    "sampling_seed",
    "episodes",
    "episode_errors",
    "sync_s",
    "perturb_s",
    "generation_s",
    "container_s",
    "tokens_out",
    "weight",  # the weight the update gave the result (es.staleness lag_weighted: gamma**lag)
)
EXTRA_UPDATE_COLUMNS = (
    "mean_reward",
    "reward_std",
    "zero_update",
    "n_entries",
    "pair_disagreement",  # runner.precheck: is there signal for ES in this cohort?
    "slots_all_agree",
)


class ReplayMismatch(RuntimeError):
    """A journalled decision differs from the one the policy makes now."""


class RunState:
    def __init__(self, config: RunConfig, rule: UpdateRule) -> None:
        self.config = config
        self.rule = rule
        self.policy = policies.make_policy(config.policy, config.cohort, config.drain_every)
        self.rec = TraceRecorder(EXTRA_JOB_COLUMNS, EXTRA_UPDATE_COLUMNS)
        self.driver = PolicyDriver(self.policy, self.rec, self._seed_of)
        self.log: list[UpdateRecord] = []
        self.episodes: list[dict[str, Any]] = []
        self.running: dict[
            int, int
        ] = {}  # dispatched job -> worker, until it lands or is cancelled
        self.cancelled: set[int] = set()
        self._rewards: dict[int, float] = {}
        self._episodes_of: dict[int, list[dict[str, Any]]] = {}  # until its cohort commits
        self._workers: dict[int, tuple[str, float]] = {}  # worker -> (state, since)
        self.now = 0.0  # time of the latest event
        self.segments: list[dict[str, Any]] = []
        self.finished = False
        self.episodes_done = 0

    @property
    def version(self) -> int:
        return len(self.log)

    # -- the events ---------------------------------------------------------------------
    def worker_state(self, worker: int, state: str, t: float) -> dict[str, Any] | None:
        previous = self._workers.get(worker)
        if previous is not None and previous[0] == state:
            return None
        self._tick(t)
        if previous is not None:
            self.rec.interval(worker, previous[0], previous[1], t)
        self._workers[worker] = (state, t)
        return {"e": "state", "w": worker, "s": state, "t": t}

    def _seed_of(self, job: int) -> int:
        """A job's perturbation seed (an antithetic pair shares one), derived by name."""
        cfg = self.config
        return derive_seed(cfg.seed, "perturbation", job // 2 if cfg.es.antithetic else job)

    def _shared_by(self, job: int, version: int) -> tuple[str, int]:
        """What a job's task batch and sampling seed are derived from (common_random_numbers):
        its version (every member dispatched at it), its antithetic pair, or the job itself."""
        crn = self.config.common_random_numbers
        if crn == "pair":
            return ("pair", job // 2)
        return ("version", version) if crn else ("job", job)

    def dispatch(self, worker: int, t: float) -> dict[str, Any] | policies.Wait:
        decision = self.driver.idle(worker, t)
        if not isinstance(decision, policies.Start):
            return decision
        self._tick(t)
        job, version, cfg = decision.job_id, decision.version, self.config
        crn = self._shared_by(job, version)
        ev = {
            "e": "dispatch",
            "job": job,
            "w": worker,
            "version": version,
            "seed": self._seed_of(job),
            "sign": -1 if cfg.es.antithetic and job % 2 else 1,
            "sampling_seed": derive_seed(cfg.seed, "sampling", *crn),
            "task_seed": derive_seed(cfg.seed, "tasks", *crn),
            "t": t,
        }
        self.rec.set_job(job, sign=ev["sign"], sampling_seed=ev["sampling_seed"])
        self.running[job] = worker
        return ev

    def job_started(self, job: int, t: float, sync_s: float) -> dict[str, Any]:
        self._tick(t)
        self.rec.set_job(job, start_time=t, sync_s=sync_s)
        return {"e": "run", "job": job, "t": t, "sync_s": sync_s}

    def land(self, job: int, t: float, outcome: dict[str, Any]) -> dict[str, Any]:
        """A finished job's result: the policy's verdict, then the trace."""
        self._tick(t)
        self.running.pop(job)
        episodes = outcome["episodes"]
        self._rewards[job] = outcome["reward"]
        self._episodes_of[job] = episodes
        verdict = self.driver.land(
            job,
            end_time=t,
            reward=outcome["reward"],
            episodes=len(episodes),
            episode_errors=sum(1 for e in episodes if e.get("error")),
            perturb_s=outcome["perturb_s"],
            generation_s=outcome["generation_s"],
            container_s=outcome["container_s"],
            tokens_out=sum(e["tokens_out"] for e in episodes),
        )
        self.episodes.extend(episodes)
        self.episodes_done += len(episodes)
        name = VERDICT_NAMES[type(verdict)]
        return {"e": "result", "job": job, "t": t, **outcome, "verdict": name, "lag": verdict.lag}

    def commit(self, t: float, order: list[int] | None = None) -> dict[str, Any]:
        """Close the complete cohort: the policy commits, the update rule makes the record
        from the members in dispatch order, and the trace records what the update did with
        each (its weight, or ``dropped`` and why).

        ``order`` (replay only): the members as the journal lists them. A journal written
        before cohorts came in dispatch order lists them as they landed, and its records
        were made in that order; they are remade in it, so old runs resume unchanged."""
        self._tick(t)
        cohort = self.driver.commit()
        members = list(cohort.job_ids)
        if order is not None and sorted(order) == members:
            members = list(order)
        jobs = self.rec.jobs
        results = [
            Result(jobs["seed"][j], self._rewards[j], jobs["dispatch_version"][j], jobs["sign"][j])
            for j in members
        ]
        record = self.rule.make(results, cohort.version - 1)
        self.log.append(record)
        fates = dict(zip(members, self.rule.judge(results, cohort.version - 1), strict=True))
        rewards = np.array([r.reward for r in results])
        figures = cohort_figures(
            [
                (r.seed, r.sign, self._episodes_of.pop(j, []))
                for j, r in zip(members, results, strict=True)
            ],
            antithetic=self.config.es.antithetic,
            graded=self.config.es.reward == "graded",
        )
        self.driver.record_commit(
            cohort,
            time=t,
            commit_time=t,
            dropped={j: f"{f.reason} ({f.key})" for j, f in fates.items() if f.weight is None},
            weights={j: f.weight for j, f in fates.items() if f.weight is not None},
            mean_reward=float(rewards.mean()),
            reward_std=float(rewards.std()),
            zero_update=all(c == 0.0 for _, c in record.entries),
            n_entries=len(record.entries),
            **figures,
        )
        for j in cohort.cancel:
            self._cancel(j, t, cancel_reason(cohort.version))
        return {
            "e": "commit",
            "version": cohort.version,
            "t": t,
            "jobs": members,
            "cancel": list(cohort.cancel),
            "record": record.to_dict(),
        }

    def cancel(self, job: int, t: float, reason: str) -> dict[str, Any]:
        self._tick(t)
        self._cancel(job, t, reason)
        return {"e": "cancel", "job": job, "t": t, "reason": reason}

    def segment(
        self, number: int, wall: float, t: float, reason: str, machine: dict | None = None
    ) -> dict[str, Any]:
        """A process takes over the run: what the previous one had in flight is cancelled,
        and every worker starts idle (so worker intervals cover the run without gaps).
        ``machine`` (what the process ran on) is kept with the segment."""
        self._tick(t)
        self._stop_all(t, reason)
        for w in range(self.config.workers):
            self._workers[w] = ("idle", t)
        entry: dict[str, Any] = {"segment": number, "wall_start": wall, "t": t}
        ev: dict[str, Any] = {"e": "segment", "n": number, "wall": wall, "t": t, "reason": reason}
        if machine is not None:
            entry["machine"] = ev["machine"] = machine
        self.segments.append(entry)
        return ev

    def end(self, t: float, reason: str, cpu: dict[str, float] | None = None) -> dict[str, Any]:
        """The run stops (finished, or interrupted): jobs in flight are cancelled. ``cpu``
        (the cores busy over the segment: :class:`~runner.machine.CpuUse`) is kept with
        the segment."""
        self._tick(t)
        self._stop_all(t, reason)
        self.finished = self.version >= self.config.updates
        if cpu and self.segments:
            self.segments[-1].update(cpu)
        return {"e": "end", "t": t, "reason": reason, **(cpu or {})}

    # -- replay -------------------------------------------------------------------------
    def replay(self, ev: dict[str, Any]) -> None:
        kind = ev["e"]
        if kind == "state":
            self.worker_state(ev["w"], ev["s"], ev["t"])
            return
        if kind == "logged":  # the trackers' bookkeeping (runner/tracking): no state
            return
        if kind == "dispatch":
            got = self.dispatch(ev["w"], ev["t"])
        elif kind == "run":
            got = self.job_started(ev["job"], ev["t"], ev["sync_s"])
        elif kind == "result":
            outcome = {k: ev[k] for k in ev if k not in ("e", "job", "t", "verdict", "lag")}
            got = self.land(ev["job"], ev["t"], outcome)
        elif kind == "commit":
            got = self.commit(ev["t"], ev.get("jobs"))
        elif kind == "cancel":
            got = self.cancel(ev["job"], ev["t"], ev["reason"])
        elif kind == "segment":
            got = self.segment(ev["n"], ev["wall"], ev["t"], ev["reason"], ev.get("machine"))
        elif kind == "end":
            got = self.end(ev["t"], ev["reason"], {k: ev[k] for k in CPU_USE_KEYS if k in ev})
        else:
            raise ReplayMismatch(f"unknown journal event {kind!r}")
        mine = got if isinstance(got, dict) else {"e": "wait", "reason": got.reason}
        differs = [k for k in mine if k in ev and mine[k] != ev[k]]
        if mine["e"] != kind or differs:
            raise ReplayMismatch(
                f"journal event {ev} does not replay: the policy now gives {mine} "
                f"(differs in {differs or 'kind'})"
            )

    # -- tables -------------------------------------------------------------------------
    def trace(self, meta: dict[str, Any]) -> Trace:
        """The three tables so far; open worker intervals are closed at the latest event."""
        trace = self.rec.trace(meta)
        still_open = [(w, s, t, self.now) for w, (s, t) in self._workers.items() if self.now > t]
        if still_open:
            extra = pd.DataFrame(still_open, columns=trace.workers.columns)
            parts = [df for df in (trace.workers, extra) if not df.empty]
            trace.workers = pd.concat(parts, ignore_index=True)
        return trace

    # -- helpers ------------------------------------------------------------------------
    def _tick(self, t: float) -> None:
        self.now = max(self.now, t)

    def _cancel(self, job: int, t: float, reason: str) -> None:
        self.running.pop(job, None)
        self.cancelled.add(job)
        self.driver.cancel(job, reason, end_time=t)

    def _stop_all(self, t: float, reason: str) -> None:
        for job in list(self.running):
            self._cancel(job, t, reason)
        for w, (state, since) in list(self._workers.items()):
            self.rec.interval(w, state, since, t)
        self._workers.clear()
