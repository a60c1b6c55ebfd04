"""Scenarios per second of ``staleness-sim sweep`` on the published setting, per backend.

The sweep: configs/sim/paper_async1.yaml (G = 4, N = 30, 256 episodes over 32 sessions,
120 updates) at 1,000 seeds by default; ``--workers 4 8 16 32 64`` spreads the same number
of scenarios over several worker counts. Target: 1,000 scenarios of the published setting
in under a minute on a 2-core machine.

    python benchmarks/bench_sweep.py [--n 1000] [--jobs N] [--backends local ray] [--workers G ...]

Prints, per backend: wall time, scenarios per second, and the speed-up over one process
running the scenarios back to back (measured on a sample); Ray's start-up is timed apart.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from staleness_sim.config import read_yaml, validate
from staleness_sim.sweeps.run import run_batch, run_sweep

REPO = Path(__file__).resolve().parents[1]


def sweep_of(n: int, workers: list[int]) -> dict:
    seeds = -(-n // len(workers))  # ceil: n scenarios, or a few more
    return {
        "name": "bench",
        "base": read_yaml(REPO / "configs" / "sim" / "paper_async1.yaml"),
        "grid": {"workers": workers},
        "seeds": list(range(seeds)),
    }


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (pool workers), user + system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def serial_rate(sweep: dict, sample: int = 20) -> tuple[float, float]:
    """Scenarios per second in this process, no pool (the baseline), and CPU s per scenario."""
    base = validate(sweep["base"])
    workers = sweep["grid"]["workers"]
    items = []
    for i in range(sample):
        sc = base.model_copy(update={"seed": 10_000 + i, "workers": workers[i % len(workers)]})
        items.append((str(i), sc.model_dump(mode="json", exclude_none=True)))
    run_batch(items[:2])  # warm up imports
    start, cpu = time.perf_counter(), cpu_seconds()
    run_batch(items)
    return sample / (time.perf_counter() - start), (cpu_seconds() - cpu) / sample


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="scenarios (default 1000)")
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--backends", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    ap.add_argument("--workers", type=int, nargs="+", default=[4], metavar="G")
    args = ap.parse_args()
    sweep = sweep_of(args.n, args.workers)
    n = len(args.workers) * len(sweep["seeds"])
    serial, serial_cpu = serial_rate(sweep)
    print(f"published setting at G = {args.workers}: {n} scenarios, {args.jobs} jobs")
    print(f"  load average now: {os.getloadavg()[0]:.1f} (other processes share these cores)")
    print(f"  one process, back to back: {serial:7.1f} scenarios/s, {serial_cpu:.3f} CPU s each")
    for backend in args.backends:
        extra = ""
        if backend == "ray":
            try:
                import ray
            except ImportError:
                print("  ray: not installed (pip install 'ray>=2.9'), skipped")
                continue
            os.environ.pop("RAY_ADDRESS", None)
            t0 = time.perf_counter()
            env = {"env_vars": {"PYTHONPATH": str(REPO)}}
            ray.init(
                num_cpus=args.jobs, include_dashboard=False, log_to_driver=False, runtime_env=env
            )
            extra = f" (+ {time.perf_counter() - t0:.1f} s Ray start-up)"
        with tempfile.TemporaryDirectory() as out:
            start, cpu = time.perf_counter(), cpu_seconds()
            result = run_sweep(sweep, out, jobs=args.jobs, backend=backend, progress=False)
            wall = time.perf_counter() - start
            cpu = (cpu_seconds() - cpu) / n
        if backend == "ray":
            ray.shutdown()
        assert result.ran == n
        rate = n / wall
        print(
            f"  {backend:5s}: {wall:6.1f} s for {n} = {rate:7.1f} scenarios/s{extra}; "
            f"{rate / serial:.2f}x one process; 1,000 in {1000 / rate:.1f} s"
        )
        if backend == "local":  # Ray's workers are not our children: their CPU is not seen
            idle = args.jobs / cpu
            print(
                f"         {cpu:.3f} CPU s per scenario (pool included); on {args.jobs} idle cores "
                f"that is {idle:.1f} scenarios/s, 1,000 in {1000 / idle:.0f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
