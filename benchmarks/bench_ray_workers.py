"""The cost of Ray workers (``placement: ray``) against local ones, on the same short run.

The CPU configuration (configs/runner/cpu_tiny.yaml: tiny model, G = 2, N = 4, D = 4, C = 4,
3 turns), shortened to ``--updates`` updates, is trained ``--repeats`` times with each
placement, alternating, through ``es-runner train`` in this process (a Ray run starts and
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
import tempfile
import time
from pathlib import Path

from harness import run_figures, short_run_config

from runner.models import build_tiny_model


def one_run(config: Path, out: Path, placement: str) -> dict:
    from runner import cli

    t0 = time.perf_counter()
    args = ["train", str(config), "--out", str(out), "--set", f"placement={placement}"]
    with contextlib.redirect_stdout(io.StringIO()):  # the command's own summary table
        assert cli.main([*args, "--no-progress"]) == 0
    process_s = time.perf_counter() - t0
    fig = run_figures(out)
    return {
        "placement": placement,
        "wall_s": fig["wall_s"],
        "process_s": round(process_s, 2),
        **{
            k: fig[k]
            for k in (
                "jobs",
                "orchestrator_fraction",
                "dispatch_gap_s_mean",
                "sync_s_mean",
                "generation_s_per_episode",
                "container_s_per_episode",
            )
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = build_tiny_model(tmp / "tiny", seed=0, max_position_embeddings=4096)
        path = short_run_config(tmp, model, args.updates)
        rows: dict[str, list[dict]] = {"local": [], "ray": []}
        for i in range(args.repeats):
            for placement in ("local", "ray"):
                row = one_run(path, tmp / f"{placement}-{i}", placement)
                rows[placement].append(row)
                print(json.dumps({"run": row}), flush=True)

    def median(placement: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[placement])

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
