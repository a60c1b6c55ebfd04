"""The cost of Ray workers (``backend: ray``) against local ones, on the same short run.

The CPU configuration (configs/runner/cpu_tiny.yaml: tiny model, G = 2, N = 4, D = 4, C = 4,
3 turns), shortened to ``--updates`` updates, is trained ``--repeats`` times with each
backend, alternating, through ``es-runner train`` in this process (a Ray run starts and
stops its own local Ray instance, as the command does). Printed, one JSON line per run
and a summary line:

- ``wall_s``: the trace's run time (from the first dispatch, workers ready, to the last
  update), and ``process_s``: the whole command, worker start-up and Ray's included;
- ``orchestrator_fraction``: the orchestrator's own time (policy calls, journal, trace
  writes) over the run time; ``dispatch_gap_s_mean``: from a worker's result landing to
  its next job starting, its sync excluded (for Ray: the calls' round trips); ``sync_s_mean``
  per job (a remote call for Ray);
- ``generation_s_per_episode``, ``container_s_per_episode``: where an episode's time went;
- the summary: medians over the repeats, and the ratios ray / local.

Usage: python benchmarks/bench_ray_workers.py [--updates 3] [--repeats 2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout, uninstalled

from runner.models import build_tiny_model  # noqa: E402


def one_run(config: Path, out: Path, backend: str) -> dict:
    from runner import cli

    t0 = time.perf_counter()
    args = ["train", str(config), "--out", str(out), "--set", f"backend={backend}"]
    with contextlib.redirect_stdout(io.StringIO()):  # the command's own summary table
        assert cli.main([*args, "--no-progress"]) == 0
    process_s = time.perf_counter() - t0
    meta = json.loads((out / "meta.json").read_text())
    jobs = pd.read_parquet(out / "jobs.parquet")
    episodes = pd.read_parquet(out / "episodes.parquet")
    wall = float(pd.read_parquet(out / "updates.parquet")["time"].max())
    gaps = []
    ran = jobs.dropna(subset=["start_time", "end_time"]).sort_values("dispatch_time")
    for _, g in ran.groupby("worker"):
        gaps += list(
            g["start_time"].to_numpy()[1:]
            - g["end_time"].to_numpy()[:-1]
            - g["sync_s"].to_numpy()[1:]
        )
    orch = meta["orchestrator"]
    own_s = orch["controller_s"] + orch["journal_s"] + orch["flush_s"]
    return {
        "backend": backend,
        "wall_s": round(wall, 2),
        "process_s": round(process_s, 2),
        "jobs": len(jobs),
        "orchestrator_fraction": round(own_s / wall, 5),
        "dispatch_gap_s_mean": round(statistics.mean(gaps), 4) if gaps else None,
        "sync_s_mean": round(float(jobs["sync_s"].dropna().mean()), 4),
        "generation_s_per_episode": round(float(episodes["generation_s"].mean()), 3),
        "container_s_per_episode": round(float(episodes["container_s"].mean()), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from runner.terminal.generator.writer import write_tasks

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = build_tiny_model(tmp / "tiny", seed=0, max_position_embeddings=4096)
        config = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
        write_tasks(tmp / "tasks", 40, seed=0)
        config.update(
            updates=args.updates, eval_every=0, tasks={"dir": str(tmp / "tasks"), "split": "train"}
        )
        config["model"]["path"] = str(model)
        path = tmp / "run.yaml"
        path.write_text(yaml.safe_dump(config))
        rows: dict[str, list[dict]] = {"local": [], "ray": []}
        for i in range(args.repeats):
            for backend in ("local", "ray"):
                row = one_run(path, tmp / f"{backend}-{i}", backend)
                rows[backend].append(row)
                print(json.dumps({"run": row}), flush=True)

    def median(backend: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[backend])

    summary = {
        "updates": args.updates,
        "repeats": args.repeats,
        **{f"{k}_{b}": median(b, k) for k in ("wall_s", "process_s") for b in ("local", "ray")},
        "wall_ratio_ray_over_local": round(median("ray", "wall_s") / median("local", "wall_s"), 3),
        "process_ratio_ray_over_local": round(
            median("ray", "process_s") / median("local", "process_s"), 3
        ),
        **{
            f"{k}_{b}": round(median(b, k), 5)
            for k in (
                "orchestrator_fraction",
                "generation_s_per_episode",
                "container_s_per_episode",
            )
            for b in ("local", "ray")
        },
    }
    print(json.dumps({"summary": summary}))


if __name__ == "__main__":
    main()
