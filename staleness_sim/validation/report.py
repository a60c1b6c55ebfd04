"""The validation report: a measured run's scenario simulated R times with independent
seeds, each metric of :func:`staleness_sim.core.metrics.summarize` of the measured trace
set beside the prediction (one function for both sides), and the lag distributions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from staleness_sim.cohort.engine import simulate
from staleness_sim.config import Scenario
from staleness_sim.core.metrics import lag_histogram, summarize
from staleness_sim.core.trace import Trace
from staleness_sim.validation.model import ModelOptions, RunModel, model_from_run, run_scenario
from staleness_sim.validation.run import MeasuredRun, read_run

# (metric, error kind): relative for rates and times, absolute for fractions and counts
METRICS: tuple[tuple[str, str], ...] = (
    ("results_per_hour", "relative"),
    ("updates_per_hour", "relative"),
    ("wall_clock_s", "relative"),
    ("worker_idle_fraction", "absolute"),
    ("stale_fraction", "absolute"),
    ("data_utilization", "absolute"),
    ("results_discarded", "absolute"),
)
INTERVAL = (0.05, 0.95)  # the predicted 90 % interval over replicates


@dataclass
class Validation:
    run: MeasuredRun
    model: RunModel
    scenario: Scenario
    measured: dict[str, Any]
    predicted: list[dict[str, Any]]  # one summary per replicate
    table: pd.DataFrame  # metric, kind, measured, predicted, low, high, error, in_interval
    lag_tv_distance: float
    measured_lags: dict[int, float]
    predicted_lags: dict[int, float]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for row in self.table.itertuples(index=False):
            m = row.metric
            out[f"{m}_measured"] = _plain(row.measured)
            out[f"{m}_predicted"] = _plain(row.predicted)
            out[f"{m}_interval"] = [_plain(row.low), _plain(row.high)]
            out[f"{m}_error"] = _plain(row.error)
            out[f"{m}_error_kind"] = row.kind
            out[f"{m}_in_interval"] = bool(row.in_interval)
        out["lag_tv_distance"] = self.lag_tv_distance
        out["measured_lag_distribution"] = {str(k): v for k, v in self.measured_lags.items()}
        out["predicted_lag_distribution"] = {str(k): v for k, v in self.predicted_lags.items()}
        out["run"] = str(self.run.folder)
        out["source"] = self.run.source
        out["replicates"] = len(self.predicted)
        out["durations"] = self.model.durations
        out["duration_model"] = self.model.description
        out["jobs_fitted"] = self.model.n_jobs
        out["jobs_censored"] = self.model.n_censored
        out["update_seconds"] = self.model.update_seconds
        out["sync_seconds"] = self.model.sync_seconds
        out["dispatch_seconds"] = self.model.dispatch_seconds
        out["version_effect"] = self.model.version_effect is not None
        out["version_effect_p"] = _plain(self.model.version_effect_p)
        out["capacity"] = self.model.capacity
        return out

    def format(self) -> str:
        lines = [
            f"run          {self.run.folder} (source: {self.run.source})",
            f"durations    {self.model.description}; {self.model.n_censored} censored",
            f"costs        update {self.model.update_seconds:.4g} s, sync "
            f"{self.model.sync_seconds:.4g} s per missed update, dispatch "
            f"{self.model.dispatch_seconds:.4g} s per job",
            f"replicates   {len(self.predicted)} (predicted: mean and 90 % interval)",
            "",
        ]
        rows = []
        for r in self.table.itertuples(index=False):
            err = f"{100 * r.error:+.1f} %" if r.kind == "relative" else f"{r.error:+.3f}"
            if r.metric == "results_discarded":
                err = f"{r.error:+.1f}"
            rows.append(
                (
                    r.metric,
                    _fmt(r.measured),
                    _fmt(r.predicted),
                    f"[{_fmt(r.low)}, {_fmt(r.high)}]",
                    err,
                    "yes" if r.in_interval else "NO",
                )
            )
        head = ("metric", "measured", "predicted", "90 % interval", "error", "in interval")
        widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
        for row in [head, *rows]:
            lines.append("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)))
        lags = sorted(set(self.measured_lags) | set(self.predicted_lags))
        dist = ", ".join(
            f"{k}: {self.measured_lags.get(k, 0):.3f} / {self.predicted_lags.get(k, 0):.3f}"
            for k in lags
        )
        lines += [
            "",
            f"lag distribution of accepted results (measured / predicted): {dist or '-'}",
            f"lag TV distance  {self.lag_tv_distance:.4f}",
        ]
        return "\n".join(lines)


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}"


def _plain(x: Any) -> Any:
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return None if math.isnan(x) else x
    if isinstance(x, np.integer):
        return int(x)
    return x


def lag_distribution(hist: dict[int, int]) -> dict[int, float]:
    total = sum(hist.values())
    return {int(k): v / total for k, v in sorted(hist.items())} if total else {}


def tv_distance(p: dict[int, float], q: dict[int, float]) -> float:
    """Total-variation distance of two distributions on the integers: 1/2 sum |p - q|."""
    keys = set(p) | set(q)
    return 0.5 * float(sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys))


def error_of(kind: str, predicted: float, measured: float) -> float:
    if kind == "relative":
        return (predicted - measured) / measured if measured else math.nan
    return predicted - measured


def validate_run(
    folder: str | Path,
    replicates: int = 20,
    options: ModelOptions | None = None,
    sets: list[str] | tuple[str, ...] = (),
) -> Validation:
    """Replay a measured run's scenario (its model as ``options`` say) ``replicates`` times
    and compare every metric."""
    if replicates < 1:
        raise ValueError(f"--replicates must be >= 1, got {replicates}")
    run = read_run(folder)
    model = model_from_run(run, options)
    scenario = run_scenario(run, model, sets, f"{folder}")
    measured = summarize(run.trace)
    predicted = []
    for seed in range(replicates):
        trace = simulate(scenario.model_copy(update={"seed": seed}))
        predicted.append(summarize(trace))
    rows = []
    for metric, kind in METRICS:
        values = np.array([float(s[metric]) for s in predicted])
        meas = float(measured[metric])
        low, high = (float(q) for q in np.quantile(values, INTERVAL))
        mean = float(values.mean())
        tol = 1e-9 * max(1.0, abs(meas))
        rows.append(
            {
                "metric": metric,
                "kind": kind,
                "measured": meas,
                "predicted": mean,
                "low": low,
                "high": high,
                "error": error_of(kind, mean, meas),
                "in_interval": bool(low - tol <= meas <= high + tol),
            }
        )
    pooled: dict[int, int] = {}
    for s in predicted:
        for k, v in s["lag_hist"].items():
            pooled[int(k)] = pooled.get(int(k), 0) + int(v)
    measured_lags = lag_distribution(lag_histogram(_accepted_lags(run.trace)))
    predicted_lags = lag_distribution(pooled)
    return Validation(
        run=run,
        model=model,
        scenario=scenario,
        measured=measured,
        predicted=predicted,
        table=pd.DataFrame(rows),
        lag_tv_distance=tv_distance(measured_lags, predicted_lags),
        measured_lags=measured_lags,
        predicted_lags=predicted_lags,
    )


def _accepted_lags(trace: Trace) -> pd.Series:
    jobs = trace.jobs
    return jobs.loc[jobs["verdict"] == "accepted", "lag"]
