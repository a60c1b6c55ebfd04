"""Simulated mean staleness of the queue pipeline against the published queue-drop closed form.

Rollout-bound and trainer-bound settings (rho from 0.5 to 2), queue capacities q in
{1, 2, 4}, a light and a heavy length tail; C = B = 128, groups of S = 8, mean length 1,
so rho = the trainer's step time. For each point: the closed form at the *measured* rho
and M_tail, the simulated mean staleness (mean +- sd over seeds), and their difference.
A second table compares queue-drop with queue-max (rule max_staleness): mean length of the
samples the trainer used against the mean length of all generated samples.

    python benchmarks/queue_closed_form.py                # both tables, Markdown
    python benchmarks/queue_closed_form.py --updates 4000 --seeds 3 --jobs 2
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from staleness_sim.config import validate
from staleness_sim.core import analytic
from staleness_sim.durations import make_duration
from staleness_sim.summary import run_summary

ROOT = Path(__file__).resolve().parents[1]

TAILS = {
    "light (lognormal cv 0.27)": {"dist": "lognormal", "mean": 1.0, "cv": 0.27},
    "heavy (lognormal cv 1.5)": {"dist": "lognormal", "mean": 1.0, "cv": 1.5},
}
RHOS = (0.5, 0.75, 0.9, 1.1, 1.25, 1.5, 2.0)
QS = (1, 2, 4)
C, B, S = 128, 128, 8


def scenario(sample, rho, q, updates, seed, rule="drop_oldest", k=None, step_cv=0.0):
    step = (
        {"dist": "constant", "value": rho}
        if step_cv == 0
        else {"dist": "gamma", "mean": rho, "cv": step_cv}
    )
    queue = {"capacity": q, "rule": rule}
    if k is not None:
        queue["max_staleness"] = k
    return {
        "pipeline": "queue",
        "name": "closed-form",
        "seed": seed,
        "updates": updates,
        "rollout": {"concurrency": C, "group_size": S, "sample": sample},
        "trainer": {"batch": B, "step": step},
        "queue": queue,
    }


def run_one(data):
    s = run_summary(validate(data))
    keys = (
        "mean_staleness",
        "rho",
        "m_tail",
        "closed_form_staleness",
        "trainer_idle_fraction",
        "rollout_idle_fraction",
        "samples_dropped",
        "mean_generated_duration",
        "mean_consumed_duration",
        "max_lag",
    )
    return {k: s[k] for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--updates", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--step-cv", type=float, default=0.0, help="gamma step times (0: constant)")
    ap.add_argument("--k", type=int, default=2, help="queue-max bound K for the bias table")
    args = ap.parse_args()
    t0 = time.perf_counter()
    points = [(tail, rho, q) for tail in TAILS for q in QS for rho in RHOS]
    work = [
        scenario(TAILS[tail], rho, q, args.updates, seed, step_cv=args.step_cv)
        for tail, rho, q in points
        for seed in range(args.seeds)
    ]
    bias_points = [(tail, rho) for tail in TAILS for rho in (0.75, 1.5, 2.0)]
    for tail, rho in bias_points:
        for seed in range(args.seeds):
            work.append(scenario(TAILS[tail], rho, 2, args.updates, seed))
            work.append(
                scenario(TAILS[tail], rho, None, args.updates, seed, "max_staleness", args.k)
            )
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run_one, work, chunksize=1))
    n = args.seeds
    print(
        f"C = {C}, B = {B}, S = {S}, mean length 1, step "
        + ("constant" if args.step_cv == 0 else f"gamma cv {args.step_cv}")
        + f", {args.updates} steps, {n} seeds; queue-drop (rule drop_oldest)\n"
    )
    for tail, spec in TAILS.items():
        m = analytic.m_tail(make_duration(spec), S)
        print(f"### {tail}: M_tail = {m:.3f} (analytic)\n")
        print(
            "| rho (set) | rho (measured) | q | closed form | simulated | sim - closed | trainer idle | dropped |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for i, (t, rho, q) in enumerate(points):
            if t != tail:
                continue
            rs = results[i * n : (i + 1) * n]
            sim = np.array([r["mean_staleness"] for r in rs])
            cf = np.mean([r["closed_form_staleness"] for r in rs])
            mr = np.mean([r["rho"] for r in rs])
            idle = np.mean([r["trainer_idle_fraction"] for r in rs])
            drop = np.mean([r["samples_dropped"] for r in rs])
            print(
                f"| {rho:g} | {mr:.3f} | {q} | {cf:.3f} | {sim.mean():.3f} +- {sim.std():.3f} "
                f"| {sim.mean() - cf:+.3f} ({100 * (sim.mean() - cf) / cf:+.1f} %) "
                f"| {100 * idle:.1f} % | {drop:.0f} |"
            )
        print()
    base = len(points) * n
    print(
        f"### Queue-drop (q = 2) against queue-max (max_staleness K = {args.k}, unbounded queue)\n"
    )
    print(
        "| tail | rho | rule | mean generated length | mean used length | used / generated | dropped | mean staleness | max staleness |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for j, (tail, rho) in enumerate(bias_points):
        for r_i, rule in enumerate(("drop_oldest (q=2)", f"max_staleness (K={args.k})")):
            rs = [results[base + (j * n + s) * 2 + r_i] for s in range(n)]
            gen = np.mean([r["mean_generated_duration"] for r in rs])
            used = np.mean([r["mean_consumed_duration"] for r in rs])
            drop = np.mean([r["samples_dropped"] for r in rs])
            st = np.mean([r["mean_staleness"] for r in rs])
            mx = max(r["max_lag"] for r in rs)
            print(
                f"| {tail.split()[0]} | {rho:g} | {rule} | {gen:.4f} | {used:.4f} "
                f"| {used / gen:.3f} | {drop:.0f} | {st:.3f} | {mx} |"
            )
    print(f"\n({len(work)} runs in {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
