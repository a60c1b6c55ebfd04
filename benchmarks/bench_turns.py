"""How much the turn model costs: the published 120-update run (G = 4, N = 30, 3,600 jobs of
256 episodes over 32 sessions) with job durations composed from episodes
(configs/sim/paper_async1.yaml) against the same run with the turn model
(configs/sim/paper_turns.yaml: a roofline engine), its turns drawn so that sessions
desynchronise as real ones do (about 8 turns of about 600 tokens, commands of about 1.6 s;
identical turns would end together and cost far fewer steps). The turn model runs twice:
its event loop as plain Python (STALENESS_SIM_NO_NUMBA=1, what runs without numba) and
compiled (numba, the ``fast`` extra), after a first call that compiles the kernel or
loads it from numba's cache (timed apart). Each ratio is from one run of each, on whatever machine
runs it; the target is at most 10x. With ``--repeats N`` every run is made N times, the
runs of the three ways taken in turn, and each way's fastest is kept (a run of job
durations takes a tenth of a second, so one run's time moves by 10 % with the machine).
The compiled loop splits each chunk's jobs across ``STALENESS_SIM_THREADS`` threads
(default: this process's cores, at most 8): wall seconds fall with more cores, CPU
seconds do not; both are reported (``"threads"`` in the JSON).

    python benchmarks/bench_turns.py [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from staleness_sim import load_scenario, simulate, summarize
from staleness_sim.cohort import engine
from staleness_sim.config import validate
from staleness_sim.core.settings import scenario_dict
from staleness_sim.durations import make_job
from staleness_sim.durations.kernel_threads import threads
from staleness_sim.durations.turn_kernel import plain

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    "episodes": ROOT / "configs" / "sim" / "paper_async1.yaml",
    "turns": ROOT / "configs" / "sim" / "paper_turns.yaml",
}


TURNS = {
    "count": {"dist": "lognormal", "median": 8, "sigma": 0.5, "cap": 16},
    "prompt_tokens": {"dist": "lognormal", "median": 4096, "sigma": 0.5, "cap": 14336},
    "reply_tokens": {"dist": "lognormal", "median": 512, "sigma": 0.8, "cap": 2048},
    "command_s": {"dist": "lognormal", "median": 1, "sigma": 1, "cap": 10},
    "timeout_s": 300,
}


def timed(path: Path) -> tuple[float, float, dict]:
    """Wall and CPU seconds of the run (CPU seconds: less moved by a shared machine's load)."""
    scenario = load_scenario(path)
    if scenario.job.turns is not None:
        data = scenario_dict(scenario)
        data["job"]["turns"] = TURNS
        scenario = validate(data, str(path))
    engine._STREAMS.clear()  # durations are kept per config and seed: time them afresh
    t0, c0 = time.perf_counter(), time.process_time()
    trace = simulate(scenario)
    return time.perf_counter() - t0, time.process_time() - c0, summarize(trace)


def first_call() -> float | None:
    """Seconds of the first compiled job in this process (numba compiles the kernel, or
    loads it from its cache); None where the compiled loop does not run."""
    job = make_job(load_scenario(CONFIGS["turns"]).job)
    if plain():
        return None
    t0 = time.perf_counter()
    job._simulate(np.random.default_rng(0), 1)  # one chunk
    return time.perf_counter() - t0


def fastest(runs: list[tuple[float, float, dict]]) -> tuple[float, float, dict]:
    """The run of least wall time (its CPU seconds and summary with it)."""
    return min(runs, key=lambda r: r[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1, help="runs of each way (the fastest kept)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    out = {"repeats": args.repeats, "threads": threads(), "first_call_s": first_call()}
    ways = ["python"] if out["first_call_s"] is None else ["python", "compiled"]
    runs: dict[str, list] = {"episodes": [], **{way: [] for way in ways}}
    for _ in range(args.repeats):
        runs["episodes"].append(timed(CONFIGS["episodes"]))
        for way in ways:
            os.environ["STALENESS_SIM_NO_NUMBA"] = "1" if way == "python" else "0"
            runs[way].append(timed(CONFIGS["turns"]))
        del os.environ["STALENESS_SIM_NO_NUMBA"]
    *out["episodes_s"], summary = fastest(runs["episodes"])
    out["episodes_jobs"] = summary["jobs_completed"]
    jobs = set()
    for way in ways:
        *out[f"turns_{way}_s"], summary = fastest(runs[way])
        jobs.add(summary["jobs_completed"])
    assert len(jobs) == 1, f"the ways completed different numbers of jobs: {jobs}"
    out["turns_jobs"] = jobs.pop()
    for way in ways:  # [wall, cpu]
        out[f"ratio_{way}"] = [
            a / b for a, b in zip(out[f"turns_{way}_s"], out["episodes_s"], strict=True)
        ]
    if args.json:
        print(json.dumps(out))
        return
    wall, cpu = out["episodes_s"]
    print(
        f"job durations: {wall:.2f} s ({cpu:.2f} s CPU), {out['episodes_jobs']} jobs; "
        f"turn model: {out['turns_jobs']} jobs, compiled on {out['threads']} thread(s)"
    )
    for way in ways:
        (wall, cpu), (r_wall, r_cpu) = out[f"turns_{way}_s"], out[f"ratio_{way}"]
        print(
            f"  {way}: {wall:.2f} s ({cpu:.2f} s CPU), ratio {r_wall:.1f}x "
            f"({r_cpu:.1f}x in CPU seconds; target <= 10x)"
        )
    if out["first_call_s"] is None:
        print("  compiled: numba does not import (the fast extra)")
    else:
        print(
            f"  first compiled call (compiles, or loads numba's cache): {out['first_call_s']:.2f} s"
        )


if __name__ == "__main__":
    main()
