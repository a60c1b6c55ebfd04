"""How fast is the queue pipeline? A 10,000-step run with C = 256 slots, groups of S = 16
and B = 256 samples per step (16 groups), for each queue rule, on whatever machine runs it.

Rules without producer waits (drop_oldest, max_staleness with an unbounded queue) take the
vectorised rollout; block and admission control take the event loop. Times are wall and
CPU seconds of the simulation alone and of the summary; a pure-Python calibration loop is
printed so that numbers from a slow or shared machine can be read.

    python benchmarks/bench_queue.py [--updates 10000] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from staleness_sim.config import validate
from staleness_sim.queue.engine import simulate_queue
from staleness_sim.summary import trace_summary

ROOT = Path(__file__).resolve().parents[1]

RULES = {
    "drop_oldest (q=2)": {"capacity": 2, "rule": "drop_oldest"},
    "max_staleness (K=2, unbounded)": {"rule": "max_staleness", "max_staleness": 2},
    "block (q=2)": {"capacity": 2, "rule": "block"},
    "admission (K=2)": {"rule": "max_staleness", "max_staleness": 2, "admission": True},
}


def calibration() -> float:
    t = time.perf_counter()
    s = 0
    for i in range(10_000_000):
        s += i
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--updates", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    print(
        f"load average {os.getloadavg()[0]:.1f}; 10M-iteration Python loop: {calibration():.2f} s"
    )
    print(
        f"{args.updates} steps, C = 256, S = 16, B = 256, lognormal lengths (mean 1, cv 0.5), 1.5 s steps (rho = 1.5)\n"
    )
    print("| rule | samples | simulate wall s | simulate CPU s | summary s | mean staleness |")
    print("|---|---|---|---|---|---|")
    for name, queue in RULES.items():
        sc = validate(
            {
                "pipeline": "queue",
                "updates": args.updates,
                "rollout": {
                    "concurrency": 256,
                    "group_size": 16,
                    "sample": {"dist": "lognormal", "mean": 1.0, "cv": 0.5},
                },
                "trainer": {"batch": 256, "step": {"dist": "constant", "value": 1.5}},
                "queue": queue,
            }
        )
        walls, cpus = [], []
        for _ in range(args.repeat):
            w, c = time.perf_counter(), time.process_time()
            trace = simulate_queue(sc)
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
        t = time.perf_counter()
        s = trace_summary(sc, trace)
        summ = time.perf_counter() - t
        print(
            f"| {name} | {len(trace.jobs):,} | {statistics.median(walls):.2f} "
            f"| {statistics.median(cpus):.2f} | {summ:.2f} | {s['mean_staleness']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
