"""What the simulator takes from a measured run (:class:`RunModel`), as
:class:`ModelOptions` say: the job-duration model (the empirical distribution by default, a
fitted family, fitted episodes composed into jobs, or the turn model: ``turn_fit``), the
run's own costs (``update_seconds``, ``sync_seconds``, ``dispatch_seconds``), where the
jobs of one dispatch version move together a per-version factor, and the scenario they
make with the run's own settings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize

from staleness_sim.config import Scenario, parse_assignment, set_dotted, validate
from staleness_sim.core.trace import TraceError
from staleness_sim.validation.effects import solo_durations, split_by_group, start_groups
from staleness_sim.validation.run import (
    COMPLETED,
    MIN_JOBS,
    MeasuredRun,
    completed_jobs,
    job_durations,
    need_jobs,
    read_run,
)
from staleness_sim.validation.turn_fit import per_turn, run_cores, run_episodes, turn_job

DURATION_MODELS = ("empirical", "fitted", "episodes", "turns")
VERSION_EFFECT = ("auto", "on", "off")
VERSION_EFFECT_P = 0.05  # auto: a shared factor when the one-way ANOVA F test says so
GROUP_WINDOW = 0.25  # jobs of a version starting within this many median durations: a group


@dataclass(frozen=True)
class ModelOptions:
    """How a measured run becomes a scenario (``validate``, ``fit``, ``run --from-run``,
    ``validate --across``): the job-duration model (``durations``: empirical, fitted,
    episodes, turns), how a fitted family is ranked (``criterion``: aic, bic), the
    per-version factor (``version_effect``: auto, on, off), the workers sharing one machine
    that runs ``capacity`` jobs at full speed (contention across workers), and the CPUs
    each worker's containers and engine shared (``cores``, the turn model only): ``"run"``
    (the default) takes them from the run itself where it was a CPU run with per-turn
    records (:func:`~staleness_sim.validation.turn_fit.run_cores`), a number gives them,
    ``"off"`` shares none."""

    durations: str = "empirical"
    criterion: str = "aic"
    version_effect: str = "auto"
    capacity: float | None = None
    cores: float | str = "run"

    def __post_init__(self) -> None:
        if self.durations not in DURATION_MODELS:
            raise ValueError(f"durations must be one of {', '.join(DURATION_MODELS)}")
        if self.version_effect not in VERSION_EFFECT:
            raise ValueError(f"version_effect must be one of {', '.join(VERSION_EFFECT)}")
        if self.criterion not in ("aic", "bic"):
            raise ValueError(f"criterion must be aic or bic, got {self.criterion!r}")
        if self.capacity is not None and not self.capacity > 0:
            raise ValueError(f"capacity must be > 0, got {self.capacity}")
        if isinstance(self.cores, str):
            if self.cores not in ("run", "off"):
                raise ValueError(f"cores: a number, run or off, got {self.cores!r}")
            return
        if self.durations != "turns":
            raise ValueError("cores (a CPU shared within a worker) needs --durations turns")
        if self.capacity is not None:
            raise ValueError("give cores (within a worker) or capacity (across workers), not both")
        if not self.cores > 0:
            raise ValueError(f"cores must be > 0, got {self.cores}")

    def cores_of(self, run: MeasuredRun) -> float | None:
        """The cores a worker's CPU share gets for ``run`` (None: no shared CPU): given, or
        with ``"run"`` the run's own where the turn model fits a CPU run with per-turn
        records and no ``capacity``."""
        if self.durations != "turns" or self.cores == "off":
            return None
        if self.cores != "run":
            return float(self.cores)
        if self.capacity is not None or not per_turn(run_episodes(run)):
            return None
        return run_cores(run)


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


def model_from_run(run: MeasuredRun, options: ModelOptions | None = None) -> RunModel:
    """Fit the job-duration model and measure the run's costs from its trace, as
    ``options`` say (:class:`ModelOptions`; the defaults without).

    With ``capacity`` the workers share one machine (the scenario's ``contention``), and
    the measured durations are turned into solo durations first (:func:`solo_durations`).
    With cores (the turn model only) a worker's containers and engine shared that many
    CPUs moment by moment (the job's ``cpu``;
    :func:`~staleness_sim.validation.turn_fit.turn_job`).
    """
    o = options or ModelOptions()
    durations, criterion, version_effect, capacity = (
        o.durations, o.criterion, o.version_effect, o.capacity
    )  # fmt: skip
    values, censored, jobs = job_durations(run)
    need_jobs(run, len(values))
    if capacity is not None:
        if durations == "episodes":
            raise ValueError("capacity (contention) works with job durations, not episodes")
        solo = solo_durations(run, jobs, capacity)
        # the turn model takes each job's episodes at its solo pace
        scale = dict(zip(jobs["job_id"].astype(int), solo / np.maximum(values, 1e-12), strict=True))
        values = solo
    window = GROUP_WINDOW * float(np.median(values))
    factors, residuals, p = split_by_group(values, start_groups(jobs, window))
    use_effect = math.isfinite(p) and (
        version_effect == "on" or (version_effect == "auto" and p < VERSION_EFFECT_P)
    )
    if durations in ("episodes", "turns"):
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
            need_jobs(run, int((~censored).sum()), "uncensored job")
        spec, result = _fitted_spec(base, censored if censored.any() else None, criterion)
        table = result.table
        if censored.any():  # the run's own timeout: no job outlasted its longest cut one
            spec["cap"] = float(values[censored].max())
        job = {"duration": spec}
        what = f"{spec['dist']} fitted to {len(base)} job durations by {criterion.upper()}"
    elif durations == "turns":
        job, what = turn_job(run, scale if capacity is not None else None, o.cores_of(run))
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
    need_jobs(run, len(eps), "completed episode")
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
    options: ModelOptions | None = None,
) -> Scenario:
    """The scenario of a measured run, from its fitted durations and measured costs
    (:class:`ModelOptions`), with ``--set KEY=VALUE`` overrides (what-ifs: ``workers=16``,
    ``policy.max_lag=4``)."""
    run = read_run(folder)
    return run_scenario(run, model_from_run(run, options), sets, f"--from-run {folder}")


def run_scenario(
    run: MeasuredRun, model: RunModel, sets: list[str] | tuple[str, ...], source: str
) -> Scenario:
    """The run's scenario with ``--set KEY=VALUE`` overrides, validated (errors name
    ``source``)."""
    data = scenario_data(run, model)
    for key, value in (parse_assignment(s) for s in sets):
        set_dotted(data, key, value)
    return validate(data, source)
