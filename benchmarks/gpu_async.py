"""gpu_check's ``async`` section (benchmarks/gpu_check.py): a few asynchronous updates with
the simulator's bounded-staleness policy, driven as the orchestrator drives it, on a task
that needs no container."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from gpu_generation import make_hf
from harness import REPO, conversation

from runner.backends import GenerationRequest, SessionBatcher
from runner.es import Result, UpdateRule
from runner.seeds import derive_seed

if TYPE_CHECKING:
    from gpu_check import Table

TARGET = "<command>ls -la /home/user</command>"


def load_driver() -> tuple[Any, Any, str]:
    """The simulator's policy and driver modules; as single files where the package's deps
    are missing."""
    try:
        from staleness_sim.core import driver, policies

        return policies, driver, "staleness_sim.core.policies, .driver"
    except ImportError as exc:  # the package __init__ needs pydantic / simpy; these do not
        mods = []
        for name in ("policies", "driver"):
            # under the package's names, so the driver's import of the policies finds the file
            path = REPO / "staleness_sim" / "core" / f"{name}.py"
            spec = importlib.util.spec_from_file_location(f"staleness_sim.core.{name}", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
            mods.append(mod)
        return *mods, f"staleness_sim/core/policies.py and driver.py loaded as files ({exc})"


def section_async(tab: Table, ctx: SimpleNamespace) -> None:
    policies, drivers, source = load_driver()
    small = ctx.args.small
    workers, cohort_size, updates = 2, 2 if small else 3, 2 if small else 3
    episodes, concurrency = (2, 2) if small else (8, 8)
    es = {**ctx.es, "sigma": 0.05, "alpha": 0.01}
    rule = UpdateRule(sigma=es["sigma"], alpha=es["alpha"])
    run_seed = 0
    # driven as RunState drives it, through the simulator's driver (no trace kept here)
    driver = drivers.PolicyDriver(
        policies.make_policy({"kind": "bounded", "max_lag": 1, "on_stale": "drop"}, cohort_size)
    )
    backends = [make_hf(ctx, es=es, max_new_tokens=min(ctx.tokens, 32)) for _ in range(workers)]
    log: list = []
    cohorts: list = []
    jobs: dict[int, dict[str, Any]] = {}

    def run_job(w: int, job: dict[str, Any]) -> float:
        b = backends[w]
        b.sync(log[: job["version"]])  # catch up to the dispatch version from seeds
        batcher = SessionBatcher(b, max_batch=64, window_s=0.02)
        with b.perturbed(job["seed"], job["sign"]), ThreadPoolExecutor(concurrency) as pool:

            def episode(i: int) -> float:
                batcher.open_session()
                try:
                    g = batcher.generate(GenerationRequest(
                        conversation(i), seed=derive_seed(job["sampling_seed"], i)))  # fmt: skip
                finally:
                    batcher.close_session()
                return difflib.SequenceMatcher(None, g.text, TARGET).ratio()

            rewards = list(pool.map(episode, range(episodes)))
        batcher.close()
        return sum(rewards) / len(rewards)

    t0 = time.perf_counter()
    idle = list(range(workers))
    running: dict[Any, tuple[int, int]] = {}
    with ThreadPoolExecutor(workers) as pool:
        while driver.version < updates:
            while idle:  # as RunState.dispatch
                now = time.perf_counter() - t0
                decision = driver.idle(idle[0], now)
                if not isinstance(decision, policies.Start):
                    break
                w = idle.pop(0)
                job = {"id": decision.job_id, "version": decision.version,
                       "seed": derive_seed(run_seed, "perturbation", decision.job_id), "sign": 1,
                       "sampling_seed": derive_seed(run_seed, "sampling", "version", decision.version)}  # fmt: skip
                jobs[job["id"]] = job
                running[pool.submit(run_job, w, job)] = (w, job["id"])
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                w, j = running.pop(fut)
                jobs[j]["reward"] = fut.result()
                driver.land(j)  # as RunState.land
                idle.append(w)
                while driver.ready() and driver.version < updates:  # as RunState.commit
                    cohort = driver.commit()
                    results = [Result(jobs[k]["seed"], jobs[k]["reward"], jobs[k]["version"])
                               for k in cohort.job_ids]  # fmt: skip
                    log.append(rule.make(results, cohort.version - 1))
                    now = time.perf_counter() - t0
                    driver.record_commit(cohort, time=now, commit_time=now)
                    cohorts.append(cohort)
        for fut in list(running):  # the run ends: jobs in flight are cancelled, as RunState.end
            fut.result()
            driver.cancel(running.pop(fut)[1], "run ended")
    wall = time.perf_counter() - t0
    accepted = [lag for cohort in cohorts for lag in cohort.lags]
    discarded = driver.counts["discarded"]
    for b in backends:
        b.sync(log)
    agree = len({b.weights_hash() for b in backends}) == 1
    for b in backends:
        b.close()
    tab.add("async.task", "string match (no container)", note=f"reward = difflib ratio to {TARGET}")
    tab.add(
        "async.policy",
        "bounded max_lag=1 drop",
        note=f"{workers} workers, cohort {cohort_size}; {source}",
    )
    tab.add("async.updates", len(log), "ok" if len(log) == updates else "FAIL")
    tab.add("async.accepted", len(accepted), note=f"lags {accepted}")
    tab.add("async.discarded", discarded)
    tab.add(
        "async.max_lag", max(accepted, default=0), "ok" if max(accepted, default=0) <= 1 else "FAIL"
    )
    rewards = [j["reward"] for j in jobs.values() if "reward" in j]
    tab.add("async.mean_reward", sum(rewards) / len(rewards), note=f"over {len(rewards)} jobs")
    tab.add("async.nonzero_updates", sum(any(c != 0.0 for _, c in r.entries) for r in log))
    tab.add("async.wall_s", wall, note=f"{episodes} episodes per job, {concurrency} sessions")
    tab.add("async.workers_agree", agree, "ok" if agree else "FAIL",
            "every worker replays the log to the same weights")  # fmt: skip
