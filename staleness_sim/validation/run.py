"""A measured run as the validation reads it: its trace, the scenario its ``meta.json``
names, the runner's config and episodes, and the durations of its completed jobs.

Only completed jobs count: a ``cancelled`` job (the run ended, a resume, a crash) has an
end time that is not a duration. A job holding an episode cut by its timeout
(``episodes.parquet``: ``timed_out``) has a duration that is a lower bound (censored).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from staleness_sim.core.trace import COMPLETED, Trace, TraceError

SCENARIO_KEYS = ("workers", "cohort", "updates", "policy")
MIN_JOBS = 2  # what a duration fit needs


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


def need_jobs(run: MeasuredRun, n: int, what: str = "completed job") -> None:
    if n < MIN_JOBS:
        raise TraceError(
            f"{run.folder}: {n} {what}{'s' if n != 1 else ''} (cancelled ones excluded); "
            f"a duration fit needs at least {MIN_JOBS}"
        )
