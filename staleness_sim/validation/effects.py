"""What makes measured durations move together, taken out before a duration model is
fitted: a factor shared by the jobs of one version that start together (the engine's
``version_effect``, estimated by a one-way random-effects ANOVA), and the contention of
workers sharing one machine (measured durations turned into solo durations)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize, stats

from staleness_sim.validation.run import MeasuredRun, job_durations, need_jobs, read_run


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
        need_jobs(r, len(j))

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
