"""Held-out prediction across sessions per worker (docs/turns.md, "Across concurrency"):
measured CPU runs of one setup at several concurrencies C, each predicted from another
run's turn model at that C, with a shared CPU (``--cores``) moment by moment (``moment``)
or as a mean per job (``cpu``), without (``turns``), and by the run's empirical job
durations (which cannot change with C).

    python benchmarks/across_concurrency.py RUN_C1 RUN_C2 ... [--fit RUN] [--cores 2]
        [--engine ENGINE.yaml]

Each run's measured results per hour come with a standard error from its jobs' durations
(results per hour is 3600 / the mean job time on one worker with no idle time; the
error propagates the mean's), so a prediction's error can be set beside the noise.
Predictions are the mean of ``--seeds`` simulations of the measured run's length.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from staleness_sim import simulate
from staleness_sim.core.metrics import summarize
from staleness_sim.core.trace import TraceError
from staleness_sim.durations.engine_model import EngineSpec
from staleness_sim.validation import scenario_from_run
from staleness_sim.validation.turn_fit import engine_cpu_fields


def measured(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    meta = json.loads((run / "meta.json").read_text())
    jobs = pd.read_parquet(run / "jobs.parquet")
    # a job cancelled when the run ended stopped midway: its span is not a job's time
    done = jobs[
        jobs["verdict"].notna() & (jobs["verdict"] != "cancelled") & jobs["end_time"].notna()
    ]
    span = (done["end_time"] - done["start_time"]).to_numpy(float)
    rel_se = span.std(ddof=1) / span.mean() / math.sqrt(len(span)) if len(span) > 1 else math.nan
    return {
        "concurrency": int(meta["config"]["concurrency"]),
        "workers": int(meta["config"]["workers"]),
        "jobs": len(span),
        "results_per_hour": float(summary["results_per_hour"]),
        "rel_se": float(rel_se),
        "idle": float(summary["worker_idle_fraction"]),
        "busy": segments_mean(meta, "machine_busy_cores"),
        "process busy": segments_mean(meta, "process_busy_cores"),
    }


def segments_mean(meta: dict, key: str) -> float:
    """The mean of ``key`` over the run's segments (the cores busy, as the runner records
    them since runs of 2026-12-06; NaN before): near the machine's cores, the CPU was the
    bottleneck; the run's own process is the orchestrator and, with local workers, their
    engines."""
    values = [s[key] for s in meta.get("segments", []) if key in s]
    return float(np.mean(values)) if values else math.nan


def predicted(
    fit: Path,
    sets: list[str],
    how: str,
    cores: float | None,
    seeds: int,
    updates: int,
    engine: EngineSpec | None = None,
    engine_cpu: dict | None = None,
) -> dict:
    """Mean results per hour and idle fraction of ``seeds`` simulations of the run ``fit``
    with ``sets``: ``how`` is ``moment`` (the turn model with ``cores`` shared moment by
    moment, the engine wanting all of them), ``moment fitted`` (the same, what a timed part
    and the engine want fitted to the run's recorded busy cores: ``--cpu-share
    measured``; NaN for a run that recorded none), ``cpu`` (with ``job.cpu`` of ``cores``),
    ``turns`` (without) or ``empirical`` (the run's job durations: ``job.*`` sets dropped,
    as they cannot change them). ``engine`` replaces the decode curve fitted from the run
    (one measured apart, ``benchmarks/engine_curve.py``: taken as uncontended);
    ``engine_cpu`` the engine's own CPU demand (``--engine-cpu``; the moment ways only)."""
    sets = [f"updates={updates}", *sets]
    if how in ("moment", "moment fitted"):
        share = "measured" if how == "moment fitted" else "moment"
        try:
            scenario = scenario_from_run(
                fit, sets, "turns", cores=cores, cpu_share=share, engine_cpu=engine_cpu
            )
        except TraceError:  # moment fitted: a run from before the busy cores were recorded
            return {"results_per_hour": math.nan, "idle": math.nan}
    elif how == "empirical":
        sets = [s for s in sets if not s.startswith("job.")]
        scenario = scenario_from_run(fit, sets, "empirical")
    else:
        if how != "cpu":
            sets = [s for s in sets if not s.startswith("job.cpu")]
        scenario = scenario_from_run(fit, sets, "turns", cores=cores if how == "cpu" else None)
        if engine is not None:
            job = scenario.job.model_copy(update={"engine": engine})
            scenario = scenario.model_copy(update={"job": job})
    rows = [summarize(simulate(scenario.model_copy(update={"seed": s}))) for s in range(seeds)]
    return {
        "results_per_hour": float(np.mean([r["results_per_hour"] for r in rows])),
        "idle": float(np.mean([r["worker_idle_fraction"] for r in rows])),
    }


WAYS = ("moment", "moment fitted", "cpu", "turns", "empirical")  # as ``predicted`` knows them


def compare(
    row: dict,
    fit: Path,
    sets: list[str],
    cores: float,
    seeds: int,
    m: dict,
    engine: EngineSpec | None = None,
    engine_cpu: dict | None = None,
) -> dict:
    """``row`` with each way's prediction of the measured ``m``, its error and idle."""
    updates = json.loads((fit / "summary.json").read_text())["updates"]
    for how in WAYS:
        pr = predicted(fit, sets, how, cores, seeds, updates, engine, engine_cpu)
        row[how] = pr["results_per_hour"]
        row[f"{how} error"] = pr["results_per_hour"] / m["results_per_hour"] - 1
        row[f"{how} idle"] = pr["idle"]
    return row


def add_engine_cpu(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine-cpu",
        type=Path,
        help="the engine's own CPU demand (YAML, as staleness-sim's --engine-cpu) for moment",
    )


def read_engine_cpu(path: Path | None) -> dict | None:
    if path is None:
        return None
    return engine_cpu_fields(yaml.safe_load(path.read_text()), f"--engine-cpu {path}")


def show(rows: list[dict], as_json: bool) -> None:
    table = pd.DataFrame(rows)
    if as_json:
        print(table.to_json(orient="records"))
    else:
        with pd.option_context("display.width", 200, "display.float_format", "{:.3g}".format):
            print(table.to_string(index=False))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--fit", type=Path, action="append", help="run(s) to predict from (default all)")
    p.add_argument("--cores", type=float, default=2.0)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument(
        "--engine", type=Path, help="an engine spec (YAML) to use instead of the fitted curve"
    )
    add_engine_cpu(p)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    engine_cpu = read_engine_cpu(args.engine_cpu)
    engine = None
    if args.engine is not None:
        engine = EngineSpec.model_validate(yaml.safe_load(args.engine.read_text()))
    meas = {run: measured(run) for run in args.runs}
    rows = []
    for fit in args.fit or args.runs:
        fit_c = meas[fit]["concurrency"] if fit in meas else measured(fit)["concurrency"]
        for run, m in meas.items():
            if run == fit:
                continue
            row = {"fit": fit.name, "run": run.name, "fit C": fit_c, "C": m["concurrency"]}
            row |= {"measured": m["results_per_hour"]}
            row |= {"noise (1 SE)": m["rel_se"], "idle measured": m["idle"]}
            row |= {"busy cores measured": m["busy"], "process cores": m["process busy"]}
            sets = [f"job.concurrency={m['concurrency']}"]
            rows.append(compare(row, fit, sets, args.cores, args.seeds, m, engine, engine_cpu))
    show(rows, args.json)


if __name__ == "__main__":
    main()
