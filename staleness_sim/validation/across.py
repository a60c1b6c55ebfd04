"""Each of several measured runs predicted from each of the others (``staleness-sim validate
RUN RUN... --across``): what a user who made runs at several settings (sessions per worker,
workers) asks of the simulator, a model fitted to one run predicting another it was not
fitted to.

A run's model (:class:`~staleness_sim.validation.model.ModelOptions`) is fitted once, then
set to each other run's setting: its workers, and where the job model has them its
sessions per worker (``job.concurrency``), episodes per job (``job.episodes``) and, with a
shared CPU, the other run's cores per worker (``job.cpu.cores``). It is simulated for its
own run's updates ``replicates`` times (seeds 0 to R - 1); the mean results per hour is
the prediction. Two tables come out:

- the matrix: every run predicted from every other, the error against what that run
  measured, beside the run's own noise (one standard error of its results per hour, from
  its completed jobs' spans: results per hour is 3600 over the mean job time on one worker
  with no idle time, so its relative error is the mean's);
- pooled: runs of one setting (workers, sessions per worker, episodes per job) are
  repeats, and a shared machine drifts from one run to the next, so per ordered pair of
  settings the mean of the predictions from the runs of one against the mean of the
  measured runs of the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from staleness_sim.cohort.engine import simulate
from staleness_sim.core.metrics import summarize
from staleness_sim.validation.model import ModelOptions, model_from_run, run_scenario
from staleness_sim.validation.run import MeasuredRun, completed_jobs, read_run
from staleness_sim.validation.turn_fit import run_cores


@dataclass
class Measured:
    """One run as the comparison sees it."""

    name: str
    run: MeasuredRun
    workers: int
    concurrency: int | None
    episodes: int | None
    cores: float | None  # a worker's, on a CPU run
    results_per_hour: float
    noise: float  # one standard error of results_per_hour, relative

    @property
    def setting(self) -> str:
        parts = [f"G={self.workers}"]
        parts += [f"C={self.concurrency}"] if self.concurrency is not None else []
        parts += [f"D={self.episodes}"] if self.episodes is not None else []
        return " ".join(parts)


def measure(folder: str | Path) -> Measured:
    run = read_run(folder)
    done = completed_jobs(run)
    span = (done["end_time"] - done["start_time"]).to_numpy(float)
    noise = span.std(ddof=1) / span.mean() / math.sqrt(len(span)) if len(span) > 1 else math.nan
    cfg = run.config
    optional = lambda k: int(cfg[k]) if k in cfg else None  # noqa: E731
    return Measured(
        name=str(folder),
        run=run,
        workers=int(run.scenario["workers"]),
        concurrency=optional("concurrency"),
        episodes=optional("episodes_per_job"),
        cores=run_cores(run),
        results_per_hour=float(summarize(run.trace)["results_per_hour"]),
        noise=float(noise),
    )


def setting_sets(job: dict, target: Measured) -> list[str]:
    """The ``--set`` overrides that put a fitted model at ``target``'s setting."""
    sets = [f"workers={target.workers}"]
    if "concurrency" in job and target.concurrency is not None:
        sets.append(f"job.concurrency={target.concurrency}")
    if "episodes" in job and target.episodes is not None:
        sets.append(f"job.episodes={target.episodes}")
    if "cpu" in job and target.cores is not None:
        sets.append(f"job.cpu.cores={target.cores:g}")
    return sets


@dataclass
class Across:
    """The runs, the matrix and the pooled comparison (:func:`compare_runs`)."""

    runs: list[Measured]
    matrix: pd.DataFrame  # fit, run, predicted, measured, error, noise
    pooled: pd.DataFrame  # fit setting, setting, fits, runs, predicted, measured, error
    options: ModelOptions
    replicates: int

    def to_json(self) -> dict:
        rows = lambda t: t.to_dict(orient="records")  # noqa: E731
        return {
            "options": vars(self.options),
            "replicates": self.replicates,
            "runs": [
                {
                    "run": m.name,
                    "setting": m.setting,
                    "results_per_hour": m.results_per_hour,
                    "noise": m.noise,
                    "cores": m.cores,
                }
                for m in self.runs
            ],  # fmt: skip
            "matrix": rows(self.matrix),
            "pooled": rows(self.pooled),
        }

    def format(self) -> str:
        pct = lambda x: f"{100 * x:+.1f} %"  # noqa: E731
        m = self.matrix.assign(
            error=self.matrix["error"].map(pct), noise=self.matrix["noise"].map("{:.1%}".format)
        )
        p = self.pooled.assign(error=self.pooled["error"].map(pct))
        with pd.option_context("display.width", 200, "display.float_format", "{:.4g}".format):
            return (
                f"each run predicted from each other (results per hour; mean of "
                f"{self.replicates} simulations; durations {self.options.durations}):\n"
                f"{m.to_string(index=False)}\n\n"
                f"pooled (the mean of the predictions from one setting's runs against the mean "
                f"of the other setting's measured runs):\n{p.to_string(index=False)}"
            )


def compare_runs(
    folders: list[str | Path],
    options: ModelOptions | None = None,
    replicates: int = 20,
    sets: list[str] | tuple[str, ...] = (),
) -> Across:
    """Every run of ``folders`` predicted from every other (see the module's docstring);
    ``sets`` are applied to every prediction after the setting's."""
    if len(folders) < 2:
        raise ValueError("--across needs at least two runs")
    if replicates < 1:
        raise ValueError(f"--replicates must be >= 1, got {replicates}")
    options = options or ModelOptions()
    runs = [measure(f) for f in folders]
    settings = {m.setting: m for m in runs}  # a representative of each setting
    predicted: dict[tuple[str, str], float] = {}  # (fit run, target setting)
    for fit in runs:
        model = model_from_run(fit.run, options)
        updates = int(fit.run.scenario["updates"])
        for setting, target in settings.items():
            given = [f"updates={updates}", *setting_sets(model.job, target), *sets]
            scenario = run_scenario(fit.run, model, given, f"{fit.name} at {setting}")
            rates = [
                summarize(simulate(scenario.model_copy(update={"seed": s})))["results_per_hour"]
                for s in range(replicates)
            ]
            predicted[fit.name, setting] = float(np.mean(rates))
    matrix = pd.DataFrame(
        [
            {
                "fit": fit.name,
                "run": run.name,
                "fit setting": fit.setting,
                "setting": run.setting,
                "predicted": predicted[fit.name, run.setting],
                "measured": run.results_per_hour,
                "error": predicted[fit.name, run.setting] / run.results_per_hour - 1,
                "noise": run.noise,
            }
            for fit in runs
            for run in runs
            if fit is not run
        ]  # fmt: skip
    )
    pooled = []
    for a in settings:
        for b in settings:
            if a == b:
                continue
            fits = [m for m in runs if m.setting == a]
            seen = [m for m in runs if m.setting == b]
            pred = float(np.mean([predicted[f.name, b] for f in fits]))
            meas = float(np.mean([m.results_per_hour for m in seen]))
            pooled.append({"fit setting": a, "setting": b, "fits": len(fits), "runs": len(seen),
                           "predicted": pred, "measured": meas, "error": pred / meas - 1})  # fmt: skip
    columns = ["fit setting", "setting", "fits", "runs", "predicted", "measured", "error"]
    return Across(runs, matrix, pd.DataFrame(pooled, columns=columns), options, replicates)
