"""Asynchronous evolution strategies in one file: the project's contract, run on a toy.

Everything the real runner does between its workers and its update rule is here, with the
expensive parts replaced: the policy (``staleness_sim.core.policies``) decides who may
start and what a result is worth, the ``PolicyDriver`` turns its decisions into a trace,
and the torch-free ``UpdateRule`` (``runner.es``) makes the update from a cohort of results.
Instead of an LLM on terminal tasks, a worker "evaluates" a perturbation of a small numpy
parameter vector; instead of wall time, a simulated clock hands each job a heavy-tailed
duration (Pareto), so some workers straggle, as agent episodes do.

    python examples/async_es_in_one_file.py                 # sync and bounded, G = N = 8
    python examples/async_es_in_one_file.py --workers 16 --max-lag 2

For each policy it prints one line per update (simulated time, the cohort's lags, the
objective) and then the trace's lag statistics. ``sync`` waits for the slowest of each
cohort; ``bounded`` keeps every worker busy and uses results up to ``max_lag`` versions old.
"""

from __future__ import annotations

import argparse
import heapq
from collections import Counter

import numpy as np

from runner.es import Result, UpdateRule
from staleness_sim.core.driver import PolicyDriver, cancel_reason
from staleness_sim.core.policies import Discard, Wait, make_policy

DIM = 16  # parameters of the toy "model"
TARGET = np.linspace(-1.0, 1.0, DIM)  # the optimum of the objective


def objective(theta: np.ndarray) -> float:
    """The reward of parameters ``theta``: higher is better, 0 at the optimum."""
    return -float(np.sum((theta - TARGET) ** 2))


def noise(seed: int) -> np.ndarray:
    """eps(seed): regenerated from the seed wherever it is needed, never sent (as in the
    runner, where an update is a list of (seed, coefficient) pairs)."""
    return np.random.default_rng(seed).standard_normal(DIM)


class Trace:
    """The three write methods the driver calls: one row per job, one per update."""

    def __init__(self) -> None:
        self.jobs: dict[int, dict] = {}
        self.updates: list[dict] = []

    def dispatch(self, job: int, worker: int, *, seed: int, version: int, time: float) -> None:
        self.jobs[job] = {"worker": worker, "seed": seed, "dispatch_version": version,
                          "start_time": time}  # fmt: skip

    def set_job(self, job: int, **values) -> None:
        self.jobs[job].update(values)

    def update(self, **values) -> None:
        self.updates.append(values)


def run(policy: dict, workers: int, cohort: int, updates: int, seed: int = 0,
        sigma: float = 0.1, alpha: float = 0.3, quiet: bool = False) -> dict:  # fmt: skip
    """One run: returns the trace, the objective after each version and the records."""
    rng = np.random.default_rng(seed)  # the clock's durations only
    rule = UpdateRule(sigma=sigma, alpha=alpha, shaping="centered_rank")
    trace = Trace()
    driver = PolicyDriver(make_policy(policy, cohort), trace, seed_of=lambda job: seed + job)
    theta = np.zeros(DIM)
    weights = [theta.copy()]  # weights[v]: the parameters at version v
    finishing: list[tuple[float, int]] = []  # (time the job ends, job id): the clock
    running: dict[int, tuple[int, Result]] = {}  # job -> (worker, its result)
    landed: dict[int, Result] = {}  # accepted or deferred results, not yet in an update
    idle, now = list(range(workers)), 0.0
    objectives, records = [objective(theta)], []

    def start_idle_workers() -> None:
        while idle:
            start = driver.idle(idle[0], now)
            if isinstance(start, Wait):  # admission is monotone: no other worker may start
                return
            job, worker = start.job_id, idle.pop(0)
            job_seed = trace.jobs[job]["seed"]
            # the worker evaluates a perturbation of the weights of the version it started at
            reward = objective(weights[start.version] + sigma * noise(job_seed))
            running[job] = (worker, Result(job_seed, reward, start.version))
            duration = 1.0 + rng.pareto(1.5)  # heavy-tailed: mean 3, infinite variance
            heapq.heappush(finishing, (now + duration, job))

    start_idle_workers()
    while driver.version < updates:
        now, job = heapq.heappop(finishing)
        if job not in running:  # cancelled at a commit while it ran
            continue
        worker, result = running.pop(job)
        idle.append(worker)
        if not isinstance(driver.land(job, end_time=now), Discard):
            landed[job] = result  # accepted now, or deferred to a later update
        if driver.ready():
            members = driver.commit()
            record = rule.make([landed.pop(j) for j in members.job_ids], members.version - 1)
            theta = theta + sum(c * noise(s) for s, c in record.entries)
            weights.append(theta.copy())
            driver.record_commit(members, time=now, commit_time=now)
            for stopped in members.cancel:  # on_stale: cancel frees the worker now
                idle.append(running.pop(stopped)[0])
                driver.cancel(stopped, cancel_reason(members.version), end_time=now)
            objectives.append(objective(theta))
            records.append(record)
            if not quiet:
                lags = ",".join(map(str, record.lags))
                print(f"  update {record.version:3d}  t={now:7.1f}  lags [{lags}]  "
                      f"objective {objectives[-1]:8.3f}")  # fmt: skip
        start_idle_workers()
    return {"trace": trace, "objectives": objectives, "records": records,
            "counts": dict(driver.counts), "time": now}  # fmt: skip


def lag_stats(trace: Trace) -> dict:
    """From the trace alone: how many results were used at each lag, and what the rest
    became (discarded as too stale, deferred, cancelled, or still running at the end)."""
    used = Counter(row["lag"] for row in trace.jobs.values() if row.get("verdict") == "accepted")
    fates = Counter(row.get("verdict", "running") for row in trace.jobs.values())
    n = sum(used.values())
    mean = sum(lag * k for lag, k in used.items()) / n if n else float("nan")
    return {"used_by_lag": dict(sorted(used.items())), "mean_lag": mean, "fates": dict(fates)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=8, help="G, workers")
    p.add_argument("--cohort", type=int, default=8, help="N, results per update")
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--max-lag", type=int, default=1, help="bounded: the largest lag used")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    policies = {"sync": {"kind": "sync"},
                "bounded": {"kind": "bounded", "max_lag": args.max_lag}}  # fmt: skip
    out = {}
    for name, spec in policies.items():
        print(f"{name}: G={args.workers} N={args.cohort} {spec}")
        out[name] = run(spec, args.workers, args.cohort, args.updates, args.seed)
        stats = lag_stats(out[name]["trace"])
        print(f"  {args.updates} updates in simulated time {out[name]['time']:.1f}; results "
              f"used by lag {stats['used_by_lag']} (mean {stats['mean_lag']:.2f}); "
              f"all jobs {stats['fates']}\n")  # fmt: skip
    return out


if __name__ == "__main__":
    main()
