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

One module a job: ``run.py`` reads a measured run, ``effects.py`` the per-version factor and
contention, ``model.py`` the run's duration and cost model and its scenario (as
``ModelOptions`` say), ``report.py`` the :class:`Validation` and ``validate_run``,
``across.py`` runs predicted from each other (``validate --across``), ``turn_fit.py`` and
``moment_fit.py`` the turn model of a run, ``plots.py`` the figures, ``fitting.py`` the
maximum-likelihood duration fits. The names below are the public ones, importable from here.
"""

from __future__ import annotations

from staleness_sim.validation.effects import (
    estimate_capacity,
    solo_durations,
    split_by_group,
    start_groups,
)
from staleness_sim.validation.model import (
    DURATION_MODELS,
    GROUP_WINDOW,
    VERSION_EFFECT,
    VERSION_EFFECT_P,
    ModelOptions,
    RunModel,
    measured_costs,
    model_from_run,
    scenario_data,
    scenario_from_run,
)
from staleness_sim.validation.plots import plot_lags, plot_metrics, write_plots
from staleness_sim.validation.report import (
    INTERVAL,
    METRICS,
    Validation,
    error_of,
    lag_distribution,
    tv_distance,
    validate_run,
)
from staleness_sim.validation.run import (
    COMPLETED,
    MIN_JOBS,
    SCENARIO_KEYS,
    MeasuredRun,
    completed_jobs,
    job_durations,
    read_run,
)

__all__ = [
    "COMPLETED",
    "DURATION_MODELS",
    "GROUP_WINDOW",
    "INTERVAL",
    "METRICS",
    "MIN_JOBS",
    "SCENARIO_KEYS",
    "VERSION_EFFECT",
    "VERSION_EFFECT_P",
    "MeasuredRun",
    "RunModel",
    "Validation",
    "completed_jobs",
    "error_of",
    "estimate_capacity",
    "job_durations",
    "lag_distribution",
    "measured_costs",
    "ModelOptions",
    "model_from_run",
    "plot_lags",
    "plot_metrics",
    "read_run",
    "scenario_data",
    "scenario_from_run",
    "solo_durations",
    "split_by_group",
    "start_groups",
    "tv_distance",
    "validate_run",
    "write_plots",
]
