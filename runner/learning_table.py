"""The schedule table of a folder of ES runs (scripts/learn_on_laptop.sh): one row per run
and one per schedule, held-out success at version 0 and the last, the gain with its standard
error, stale share, mean lag and wall time.

    python -m runner.learning_table RUNS_DIR     (prints both; writes schedules_runs.csv
                                                  and schedules.csv in RUNS_DIR)

Runs are the folders named ``<schedule>_s<seed>`` holding an ``eval.parquet`` and a
``summary.json``. Version 0 is the same model on the same tasks and seeds in every run, so
runs made with ``eval.initial: false`` take it from the folder's ``eval_base.parquet`` (the
script keeps there the first run's version-0 evaluation). The spread of a schedule is over
its training seeds (sample sd), which is the variation a reader of one training run should
expect; each run's own gain SE is over test tasks (runner.evaluation.success_gain).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd

from runner.evaluation import success_gain

# scripts/learn_on_laptop.sh's schedules, in the published table's order (others after)
ORDER = {"sync": 0, "bounded": 1, "cd4": 2, "cd8": 3, "cd8_half": 4}
RUN_NAME = re.compile(r"^(?P<schedule>.+)_s(?P<seed>\d+)$")
BASE = "eval_base.parquet"


def run_evals(run: Path) -> pd.DataFrame:
    """A run's evaluation rows, with version 0 from the folder's shared base evaluation
    where the run did not evaluate it itself."""
    evals = pd.read_parquet(run / "eval.parquet")
    base = run.parent / BASE
    if not (evals["version"] == 0).any() and base.is_file():
        evals = pd.concat([pd.read_parquet(base), evals], ignore_index=True)
    return evals


def run_row(run: Path) -> dict:
    """One finished run: its schedule and seed (from the folder name), held-out success at
    version 0 and the last, the gain and its SE, the trace's lag figures and wall time."""
    match = RUN_NAME.match(run.name)
    if match is None:
        raise ValueError(f"{run}: a run folder is named <schedule>_s<seed>")
    evals = run_evals(run)
    summary = json.loads((run / "summary.json").read_text())
    if not (evals["version"] == 0).any():
        raise ValueError(f"{run}: no version-0 evaluation (and no {BASE} beside it)")
    first, last = 0, int(evals["version"].max())
    per_seed = evals.groupby(["version", "seed"])["passed"].mean()
    gain = success_gain(evals, first, last)
    return {
        "schedule": match["schedule"],
        "seed": int(match["seed"]),
        "success_v0": per_seed.loc[first].mean(),
        "version": last,
        "success": per_seed.loc[last].mean(),
        "gain": gain["gain"],
        "gain_se": gain["se"],
        "tasks": gain["tasks"],
        "stale_fraction": summary["stale_fraction"],
        "mean_lag": summary["mean_lag"],
        "minutes": summary["wall_clock_s"] / 60,
    }


def finished(run: Path) -> bool:
    """A run whose last update has been evaluated (a run still going has a summary of the
    updates so far and, at most, its version-0 evaluation)."""
    try:
        updates = json.loads((run / "summary.json").read_text())["updates"]
        versions = pd.read_parquet(run / "eval.parquet", columns=["version"])["version"]
    except (OSError, KeyError, ValueError):
        return False
    return updates > 0 and int(versions.max()) == updates


def runs_table(work: Path) -> pd.DataFrame:
    """Every finished run under ``work``, by schedule (in :data:`ORDER`) and seed."""
    runs = sorted(p for p in work.iterdir() if RUN_NAME.match(p.name) and finished(p))
    if not runs:
        raise ValueError(
            f"{work}: no finished run (<schedule>_s<seed> with its last update evaluated)"
        )
    table = pd.DataFrame([run_row(run) for run in runs])
    order = table["schedule"].map(ORDER).fillna(len(ORDER))
    return (
        table.assign(_order=order)
        .sort_values(["_order", "schedule", "seed"])
        .drop(columns="_order")
        .reset_index(drop=True)
    )


def schedule_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per schedule, in the order the runs list them first: mean over training seeds, and
    the sample sd of the final success and of the gain over those seeds."""
    grouped = runs.groupby("schedule", sort=False)
    table = grouped.agg(
        seeds=("seed", "size"),
        success_v0=("success_v0", "mean"),
        success=("success", "mean"),
        success_sd=("success", "std"),
        gain=("gain", "mean"),
        gain_sd=("gain", "std"),
        stale_fraction=("stale_fraction", "mean"),
        mean_lag=("mean_lag", "mean"),
        minutes=("minutes", "mean"),
    )
    return table.reset_index()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m runner.learning_table RUNS_DIR", file=sys.stderr)
        return 2
    work = Path(args[0])
    try:
        runs = runs_table(work)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    table = schedule_table(runs)
    fmt = "{:.3f}".format
    print(runs.to_string(index=False, float_format=fmt))
    print()
    print(table.to_string(index=False, float_format=fmt))
    runs.to_csv(work / "schedules_runs.csv", index=False)
    table.to_csv(work / "schedules.csv", index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
