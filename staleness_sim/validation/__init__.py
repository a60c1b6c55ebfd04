"""Validation against measured runs: replay a run's scenario through the simulator and
report the error of every prediction.

``read_run(folder)`` reads a measured trace (the runner's run directory, or any folder with
the three trace tables and a ``meta.json`` naming the scenario); ``model_from_run`` fits
what the simulator needs from it: the job-duration model (the empirical distribution by
default, a fitted family, or fitted episodes composed into jobs), the run's own costs
(``update_seconds``, ``sync_seconds``, ``dispatch_seconds``) and, where the jobs of one
dispatch version move together, a per-version factor. ``validate_run`` simulates the
scenario R times with independent seeds and sets each metric of
:func:`staleness_sim.core.metrics.summarize` of the measured trace beside the prediction: one
function for both sides.

Durations, the conventions:

* Only completed jobs count: a ``cancelled`` job (the run ended, a resume, a crash) has an
  end time that is not a duration.
* A job holding an episode cut by its timeout (``episodes.parquet``: ``timed_out``) has a
  duration that is a lower bound: the fitted family treats it as right-censored (and is
  capped at the longest such job, the run's own timeout); the empirical law resamples it
  as measured, which is what the same timeout gives again.
* ``empirical`` is the default: validation asks whether the *scheduling* model is right,
  and resampling the measured durations keeps a family's misfit out of that answer; a
  fitted family (``fitted``, by AIC) is for extrapolating beyond the measured range.
* ``episodes`` fits episode durations (censored at the timeout) and composes D of them over
  C sessions, the simulator's episodic job. It assumes independent episodes, which batched
  sessions of one job are not; it is there to show that difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

from staleness_sim.cohort.engine import simulate
from staleness_sim.config import Scenario, parse_assignment, set_dotted, validate
from staleness_sim.core.metrics import lag_histogram, summarize
from staleness_sim.core.trace import Trace, TraceError

__all__ = [
    "METRICS",
    "MeasuredRun",
    "RunModel",
    "Validation",
    "estimate_capacity",
    "job_durations",
    "model_from_run",
    "plot_lags",
    "plot_metrics",
    "read_run",
    "scenario_from_run",
    "validate_run",
    "write_plots",
]

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
DURATION_MODELS = ("empirical", "fitted", "episodes")
VERSION_EFFECT = ("auto", "on", "off")
SCENARIO_KEYS = ("workers", "cohort", "updates", "policy")
MIN_JOBS = 2  # what a duration fit needs
VERSION_EFFECT_P = 0.05  # auto: a shared factor when the one-way ANOVA F test says so
GROUP_WINDOW = 0.25  # jobs of a version starting within this many median durations: a group
INTERVAL = (0.05, 0.95)  # the predicted 90 % interval over replicates
COMPLETED = ("accepted", "discarded", "deferred")


@dataclass
class MeasuredRun:
    """A measured (or simulated) trace and what its folder says about the run."""

    folder: Path
    trace: Trace
    scenario: dict[str, Any]  # name, seed, workers, cohort, updates, policy, drain_every
    config: dict[str, Any] = field(default_factory=dict)  # the runner's full config, if any
    episodes: pd.DataFrame | None = None

    @property
    def source(self) -> str:
        return str(self.trace.meta.get("source", "unknown"))

    @property
    def episode_timeout(self) -> float | None:
        t = self.config.get("episode_timeout_s")
        return float(t) if t is not None else None


def read_run(folder: str | Path) -> MeasuredRun:
    """Read a run directory; a TraceError (one line) says what is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceError(f"{folder}: no such run directory")
    try:
        trace = Trace.read(folder)
    except TraceError as e:
        raise TraceError(f"{folder}: not a trace: {e}") from None
    if "end_time" in trace.jobs and trace.jobs.empty:
        raise TraceError(f"{folder}: not a trace: the jobs table is empty")
    meta = trace.meta
    if not meta:
        raise TraceError(f"{folder}: missing meta.json (it names the run's scenario)")
    scenario = dict(meta.get("scenario") or {})
    missing = [k for k in SCENARIO_KEYS if k not in scenario]
    if missing:
        raise TraceError(f"{folder}: meta.json scenario lacks {', '.join(missing)}")
    episodes = None
    path = folder / "episodes.parquet"
    if path.exists():
        episodes = pd.read_parquet(path)
        need = [c for c in ("job_id", "duration_s", "timed_out") if c not in episodes]
        if need:
            raise TraceError(f"{path}: lacks column(s): {', '.join(need)}")
    return MeasuredRun(folder, trace, scenario, dict(meta.get("config") or {}), episodes)


# -- durations --------------------------------------------------------------------------


def completed_jobs(run: MeasuredRun) -> pd.DataFrame:
    """Jobs that finished (accepted, discarded, deferred) with both times, in id order."""
    jobs = run.trace.jobs
    done = jobs[jobs["verdict"].isin(COMPLETED)].dropna(subset=["start_time", "end_time"])
    return done.sort_values("job_id", kind="stable")


def job_durations(run: MeasuredRun) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """(durations, censored, jobs) of the completed jobs; censored jobs hold an episode cut
    by its timeout, so their duration is a lower bound."""
    jobs = completed_jobs(run)
    durations = (jobs["end_time"] - jobs["start_time"]).to_numpy(dtype=float)
    censored = np.zeros(len(jobs), bool)
    if run.episodes is not None and len(run.episodes):
        cut = run.episodes.loc[run.episodes["timed_out"].astype(bool), "job_id"]
        censored = jobs["job_id"].isin(set(cut)).to_numpy()
    return durations, censored, jobs


def _need_jobs(run: MeasuredRun, n: int, what: str = "completed job") -> None:
    if n < MIN_JOBS:
        raise TraceError(
            f"{run.folder}: {n} {what}{'s' if n != 1 else ''} (cancelled ones excluded); "
            f"a duration fit needs at least {MIN_JOBS}"
        )


def start_groups(jobs: pd.DataFrame, window: float) -> np.ndarray:
    """The engine's ``version_effect`` groups of measured jobs: the first job of a version
    to start opens a group, the jobs of that version starting within ``window`` s of it
    join, a later one opens the next group. Returns a group number per row of ``jobs``."""
    order = jobs.sort_values("start_time", kind="stable")
    opened: dict[int, tuple[float, int]] = {}
    out = pd.Series(0, index=jobs.index)
    n = 0
    for idx, v, t in zip(order.index, order["dispatch_version"], order["start_time"], strict=True):
        g = opened.get(int(v))
        if g is None or t - g[0] >= window:
            g = opened[int(v)] = (float(t), n)
            n += 1
        out[idx] = g[1]
    return out.loc[jobs.index].to_numpy()


def split_by_group(durations: np.ndarray, groups: np.ndarray):
    """Method-of-moments split of durations into one factor per group and residuals.

    Returns (factors, residuals, p). ``factors``: one per group, its mean over the overall
    mean, shrunk towards 1 so that their variance is the between-group component only
    (the one-way random-effects ANOVA estimate), then divided by their mean. ``residuals``: the durations of groups of
    two or more with their group's factor taken out, deviations rescaled by
    sqrt(n / (n - 1)) so a small group does not understate the spread (a lone job carries
    no information on it). ``p``: the one-way ANOVA F test's p-value for equal group
    means (NaN with fewer than two groups of two or more).
    """
    frame = pd.DataFrame({"d": durations, "g": groups})
    grand = float(frame["d"].mean())
    by = frame.groupby("g")["d"]
    means, sizes = by.mean(), by.size()
    multi = [g.to_numpy() for _, g in by if len(g) >= 2]
    if len(multi) < 2:
        return np.ones(len(means)), durations.copy(), math.nan
    p = float(stats.f_oneway(*multi).pvalue)
    within = sum(float(((g - g.mean()) ** 2).sum()) for g in multi) / sum(len(g) - 1 for g in multi)
    spread = float(means.var(ddof=1))
    between = max(0.0, spread - within * float((1.0 / sizes).mean()))
    shrink = math.sqrt(between / spread) if spread > 0 else 0.0
    factors = np.maximum(1.0 + (means.to_numpy() / grand - 1.0) * shrink, 1e-6)
    factors /= factors.mean()  # a drawn factor has mean 1: the mean duration is kept
    m = frame["g"].map(means).to_numpy()
    n = frame["g"].map(sizes).to_numpy()
    keep = n >= 2
    scale = np.sqrt(n[keep] / (n[keep] - 1))
    residuals = grand * (1.0 + (durations[keep] / m[keep] - 1.0) * scale)
    return factors, np.maximum(residuals, 1e-9), p


def solo_durations(run: MeasuredRun, jobs: pd.DataFrame, capacity: float) -> np.ndarray:
    """The solo work of each of ``jobs`` under the contention model: the integral over its
    run of min(1, capacity / k(t)), with k(t) the jobs running at time t in the trace."""
    every = run.trace.jobs.dropna(subset=["start_time", "end_time"])
    starts = every["start_time"].to_numpy(float)
    ends = every["end_time"].to_numpy(float)
    times = np.unique(np.concatenate([starts, ends]))
    # jobs running in [times[i], times[i + 1])
    k = np.searchsorted(np.sort(starts), times[:-1], side="right") - np.searchsorted(
        np.sort(ends), times[:-1], side="right"
    )
    rate = np.where(k > 0, np.minimum(1.0, capacity / np.maximum(k, 1)), 1.0)
    work = np.concatenate([[0.0], np.cumsum(rate * np.diff(times))])
    s = jobs["start_time"].to_numpy(float)
    e = jobs["end_time"].to_numpy(float)
    return np.interp(e, times, work) - np.interp(s, times, work)


def estimate_capacity(folders: list[str | Path], low: float = 1.0, high: float = 64.0) -> float:
    """The machine's capacity (``contention``) from runs of one setup at different worker
    counts: the value that makes their mean solo durations agree (least squares on the
    log means, searched on a grid then refined). Needs runs whose jobs ran at different
    numbers of busy workers, e.g. one with G = 1 and one with G = 2. A capacity below 1
    would only rescale solo durations, so the search starts at 1."""
    runs = [read_run(f) for f in folders]
    jobs = [job_durations(r)[2] for r in runs]
    for r, j in zip(runs, jobs, strict=True):
        _need_jobs(r, len(j))

    def loss(log_c: float) -> float:
        c = math.exp(log_c)
        m = np.log([solo_durations(r, j, c).mean() for r, j in zip(runs, jobs, strict=True)])
        return float(((m - m.mean()) ** 2).sum())

    grid = np.linspace(math.log(low), math.log(high), 200)
    best = grid[int(np.argmin([loss(g) for g in grid]))]
    step = grid[1] - grid[0]
    bounds = (max(grid[0], best - step), min(grid[-1], best + step))
    found = optimize.minimize_scalar(loss, bounds=bounds, method="bounded")
    return float(math.exp(found.x))


@dataclass
class RunModel:
    """What the simulator takes from a measured run."""

    job: dict[str, Any]  # the scenario's job spec
    update_seconds: float
    sync_seconds: float
    dispatch_seconds: float
    version_effect: dict[str, Any] | None
    durations: str
    n_jobs: int
    n_censored: int
    version_effect_p: float
    description: str
    fit_table: pd.DataFrame | None = None
    capacity: float | None = None

    def scenario_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job,
            "update_seconds": self.update_seconds,
            "sync_seconds": self.sync_seconds,
        }
        if self.dispatch_seconds > 0:
            out["dispatch_seconds"] = self.dispatch_seconds
        if self.version_effect is not None:
            out["version_effect"] = self.version_effect
        if self.capacity is not None:
            out["contention"] = {"capacity": self.capacity}
        return out


def _fitted_spec(values: np.ndarray, censored: np.ndarray | None, criterion: str):
    from staleness_sim.validation.fitting import fit_durations

    result = fit_durations(values, criterion=criterion, censored=censored)
    spec = result.best.model_dump(mode="json", exclude_none=True)
    return spec, result


def model_from_run(
    run: MeasuredRun,
    durations: str = "empirical",
    criterion: str = "aic",
    version_effect: str = "auto",
    capacity: float | None = None,
) -> RunModel:
    """Fit the job-duration model and measure the run's costs from its trace.

    With ``capacity`` the workers share one machine (the scenario's ``contention``), and
    the measured durations are turned into solo durations first (:func:`solo_durations`).
    """
    if durations not in DURATION_MODELS:
        raise ValueError(f"durations must be one of {', '.join(DURATION_MODELS)}")
    if version_effect not in VERSION_EFFECT:
        raise ValueError(f"version_effect must be one of {', '.join(VERSION_EFFECT)}")
    values, censored, jobs = job_durations(run)
    _need_jobs(run, len(values))
    if capacity is not None:
        if not capacity > 0:
            raise ValueError(f"capacity must be > 0, got {capacity}")
        if durations == "episodes":
            raise ValueError("capacity (contention) works with job durations, not episodes")
        values = solo_durations(run, jobs, capacity)
    window = GROUP_WINDOW * float(np.median(values))
    factors, residuals, p = split_by_group(values, start_groups(jobs, window))
    use_effect = math.isfinite(p) and (
        version_effect == "on" or (version_effect == "auto" and p < VERSION_EFFECT_P)
    )
    if durations == "episodes":
        use_effect = False  # episodes are composed into jobs; no shared factor there
    base = residuals if use_effect else values
    if durations == "fitted" and use_effect:
        censored = np.zeros(len(base), bool)  # residuals of cut jobs are not lower bounds
    table = None
    if durations == "empirical":
        job = {"duration": {"dist": "empirical", "values": [float(x) for x in base]}}
        what = f"empirical ({len(base)} job durations, resampled)"
    elif durations == "fitted":
        if (~censored).sum() < MIN_JOBS:
            _need_jobs(run, int((~censored).sum()), "uncensored job")
        spec, result = _fitted_spec(base, censored if censored.any() else None, criterion)
        table = result.table
        if censored.any():  # the run's own timeout: no job outlasted its longest cut one
            spec["cap"] = float(values[censored].max())
        job = {"duration": spec}
        what = f"{spec['dist']} fitted to {len(base)} job durations by {criterion.upper()}"
    else:
        job, table, what = _episodic_job(run, criterion)
    effect = None
    if use_effect:
        effect = {
            "factor": {"dist": "empirical", "values": [float(f) for f in factors]},
            "window": window,
        }
        what += (
            f"; a factor per version and start group (empirical, {len(factors)} groups "
            f"within {window:.3g} s, ANOVA p={p:.2g})"
        )
    if capacity is not None:
        what += f"; solo durations, {capacity:g} jobs at full speed (contention)"
    update_s, sync_s, dispatch_s = measured_costs(run)
    return RunModel(
        job=job,
        update_seconds=update_s,
        sync_seconds=sync_s,
        dispatch_seconds=dispatch_s,
        version_effect=effect,
        durations=durations,
        n_jobs=len(values),
        n_censored=int(censored.sum()),
        version_effect_p=p,
        description=what,
        fit_table=table,
        capacity=capacity,
    )


def _episodic_job(run: MeasuredRun, criterion: str):
    cfg = run.config
    if run.episodes is None or not len(run.episodes):
        raise TraceError(f"{run.folder}: durations 'episodes' needs episodes.parquet")
    if "episodes_per_job" not in cfg or "concurrency" not in cfg:
        raise TraceError(f"{run.folder}: meta.json config lacks episodes_per_job / concurrency")
    done = set(completed_jobs(run)["job_id"])
    eps = run.episodes[run.episodes["job_id"].isin(done)]
    _need_jobs(run, len(eps), "completed episode")
    spec, result = _fitted_spec(
        eps["duration_s"].to_numpy(dtype=float),
        eps["timed_out"].astype(bool).to_numpy() if eps["timed_out"].any() else None,
        criterion,
    )
    if run.episode_timeout is not None:
        spec["cap"] = run.episode_timeout
    d, c = int(cfg["episodes_per_job"]), int(cfg["concurrency"])
    job = {"episodes": d, "concurrency": c, "episode": spec}
    what = (
        f"{d} episodes over {c} sessions, episode {spec['dist']} fitted to {len(eps)} "
        f"episodes by {criterion.upper()}"
    )
    return job, result.table, what


def measured_costs(run: MeasuredRun) -> tuple[float, float, float]:
    """(update_seconds, sync_seconds, dispatch_seconds) measured from the trace.

    ``update_seconds``: mean time from a cohort's completion to its weights being
    available. For each started job, the latency is the time from the event that let it
    start (its worker's previous result landing, another result landing before its
    dispatch, its version's weights becoming available, or a segment starting) to its
    start; ``latency = dispatch_seconds + sync_seconds * missed updates`` is fitted by
    non-negative least squares (``missed``: versions since the worker's previous job).
    """
    updates = run.trace.updates
    update_s = 0.0
    if "commit_time" in updates and len(updates):
        gap = (updates["time"] - updates["commit_time"]).dropna()
        update_s = max(0.0, float(gap.mean())) if len(gap) else 0.0
    jobs = run.trace.jobs.dropna(subset=["start_time"]).sort_values("dispatch_time")
    if jobs.empty:
        return update_s, 0.0, 0.0
    all_jobs = run.trace.jobs
    landings = np.sort(
        all_jobs.loc[all_jobs["verdict"].isin(COMPLETED), "end_time"].dropna().to_numpy()
    )
    available = dict(zip(updates["version"], updates["time"], strict=False))
    starts = sorted(float(s.get("t", 0.0)) for s in run.trace.meta.get("segments", []))
    latency, missed = [], []
    prev: dict[int, tuple[float, int]] = {}
    for job in jobs.itertuples(index=False):
        w, v = int(job.worker), int(job.dispatch_version)
        prev_end, synced = prev.get(w, (0.0, 0))
        enable = [prev_end]
        k = np.searchsorted(landings, job.dispatch_time, side="right")
        if k:
            enable.append(float(landings[k - 1]))
        seg = [s for s in starts if s <= job.dispatch_time]
        if seg:
            enable.append(seg[-1])
        # served at the later landing (a measured dispatch may lag it), never before its
        # version's weights are available
        t0 = max(min(max(enable), float(job.dispatch_time)), available.get(v, 0.0) if v else 0.0)
        latency.append(float(job.start_time) - t0)
        missed.append(max(0, v - synced))
        end = job.end_time if pd.notna(job.end_time) else job.start_time
        prev[w] = (float(end), v)
    y = np.maximum(np.asarray(latency), 0.0)
    a = np.column_stack([np.ones(len(y)), np.asarray(missed, dtype=float)])
    (dispatch_s, sync_s), _ = optimize.nnls(a, y)
    return update_s, float(sync_s), float(dispatch_s)


# -- scenarios --------------------------------------------------------------------------


def scenario_data(run: MeasuredRun, model: RunModel) -> dict[str, Any]:
    sc = run.scenario
    data: dict[str, Any] = {
        "name": sc.get("name", run.folder.name),
        "seed": int(sc.get("seed", 0)),
        "workers": sc["workers"],
        "cohort": sc["cohort"],
        "updates": sc["updates"],
        "policy": sc["policy"],
        "drain_every": sc.get("drain_every", 0),
    }
    data.update(model.scenario_fields())
    return data


def scenario_from_run(
    folder: str | Path,
    sets: list[str] | tuple[str, ...] = (),
    durations: str = "empirical",
    criterion: str = "aic",
    version_effect: str = "auto",
    capacity: float | None = None,
) -> Scenario:
    """The scenario of a measured run, from its fitted durations and measured costs, with
    ``--set KEY=VALUE`` overrides (what-ifs: ``workers=16``, ``policy.max_lag=4``)."""
    run = read_run(folder)
    model = model_from_run(run, durations, criterion, version_effect, capacity)
    data = scenario_data(run, model)
    for key, value in (parse_assignment(s) for s in sets):
        set_dotted(data, key, value)
    return validate(data, f"--from-run {folder}")


# -- validation -------------------------------------------------------------------------


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
    durations: str = "empirical",
    criterion: str = "aic",
    version_effect: str = "auto",
    sets: list[str] | tuple[str, ...] = (),
    capacity: float | None = None,
) -> Validation:
    """Replay a measured run's scenario ``replicates`` times and compare every metric."""
    if replicates < 1:
        raise ValueError(f"--replicates must be >= 1, got {replicates}")
    run = read_run(folder)
    model = model_from_run(run, durations, criterion, version_effect, capacity)
    data = scenario_data(run, model)
    for key, value in (parse_assignment(s) for s in sets):
        set_dotted(data, key, value)
    scenario = validate(data, f"{folder}")
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


# -- figures ----------------------------------------------------------------------------


def plot_metrics(v: Validation):
    """Predicted against measured, one panel per metric: the replicates (dots, 90 %
    interval as a bar) and the measured value (a line)."""
    from matplotlib.figure import Figure

    n = len(v.table)
    cols = 4
    fig = Figure(figsize=(3.2 * cols, 3.0 * math.ceil(n / cols)), layout="constrained")
    axes = fig.subplots(math.ceil(n / cols), cols, squeeze=False).ravel()
    rng = np.random.default_rng(0)
    for ax, row in zip(axes, v.table.itertuples(index=False), strict=False):
        values = np.array([float(s[row.metric]) for s in v.predicted])
        ax.scatter(rng.uniform(-0.15, 0.15, len(values)), values, s=12, alpha=0.6, label="sim")
        ax.errorbar(
            [0.35],
            [row.predicted],
            yerr=[[max(0.0, row.predicted - row.low)], [max(0.0, row.high - row.predicted)]],
            fmt="o",
            color="C0",
            capsize=4,
        )
        ax.axhline(row.measured, color="C3", lw=2, label="measured")
        ax.set_xticks([])
        ax.set_xlim(-0.5, 0.6)
        err = f"{100 * row.error:+.1f} %" if row.kind == "relative" else f"{row.error:+.3f}"
        ax.set_title(f"{row.metric}\nerror {err}", fontsize=9)
    for ax in axes[n:]:
        ax.set_visible(False)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Predicted ({len(v.predicted)} replicates) vs measured: {v.run.folder.name}")
    return fig


def plot_lags(v: Validation):
    """The measured and predicted lag distributions of accepted results, side by side."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.4), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    lags = sorted(set(v.measured_lags) | set(v.predicted_lags)) or [0]
    for ax, dist, title, color in (
        (left, v.measured_lags, "measured", "C3"),
        (right, v.predicted_lags, f"predicted ({len(v.predicted)} replicates)", "C0"),
    ):
        ax.bar(lags, [dist.get(k, 0.0) for k in lags], color=color)
        ax.set_xticks(lags)
        ax.set_xlabel("lag of accepted results (updates)")
        ax.set_title(title)
    left.set_ylabel("fraction")
    fig.suptitle(f"Lag distributions (TV distance {v.lag_tv_distance:.3f})")
    return fig


def write_plots(v: Validation, folder: str | Path) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "validate_metrics.png", folder / "validate_lags.png"]
    plot_metrics(v).savefig(paths[0], dpi=110)
    plot_lags(v).savefig(paths[1], dpi=110)
    return paths
