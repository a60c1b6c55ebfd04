"""Metrics computed from a trace alone: the same function reports simulated and measured runs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from staleness_sim.core.trace import COMPLETED, Trace

SUMMARY_KEYS = (
    "wall_clock_s",
    "updates",
    "jobs_completed",
    "results_accepted",
    "results_discarded",
    "results_per_hour",
    "updates_per_hour",
    "worker_idle_fraction",
    "stale_fraction",
    "mean_lag",
    "p99_lag",
    "max_lag",
    "lag_hist",
    "data_utilization",
)


def wall_clock(trace: Trace) -> float:
    """End of the run: the last update's availability, or the last worker interval."""
    ends = [trace.updates["time"].max(), trace.workers["end"].max()]
    ends = [float(e) for e in ends if pd.notna(e)]
    return max(ends) if ends else 0.0


def lag_histogram(lags: pd.Series) -> dict[int, int]:
    counts = lags.dropna().astype(int).value_counts().sort_index()
    return {int(k): int(v) for k, v in counts.items()}


def state_fractions(trace: Trace) -> dict[str, float]:
    """Fraction of total worker time (workers x wall clock) spent in each state."""
    w = trace.workers
    total = float((w["end"] - w["start"]).sum())
    by_state = (w["end"] - w["start"]).groupby(w["state"]).sum()
    return {
        s: (float(by_state.get(s, 0.0)) / total if total > 0 else 0.0)
        for s in ("busy", "idle", "syncing")
    }


def time_to_updates(trace: Trace, k: int) -> float:
    """Time at which version k was available (NaN if the run made fewer updates)."""
    hit = trace.updates.loc[trace.updates["version"] >= k, "time"]
    return float(hit.min()) if len(hit) else float("nan")


def summarize(trace: Trace) -> dict[str, Any]:
    """The run's summary: the keys of ``staleness-sim run --json`` (SUMMARY_KEYS first)."""
    jobs = trace.jobs
    verdict = jobs["verdict"]
    accepted = jobs.loc[verdict == "accepted", "lag"].dropna().astype(int)
    discarded = jobs.loc[verdict == "discarded", "lag"]
    completed = int(verdict.isin(COMPLETED).sum())
    wall = wall_clock(trace)
    per_hour = 3600.0 / wall if wall > 0 else float("nan")
    fractions = state_fractions(trace)
    n_acc = len(accepted)
    lags = accepted.to_numpy()
    summary = {
        "wall_clock_s": wall,
        "updates": int(len(trace.updates)),
        "jobs_completed": completed,
        "results_accepted": n_acc,
        "results_discarded": int(len(discarded)),
        "results_per_hour": n_acc * per_hour,
        "updates_per_hour": len(trace.updates) * per_hour,
        "worker_idle_fraction": fractions["idle"],
        "stale_fraction": float((lags >= 1).mean()) if n_acc else 0.0,
        "mean_lag": float(lags.mean()) if n_acc else 0.0,
        "p99_lag": int(np.quantile(lags, 0.99, method="higher")) if n_acc else 0,
        "max_lag": int(lags.max()) if n_acc else 0,
        "lag_hist": lag_histogram(accepted),
        "data_utilization": n_acc / completed if completed else 0.0,
        # beyond the contract
        "worker_busy_fraction": fractions["busy"],
        "worker_sync_fraction": fractions["syncing"],
        "results_deferred_unused": int((verdict == "deferred").sum()),
        "results_dropped": int((verdict == "dropped").sum()),  # left out by the update rule
        "jobs_cancelled": int((verdict == "cancelled").sum()),
        "discarded_lag_hist": lag_histogram(discarded),
        "mean_reward": float(jobs.loc[verdict == "accepted", "reward"].mean())
        if jobs["reward"].notna().any()
        else None,
    }
    return summary
