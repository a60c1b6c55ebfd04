"""How fast is the simulator? Ratios from one run, on whatever machine runs it.

1. The full published run (120 updates x 30 jobs x 256 episodes over 32 sessions: 921,600
   episodes) with the engine, against a straightforward SimPy model of the same run with
   one process per episode (a Resource of 32 sessions per job). Both are fed the same
   episode durations, so they must produce the same wall clock: the benchmark checks that.
2. A 10,000-update what-if with G = 64 workers on the same job model.

    python benchmarks/bench_sim.py [--repeat 3] [--skip-baseline]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import simpy

from staleness_sim import load_scenario, simulate, summarize
from staleness_sim.cohort import engine
from staleness_sim.core.policies import Start, make_policy
from staleness_sim.durations import make_duration

ROOT = Path(__file__).resolve().parents[1]

PAPER = ROOT / "configs" / "sim" / "paper_async1.yaml"


class EpisodeStream:
    """Per-job episode durations drawn exactly as the engine's DurationStream draws them
    (same generator, same block sizes, episode-major), kept per episode for the baseline."""

    def __init__(self, scenario):
        self.model = make_duration(scenario.job.episode)
        self.d = scenario.job.episodes
        self.rng = np.random.default_rng(scenario.seed)
        self.blocks: list[np.ndarray] = []
        self.n = 0
        self.block = 256

    def __getitem__(self, job_id: int) -> np.ndarray:
        while job_id >= self.n:
            eps = self.model.sample(self.rng, self.d * self.block).reshape(self.d, self.block)
            self.blocks.append(eps)
            self.n += self.block
            self.block = min(2 * self.block, 16384)
        for eps in self.blocks:
            if job_id < eps.shape[1]:
                return eps[:, job_id]
            job_id -= eps.shape[1]
        raise IndexError(job_id)


def baseline(scenario) -> float:
    """One SimPy process per episode; same policy objects; returns the wall clock."""
    env = simpy.Environment()
    policy = make_policy(scenario.policy, scenario.cohort, scenario.drain_every)
    episodes = EpisodeStream(scenario)
    concurrency = scenario.job.concurrency
    queue: list[tuple[int, simpy.Event]] = []
    done = env.event()

    def episode(sessions, duration):
        with sessions.request() as slot:
            yield slot
            yield env.timeout(duration)

    def pump():
        while queue and not done.triggered:
            decision = policy.on_idle(queue[0][0])
            if not isinstance(decision, Start):
                return
            queue.pop(0)[1].succeed(decision)

    def worker(w):
        while True:
            ticket = env.event()
            queue.append((w, ticket))
            pump()
            start = yield ticket
            sessions = simpy.Resource(env, capacity=concurrency)
            yield env.all_of([env.process(episode(sessions, d)) for d in episodes[start.job_id]])
            if done.triggered:
                return
            policy.on_result(start.job_id)
            while policy.ready():
                if policy.commit().version >= scenario.updates:
                    done.succeed(env.now)
                    return

    for w in range(scenario.workers):
        env.process(worker(w))
    env.run(until=done)
    return env.now


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        engine._STREAMS.clear()  # time the sampling too, not a cached stream
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-baseline", action="store_true", help="skip the slow per-episode model")
    args = ap.parse_args()

    paper = load_scenario(PAPER)
    t_engine, trace = timed(lambda: simulate(paper), args.repeat)
    wall = summarize(trace)["wall_clock_s"]
    print(f"published run (921,600 episodes), engine:          {t_engine * 1e3:8.1f} ms")
    if not args.skip_baseline:
        t_base, base_wall = timed(lambda: baseline(paper), 1)
        agree = abs(base_wall - wall) <= 1e-6 * wall
        print(f"published run, one SimPy process per episode:     {t_base * 1e3:8.1f} ms")
        print(f"  same simulated wall clock: {agree} ({wall:.3f} s vs {base_wall:.3f} s)")
        print(f"  speed-up of the engine over the per-episode model: {t_base / t_engine:.0f}x")
    simulate(paper)  # samples this workload's durations once, as the first point of a sweep
    t0 = time.perf_counter()
    simulate(paper)
    t_cached = time.perf_counter() - t0
    print(f"published run again, durations already sampled:   {t_cached * 1e3:8.1f} ms")

    whatif = load_scenario(PAPER, ["workers=64", "updates=10000"])
    t_big, big = timed(lambda: simulate(whatif), 1)
    s = summarize(big)
    print(
        f"10,000 updates, G = 64 ({s['jobs_completed']:,} jobs, "
        f"{s['jobs_completed'] * 256:,} episodes): {t_big:.2f} s"
    )
    print(f"  = {s['jobs_completed'] / t_big:,.0f} jobs per second of compute")


if __name__ == "__main__":
    main()
