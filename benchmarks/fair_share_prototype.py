"""A prototype, not the simulator's model: the CPU shared moment by moment among a run's
containers and engines (docs/turns.md, "What the runs say about the shared CPU", "A second
set", "A third sitting"), kept so that its numbers there can be made again and the next
model can start from it.

    python benchmarks/fair_share_prototype.py FIT_RUN RUN [RUN ...] [--cores 2]
        [--engine-cores 1.13,1.30,1.67] [--engine-threads 2] [--seeds 3] [--engine ENGINE.yaml]

At every moment the ``--cores`` are shared max-min fairly among threads: each session in a
timed part (a sandbox start, a command, a verifier, what lies between) is one thread
wanting a core; each engine decoding a batch of b is ``--engine-threads`` threads wanting
``u(b)`` cores between them (``--engine-cores`` at batches 1, 4 and 16, linear between:
what the engine alone keeps busy, ``bench_batching.py``'s ``continuous_cores``). A timed
part advances at its thread's share; a decode step takes the uncontended step ``a + s (b -
1) + k * held`` over the engine's share of its demand.

The fit takes the uncontended work out of FIT_RUN: each timed part's seconds times the
mean share it had over its interval (on a 5 ms grid of the run's own moments), and the
step's ``a, s, k`` by least squares over its turns, each turn's seconds per token times
its engine's mean share (or, with ``--engine``, an engine spec measured apart, e.g. by
``benchmarks/engine_curve.py``). Each RUN is then simulated at its own C and G, jobs of
its D episodes replaying the fit run's measured jobs (one drawn per job, its episodes in
order), for as many jobs as it measured, and its results per hour set beside the
measured ones. Plain Python, an event per part boundary: seconds per run, not a sweep's
speed.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy import optimize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from across_concurrency import measured  # noqa: E402

GRID_S = 0.005  # the fit's moments


@dataclass(frozen=True)
class Sharing:
    """Max-min fair shares of ``cores`` among timed threads and engine threads."""

    cores: float = 2.0
    engine_threads: int = 2
    engine_cores: tuple[float, float, float] = (1.13, 1.30, 1.67)  # at batch 1, 4, 16

    def engine_demand(self, batch: int) -> float:
        return float(np.interp(batch, (1, 4, 16), self.engine_cores)) if batch > 0 else 0.0

    def rates(self, n_timed: int, batches: list[int]) -> tuple[float, list[float]]:
        """The rate of every timed part (its share of the core it wants) and of each
        engine's decode (its share of its demand; 1 where it is not decoding)."""
        wants = [1.0] * n_timed
        for b in batches:
            if b > 0:
                wants += [self.engine_demand(b) / self.engine_threads] * self.engine_threads
        got = np.asarray(wants)
        if got.sum() > self.cores:  # water-filling: the level every unsatisfied thread gets
            left, level = self.cores, np.inf
            for i, want in enumerate(np.sort(got)):
                share = left / (len(got) - i)
                if want > share:
                    level = share
                    break
                left -= want
            got = np.minimum(got, level)
        timed = float(got[0]) if n_timed else 1.0
        engines, i = [], n_timed
        for b in batches:
            if b > 0:
                share = float(got[i : i + self.engine_threads].sum())
                engines.append(share / self.engine_demand(b))
                i += self.engine_threads
            else:
                engines.append(1.0)
        return min(timed, 1.0), engines


def timeline(eps: pd.DataFrame, workers: pd.Series, g: int) -> tuple[np.ndarray, ...]:
    """The run's moments: the grid, the sessions in timed parts, each worker's batch and
    the context its batch holds."""
    grid = np.arange(eps["start_time"].min(), eps["end_time"].max(), GRID_S)
    timed, batch, held = np.zeros(len(grid)), np.zeros((g, len(grid))), np.zeros((g, len(grid)))
    for _, ep in eps.iterrows():
        timed[(grid >= ep["start_time"]) & (grid < ep["end_time"])] += 1
        w = int(workers.get(ep["job_id"], 0))
        turns = zip(ep["turn_start"], ep["turn_gen_s"], ep["turn_tokens_in"],
                    ep["turn_tokens_out"], strict=True)  # fmt: skip
        for s, d, tin, tout in turns:
            on = (grid >= s) & (grid < s + d)
            timed[on] -= 1
            batch[w, on] += 1
            held[w, on] += tin + tout / 2
    return grid, timed, batch, held


def fit(run: Path, sharing: Sharing, engine: dict | None = None):
    """The fit run's episodes as parts of uncontended work, and the step's ``a, s, k``."""
    eps = pd.read_parquet(run / "episodes.parquet").sort_values(["job_id", "start_time"])
    jobs = pd.read_parquet(run / "jobs.parquet").set_index("job_id")
    g = int(json.loads((run / "meta.json").read_text())["config"]["workers"])
    workers = jobs["worker"] if "worker" in jobs else pd.Series(dtype=int)
    grid, timed, batch, held_at = timeline(eps, workers, g)

    def mean_rates(a: float, b: float, w: int) -> tuple[float, float]:
        idx = np.flatnonzero((grid >= a) & (grid < b))[::4]
        if not len(idx):
            return 1.0, 1.0
        both = [sharing.rates(int(round(timed[i])), [int(round(x)) for x in batch[:, i]])
                for i in idx]  # fmt: skip
        return float(np.mean([t for t, _ in both])), float(np.mean([e[w] for _, e in both]))

    parts, x, y = [], [], []
    for _, ep in eps.iterrows():
        w = int(workers.get(ep["job_id"], 0))
        t0, t1 = ep["start_time"], ep["start_time"] + ep["sandbox_start_s"]
        work = [("timed", ep["sandbox_start_s"] * mean_rates(t0, t1, w)[0])]
        prev = t1
        turns = zip(ep["turn_start"], ep["turn_gen_s"], ep["turn_tokens_in"],
                    ep["turn_tokens_out"], strict=True)  # fmt: skip
        for s, d, tin, tout in turns:
            if s > prev:
                work.append(("timed", (s - prev) * mean_rates(prev, s, w)[0]))
            if tout > 0:
                on = (grid >= s) & (grid < s + d)
                b = batch[w, on].mean() if on.any() else 1.0
                held = held_at[w, on].mean() if on.any() else tin + tout / 2
                x.append([1.0, b - 1.0, held])
                y.append(d * mean_rates(s, s + d, w)[1] / tout)
            work.append(("decode", float(tout), tin + tout / 2))
            prev = s + d
        verify_at = ep["end_time"] - ep["verify_s"]
        if verify_at > prev:
            work.append(("timed", (verify_at - prev) * mean_rates(prev, verify_at, w)[0]))
        work.append(("timed", ep["verify_s"] * mean_rates(verify_at, ep["end_time"], w)[0]))
        parts.append((ep["job_id"], work))
    if engine is None:
        coef, _ = optimize.nnls(np.asarray(x), np.asarray(y))
    else:
        step = engine["curve"]["step_s"]
        top = engine["curve"]["batch"][-1]
        coef = np.array([step[0], (step[-1] - step[0]) / max(top - 1, 1),
                         engine.get("context_s_per_token", 0.0)])  # fmt: skip
    return parts, coef


def simulate(parts, coef, sharing: Sharing, c: int, g: int, d: int, jobs: int, seed: int):
    """Results per hour of ``jobs`` jobs (``jobs // g`` a worker) of ``d`` episodes over
    ``c`` sessions on each of ``g`` workers sharing the cores."""
    a, s, k = coef
    by_job: dict = {}
    for job, work in parts:
        by_job.setdefault(job, []).append(work)
    measured_jobs = list(by_job.values())
    rng = np.random.default_rng(seed)
    per_worker = max(1, jobs // g)

    def next_episode(job):
        if job["next"] >= d:
            return None
        work = job["source"][job["next"] % len(job["source"])]
        job["next"] += 1
        return {"work": work, "i": 0, "left": work[0][1]}

    def new_job():
        job = {"source": measured_jobs[rng.integers(len(measured_jobs))], "next": 0}
        job["sessions"] = [e for e in (next_episode(job) for _ in range(c)) if e is not None]
        return job

    running, done, t = [new_job() for _ in range(g)], [0] * g, 0.0
    while sum(done) < per_worker * g:
        n_timed, batches, held = 0, [], []
        for job in running:
            b = h = 0
            for ses in job["sessions"] if job else ():
                part = ses["work"][ses["i"]]
                if part[0] == "timed":
                    n_timed += 1
                else:
                    b, h = b + 1, h + part[2]
            batches.append(b)
            held.append(h)
        timed_rate, engine_rates = sharing.rates(n_timed, batches)
        steps = [(a + s * (max(b, 1) - 1) + k * h) / r
                 for b, h, r in zip(batches, held, engine_rates, strict=True)]  # fmt: skip
        dt = min(
            ses["left"] / timed_rate if ses["work"][ses["i"]][0] == "timed"
            else ses["left"] * steps[w]
            for w, job in enumerate(running) if job for ses in job["sessions"]
        )  # fmt: skip
        t += dt
        for w, job in enumerate(running):
            if job is None:
                continue
            still = []
            for ses in job["sessions"]:
                timed = ses["work"][ses["i"]][0] == "timed"
                ses["left"] -= dt * timed_rate if timed else dt / steps[w]
                if ses["left"] > 1e-9:
                    still.append(ses)
                    continue
                ses["i"] += 1
                if ses["i"] < len(ses["work"]):
                    ses["left"] = ses["work"][ses["i"]][1]
                    still.append(ses)
                elif (nxt := next_episode(job)) is not None:
                    still.append(nxt)
            job["sessions"] = still
            if not still:
                done[w] += 1
                running[w] = new_job() if done[w] < per_worker else None
    return 3600 * per_worker * g / t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("fit", type=Path)
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--cores", type=float, default=2.0)
    ap.add_argument("--engine-cores", default="1.13,1.30,1.67", help="at batch 1, 4, 16")
    ap.add_argument("--engine-threads", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--engine", type=Path, help="an engine spec (YAML) instead of the fit's")
    args = ap.parse_args(argv)
    demand = tuple(float(v) for v in args.engine_cores.split(","))
    if len(demand) != 3 or min(demand) <= 0:
        ap.error("--engine-cores takes three positive numbers (batch 1, 4, 16)")
    sharing = Sharing(args.cores, args.engine_threads, demand)  # type: ignore[arg-type]
    engine = yaml.safe_load(args.engine.read_text()) if args.engine else None
    parts, coef = fit(args.fit, sharing, engine)
    print(f"{args.fit}: step {coef[0] * 1e3:.3g} ms + {coef[1] * 1e3:.3g} ms a sequence + "
          f"{coef[2] * 1e6:.3g} us a token held")  # fmt: skip
    d = int(json.loads((args.fit / "meta.json").read_text())["config"]["episodes_per_job"])
    for run in args.runs:
        m = measured(run)
        c, g = m["concurrency"], m["workers"]
        got = np.mean([simulate(parts, coef, sharing, c, g, d, m["jobs"], seed)
                       for seed in range(args.seeds)])  # fmt: skip
        err = got / m["results_per_hour"] - 1
        print(f"{run}: C = {c}, G = {g}: measured {m['results_per_hour']:.1f}, "
              f"predicted {got:.1f} ({100 * err:+.1f} %)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
