"""The runs of one sitting side by side, in the order given, to see the machine drift:
what each got, the CPU each result cost, how fast its parts ran, and the probe of the
machine taken before it (``benchmarks/cpu_probe.py --label "before NAME"``, read from
``probes.jsonl`` beside the runs).

    python benchmarks/sitting_drift.py RUN [RUN ...] [--probes PROBES.jsonl] [--json]

Core-seconds a result is the machine's busy cores times 3600 over results per hour: with
the same work to the token, a run that needs more of them got less from each busy core.
Ms a token is a session's generation seconds over its reply tokens (sessions of one
engine share each step, so this is the step time seen by one session); container seconds
an episode is the commands', the sandbox's start and the verifier's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
from across_concurrency import measured


def run_row(run: Path) -> dict:
    m = measured(run)
    eps = pd.read_parquet(run / "episodes.parquet")
    containers = eps["container_s"] + eps["sandbox_start_s"].fillna(0) + eps["verify_s"].fillna(0)
    return {
        "run": run.name,
        "G": m["workers"],
        "results per hour": m["results_per_hour"],
        "noise (1 SE)": m["rel_se"],
        "machine busy": m["busy"],
        "process busy": m["process busy"],
        "core-s a result": m["busy"] * 3600 / m["results_per_hour"],
        "ms a token": 1000 * eps["generation_s"].sum() / eps["tokens_out"].sum(),
        "container s an episode": containers.mean(),
    }


def read_probes(path: Path | None) -> dict[str, dict]:
    if path is None or not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["label"]: r for r in rows}


def spread(values: pd.Series) -> float:
    """(largest - smallest) / smallest: how far apart the runs of one G are."""
    return float(values.max() / values.min() - 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--probes", type=Path, help="default: probes.jsonl beside the first run")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    probes = read_probes(args.probes or args.runs[0].parent / "probes.jsonl")
    rows = []
    for run in args.runs:
        row = run_row(run)
        probe = probes.get(f"before {run.name}", {})
        row["probe torch"] = probe.get("torch", {}).get("ratio", float("nan"))
        row["probe python"] = probe.get("python", {}).get("ratio", float("nan"))
        rows.append(row)
    table = pd.DataFrame(rows)
    by_g = table.groupby("G").agg(
        runs=("run", "size"),
        **{
            "results per hour spread": ("results per hour", spread),
            "core-s a result spread": ("core-s a result", spread),
        },
    )
    if args.json:
        print(json.dumps({"runs": rows, "by_G": by_g.reset_index().to_dict("records")}))
        return
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.round(3).to_string(index=False))
        print()
        print(by_g.round(3).to_string())


if __name__ == "__main__":
    main()
