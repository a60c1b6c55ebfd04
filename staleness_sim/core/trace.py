"""The trace: one schema written by the simulator and by the real runner, read by metrics.

Three tables, stored as Parquet (CSV accepted on input) in one folder:

* ``jobs``: one row per dispatched job (see :data:`JOB_COLUMNS`). ``verdict`` is the job's
  final fate: ``accepted`` (used in a committed update), ``discarded`` (too stale),
  ``deferred`` (held back and never released before the run ended), ``dropped`` (taken
  into a committed cohort, then left out by the update itself: the runner's
  ``es.staleness`` or ``es.antithetic``; ``reason`` names the setting) or ``cancelled``
  (stopped before it finished, or finished after the last update). ``lag`` is the lag at
  use for accepted and dropped results and the lag that got a discarded result thrown away.
* ``updates``: one row per committed update; ``time`` is when the new version's weights
  were available, ``commit_time`` when its cohort completed.
* ``workers``: contiguous ``busy`` / ``idle`` / ``syncing`` intervals covering every worker
  from time 0 to the end of the run, so idle time is exact.

``meta.json`` beside them holds the scenario and facts of the run (``workers``, ``source``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

JOB_COLUMNS = (
    "job_id",
    "worker",
    "seed",
    "dispatch_version",
    "dispatch_time",
    "start_time",
    "end_time",
    "completion_version",
    "verdict",
    "lag",
    "reward",
    "reason",
)
UPDATE_COLUMNS = ("version", "time", "commit_time", "cohort_size", "mean_lag", "max_lag")
WORKER_COLUMNS = ("worker", "state", "start", "end")
VERDICTS = ("accepted", "discarded", "deferred", "dropped", "cancelled")
COMPLETED = ("accepted", "discarded", "deferred", "dropped")  # the jobs whose result came in
WORKER_STATES = ("busy", "idle", "syncing")
_REQUIRED = {
    "jobs": JOB_COLUMNS[:-1],  # reason is optional on input
    "updates": ("version", "time", "cohort_size", "mean_lag", "max_lag"),
    "workers": WORKER_COLUMNS,
}


class TraceError(ValueError):
    """A trace folder or table that does not follow the schema."""


@dataclass
class Trace:
    jobs: pd.DataFrame
    updates: pd.DataFrame
    workers: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def write(self, folder: str | Path) -> Path:
        """Write the three Parquet tables and meta.json; each file appears whole or not at all."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("jobs", "updates", "workers"):
            _atomic(
                folder / f"{name}.parquet",
                lambda p, n=name: getattr(self, n).to_parquet(p, index=False),
            )
        _atomic(
            folder / "meta.json",
            lambda p: p.write_text(json.dumps(self.meta, indent=2, default=str)),
        )
        return folder

    @classmethod
    def read(cls, folder: str | Path) -> Trace:
        folder = Path(folder)
        if not folder.is_dir():
            raise TraceError(f"{folder}: no such trace folder")
        tables = {name: _read_table(folder, name) for name in ("jobs", "updates", "workers")}
        meta_path = folder / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        trace = cls(meta=meta, **tables)
        trace.check()
        return trace

    def check(self) -> None:
        """Raise TraceError naming the first missing column or unknown category."""
        for name, columns in _REQUIRED.items():
            missing = [c for c in columns if c not in getattr(self, name).columns]
            if missing:
                raise TraceError(f"{name} table lacks column(s): {', '.join(missing)}")
        bad = set(self.jobs["verdict"].dropna()) - set(VERDICTS)
        if bad:
            raise TraceError(
                f"jobs.verdict has unknown value(s) {sorted(bad)}; allowed: {VERDICTS}"
            )
        bad = set(self.workers["state"].dropna()) - set(WORKER_STATES)
        if bad:
            raise TraceError(
                f"workers.state has unknown value(s) {sorted(bad)}; allowed: {WORKER_STATES}"
            )


def _read_table(folder: Path, name: str) -> pd.DataFrame:
    for suffix, reader in ((".parquet", pd.read_parquet), (".csv", pd.read_csv)):
        path = folder / f"{name}{suffix}"
        if path.exists():
            return reader(path)
    raise TraceError(f"{folder}: missing {name}.parquet (or {name}.csv)")


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    tmp.replace(path)


class TraceRecorder:
    """Collects rows as a driver runs; columns are filled in place by job id (0, 1, 2, ...).

    ``extra_job_columns`` and ``extra_update_columns`` are kept after the schema's own (a
    measured run adds, say, its generation seconds per job and its reward spread per
    update); readers ignore columns they do not know.
    """

    def __init__(
        self,
        extra_job_columns: tuple[str, ...] = (),
        extra_update_columns: tuple[str, ...] = (),
    ) -> None:
        clash = set(extra_job_columns) & set(JOB_COLUMNS) | (
            set(extra_update_columns) & set(UPDATE_COLUMNS)
        )
        if clash:
            raise ValueError(f"extra columns clash with the schema: {sorted(clash)}")
        self._extra = tuple(extra_job_columns)
        self._update_columns = UPDATE_COLUMNS + tuple(extra_update_columns)
        self.jobs: dict[str, list[Any]] = {c: [] for c in JOB_COLUMNS + self._extra}
        self.updates: dict[str, list[Any]] = {c: [] for c in self._update_columns}
        self.workers: dict[str, list[Any]] = {c: [] for c in WORKER_COLUMNS}
        self._job_lists = [self.jobs[c] for c in JOB_COLUMNS]
        self._worker_lists = [self.workers[c] for c in WORKER_COLUMNS]

    def dispatch(self, job_id: int, worker: int, seed: int, version: int, time: float) -> None:
        if job_id != len(self.jobs["job_id"]):
            raise ValueError(f"job ids must be dispatched in order: got {job_id}")
        row = (
            job_id,
            worker,
            seed,
            version,
            time,
            None,
            None,
            None,
            "cancelled",
            None,
            None,
            "never finished",
        )
        for column, value in zip(self._job_lists, row, strict=True):
            column.append(value)
        for c in self._extra:
            self.jobs[c].append(None)

    def set_job(self, job_id: int, **values: Any) -> None:
        for c, v in values.items():
            self.jobs[c][job_id] = v

    def update(self, **values: Any) -> None:
        for c in self._update_columns:
            self.updates[c].append(values.get(c))

    def interval(self, worker: int, state: str, start: float, end: float) -> None:
        if end > start:
            for column, value in zip(self._worker_lists, (worker, state, start, end), strict=True):
                column.append(value)

    def trace(self, meta: dict[str, Any]) -> Trace:
        jobs = pd.DataFrame(self.jobs, columns=list(JOB_COLUMNS + self._extra))
        for c in ("completion_version", "lag"):
            jobs[c] = jobs[c].astype("Int64")
        jobs["reward"] = jobs["reward"].astype("float64")
        for c in ("dispatch_time", "start_time", "end_time"):
            jobs[c] = jobs[c].astype("float64")
        updates = pd.DataFrame(self.updates, columns=list(self._update_columns))
        workers = pd.DataFrame(self.workers, columns=list(WORKER_COLUMNS))
        return Trace(jobs, updates, workers, meta)
