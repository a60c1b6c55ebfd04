"""The cost of live metrics per update, as a ratio from one real run.

Runs ``es-runner train`` (default: configs/runner/cpu_tiny.yaml) with every sink that is
installed among jsonl, tensorboard and console, then reads what the orchestrator measured
(``meta.json`` -> ``orchestrator.tracking_s``: computing the scalars, writing every sink, the
journal's ``logged`` line) and sets it against the run's own time per update. Both come
from the same run, so machine drift cancels. Or give ``--run RUN_DIR`` to read a run made
already (any run with ``logging.to`` set).

    python benchmarks/tracking_cost.py [--config FILE] [--updates N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def make_run(config: Path, updates: int, out: Path) -> Path:
    sinks = ["jsonl", "console"]
    try:
        import tensorboard  # noqa: F401

        sinks.append("tensorboard")
    except ImportError:
        print("tensorboard not installed: measuring jsonl and console only", file=sys.stderr)
    cmd = [
        "es-runner", "train", str(config), "--out", str(out), "--no-progress",
        "--set", f"updates={updates}", "--set", f"logging.to=[{', '.join(sinks)}]",
    ]  # fmt: skip
    print("$", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def cost(run: Path) -> dict:
    meta = json.loads((run / "meta.json").read_text())
    lines = len((run / "metrics.jsonl").read_text().splitlines())
    tracking = meta["orchestrator"]["tracking_s"]
    wall = meta["wall_clock_s"]
    n = meta["config"]["updates"]
    return {
        "run": str(run),
        "updates": n,
        "metric_lines": lines,
        "sinks": meta["config"]["logging"]["to"],
        "tracking_s": tracking,
        "tracking_ms_per_update": 1000 * tracking / n,
        "wall_s_per_update": wall / n,
        "ratio": tracking / wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=Path("configs/runner/cpu_tiny.yaml"))
    p.add_argument("--updates", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path(f"runs/tracking-cost-{int(time.time())}"))
    p.add_argument("--run", type=Path, help="read this run instead of making one")
    args = p.parse_args()
    run = args.run or make_run(args.config, args.updates, args.out)
    result = cost(run)
    print(json.dumps(result, indent=2))
    print(
        f"logging cost: {result['tracking_ms_per_update']:.2f} ms per update against "
        f"{result['wall_s_per_update']:.1f} s per update: ratio {result['ratio']:.2e}"
    )


if __name__ == "__main__":
    main()
