"""The scalars of one committed update and of one evaluation (names: docs/metrics.md).

Everything is read from the run's state (:class:`runner.run_state.RunState`), the same
tables the trace is written from, so a curve and the trace never disagree. An update's
window is the run time since the previous commit: results, episodes and worker time in it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

# Update columns another part of the runner may add (antithetic pairs); logged when present.
OPTIONAL_UPDATE_COLUMNS = {
    "pair_disagreement": "train/pair_disagreement",
    "slots_all_agree": "train/slots_all_agree",
}


class UpdateScalars:
    """Computes the scalars of committed updates, in increasing version order.

    It keeps two cursors (into the episodes, kept in landing order, and into the worker
    intervals, kept in closing order) so that each update costs the size of its own window,
    not of the whole run."""

    def __init__(self) -> None:
        self._episode = 0
        self._interval = 0

    def __call__(self, state, version: int, members: list[int]) -> dict[str, float]:
        rec = state.rec
        i = version - 1
        t = float(rec.updates["commit_time"][i])
        t0 = float(rec.updates["commit_time"][i - 1]) if i > 0 else 0.0
        span = max(t - t0, 1e-12)
        jobs = rec.jobs
        verdicts = [jobs["verdict"][j] for j in members]
        rewards = np.array([jobs["reward"][j] for j in members], dtype=float)
        used_lags = [
            jobs["lag"][j] for j, v in zip(members, verdicts, strict=True) if v == "accepted"
        ]
        out: dict[str, float] = {
            "train/reward_mean": float(rewards.mean()),
            "train/reward_std": float(rewards.std()),
            "train/reward_min": float(rewards.min()),
            "train/reward_max": float(rewards.max()),
            "results/accepted": float(verdicts.count("accepted")),
            "results/dropped": float(verdicts.count("dropped")),
            "staleness/mean_lag": _number(rec.updates["mean_lag"][i]),
            "staleness/max_lag": _number(rec.updates["max_lag"][i]),
            "staleness/stale_share": (
                sum(1 for lag in used_lags if lag > 0) / len(used_lags) if used_lags else 0.0
            ),
        }
        for column, name in OPTIONAL_UPDATE_COLUMNS.items():
            if column in rec.updates:
                out[name] = _number(rec.updates[column][i])
        out.update(self._landed(jobs, t0, t, span))
        out.update(self._episodes(state.episodes, jobs, t0, t, span))
        out.update(self._workers(state, t0, t))
        out["time/update_s"] = t - t0
        out["time/run_s"] = t
        return out

    def _landed(self, jobs, t0: float, t: float, span: float) -> dict[str, float]:
        """Discarded and cancelled jobs, and the ES work of the jobs that landed, in the
        window (vectorised over the jobs table: a run's jobs are thousands at most)."""
        end = np.array(jobs["end_time"], dtype=float)
        verdict = np.array(jobs["verdict"], dtype=object)
        inside = (end > t0) & (end <= t)
        landed = inside & (verdict != "cancelled")
        seconds = {}
        for column, name in (("perturb_s", "time/es_s"), ("sync_s", "time/sync_s")):
            if column in jobs:
                values = np.array(jobs[column], dtype=float)[landed]
                seconds[name] = float(np.nansum(values))
        return {
            "results/discarded": float((inside & (verdict == "discarded")).sum()),
            "results/cancelled": float((inside & (verdict == "cancelled")).sum()),
            **seconds,
        }

    def _episodes(self, episodes, jobs, t0: float, t: float, span: float) -> dict[str, float]:
        """The episodes of the jobs that landed in the window: their phases and tokens."""
        end = jobs["end_time"]
        while self._episode < len(episodes) and end[episodes[self._episode]["job_id"]] <= t0:
            self._episode += 1
        taken = []
        while self._episode < len(episodes) and end[episodes[self._episode]["job_id"]] <= t:
            taken.append(episodes[self._episode])
            self._episode += 1
        phases = {
            "time/generation_s": sum(e["generation_s"] for e in taken),
            "time/container_start_s": sum(e.get("sandbox_start_s") or 0.0 for e in taken),
            "time/commands_s": sum(sum(e.get("turn_command_s") or ()) for e in taken),
            "time/verifier_s": sum(e.get("verify_s") or 0.0 for e in taken),
        }
        return {
            "throughput/episodes_per_min": 60.0 * len(taken) / span,
            "throughput/tokens_per_s": sum(e["tokens_out"] for e in taken) / span,
            **phases,
        }

    def _workers(self, state, t0: float, t: float) -> dict[str, float]:
        """The share of the workers' time in (t0, t] spent busy, idle and syncing: closed
        intervals from the recorder, the ones still open from the state."""
        w = state.rec.workers
        ends = w["end"]
        while self._interval < len(ends) and ends[self._interval] <= t0:
            self._interval += 1
        spent = {"busy": 0.0, "idle": 0.0, "syncing": 0.0}
        for k in range(self._interval, len(ends)):
            spent[w["state"][k]] += _overlap(w["start"][k], ends[k], t0, t)
        for s, since in state._workers.values():  # open intervals, closed by a later event
            spent[s] += _overlap(since, t, t0, t)
        total = state.config.workers * (t - t0)
        if total <= 0:
            return {}
        return {
            "workers/busy_fraction": spent["busy"] / total,
            "workers/idle_fraction": spent["idle"] / total,
            "workers/sync_fraction": spent["syncing"] / total,
        }


def eval_scalars(rows: pd.DataFrame, main_split: str) -> dict[str, float]:
    """Held-out success of one evaluation (one version, one split), overall and per
    category. The run's own eval split is ``eval/``; another split is ``eval_<split>/``."""
    split = str(rows["split"].iloc[0])
    prefix = "eval" if split == main_split else f"eval_{split}"
    passed = rows["passed"].astype(float)
    out = {f"{prefix}/success": float(passed.mean()), f"{prefix}/episodes": float(len(rows))}
    for category, group in rows.groupby("category"):
        out[f"{prefix}/success/{category}"] = float(group["passed"].astype(float).mean())
    return out


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def _number(value: Any) -> float:
    if value is None or value is pd.NA:
        return math.nan
    return float(value)
