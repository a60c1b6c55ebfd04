"""Episodes per minute with generated tasks and the scripted reference-solution agent.

Usage: python benchmarks/bench_terminal.py [--episodes 32] [--concurrency 1 4 16] [--seed 0]
       [--agent solution|none]

Images are built (or taken from the cache) before timing, and their build times are
reported separately; the timed part is sandbox start, the agent turns, the verifier and
container removal. ``--agent none`` says done at once (an episode is then its sandbox and
its verifier, as with an agent that never runs a command). ``machine_cores_busy`` is the
whole machine's busy CPU seconds over the wall seconds (Linux): the cores the episodes
keep busy, docker's daemon and the containers included (the machine otherwise idle).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from runner.terminal.episode import make_client, run_episodes
from runner.terminal.generator.writer import write_tasks
from runner.terminal.images import ImageBuilder
from runner.terminal.loaders import load_task
from runner.terminal.protocol import ScriptedAgent


def busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat), or None."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--agent", choices=["solution", "none"], default="solution")
    args = ap.parse_args()

    client = make_client(pool=64)
    builder = ImageBuilder(client)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_tasks(Path(tmp), args.episodes, args.seed)
        tasks = [load_task(p) for p in paths]
        t0 = time.perf_counter()
        builds = [builder.ensure(t) for t in tasks]
        fresh = [b.seconds for b in builds if b.built]
        print(
            json.dumps(
                {
                    "images": len(builds),
                    "built_now": len(fresh),
                    "build_s_mean": round(statistics.mean(fresh), 3) if fresh else None,
                    "build_s_total": round(time.perf_counter() - t0, 2),
                }
            )
        )
        for conc in args.concurrency:
            agent = (
                ScriptedAgent.from_file if args.agent == "solution" else lambda _: ScriptedAgent([])
            )
            jobs = [(t, agent(t.solution)) for t in tasks]
            t0, busy0 = time.perf_counter(), busy_seconds()
            records = run_episodes(jobs, concurrency=conc, client=client, builder=builder)
            wall = time.perf_counter() - t0
            busy = busy_seconds()
            cores = None if busy is None or busy0 is None else round((busy - busy0) / wall, 2)
            ok = sum(r.reward for r in records)
            errors = [r.error for r in records if r.error]
            print(
                json.dumps(
                    {
                        "concurrency": conc,
                        "episodes": len(records),
                        "wall_s": round(wall, 2),
                        "episodes_per_min": round(60 * len(records) / wall, 1),
                        "reward_mean": round(ok / len(records), 3),
                        "container_start_s_median": round(
                            statistics.median(r.start_s for r in records), 3
                        ),
                        "episode_s_median": round(
                            statistics.median(r.duration_s for r in records), 3
                        ),
                        "machine_cores_busy": cores,
                        "errors": errors[:3],
                    }
                )
            )


if __name__ == "__main__":
    main()
