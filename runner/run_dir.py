"""The run directory: everything a run writes, each file whole or not at all.

::

    config.yaml          the resolved configuration (the model and task folders relative to
                         the repository that holds the run, when they lie inside it)
    journal.jsonl        every event, append-only: the source of truth for --resume
    jobs.parquet  updates.parquet  workers.parquet  meta.json   the trace (simulator schema)
    episodes.parquet     one row per episode
    eval.parquet         held-out evaluation: version, split, seed, task, reward, ...
    checkpoint/es_checkpoint.json   base-weights hash + update log (the ES core's format)
    transcripts.jsonl    every episode's turns (commands, observations, replies)
    tasks_skipped.json   tasks that could not be loaded or built, with the reason
    task_scores.parquet  tasks.signal: each task's predicted success, and which are in its band
    summary.json         the trace's summary (the keys of staleness-sim run --json)
    run.log              the log

Tables are written to a temporary name and renamed, so a reader (or a crash) never sees
half a file; the journal is append-only with a torn-tail rule (:mod:`runner.journal`).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from runner.config import RunConfig, config_yaml, portable_paths, run_paths, validate_run
from runner.errors import UserError
from staleness_sim.config import ConfigError, read_yaml
from staleness_sim.sweeps.store import atomic_write

EVAL_KEYS = ("version", "split", "seed")


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_file = None

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def journal_path(self) -> Path:
        return self.path / "journal.jsonl"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoint"

    def exists(self) -> bool:
        return (self.path / "config.yaml").is_file() and self.journal_path.is_file()

    # -- creating and opening -----------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, config: RunConfig) -> RunDir:
        run = cls(path)
        if run.journal_path.exists():
            raise UserError(
                f"{run.path} already holds a run; resume it with 'es-runner train --resume "
                f"{run.path}' or choose another --out"
            )
        run.path.mkdir(parents=True, exist_ok=True)
        run.lock()
        run.write_text("config.yaml", config_yaml(portable_paths(config, run.path)))
        run.journal_path.touch()
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        run = cls(path)
        if not run.path.is_dir():
            raise UserError(f"{run.path}: no such run directory")
        if not run.exists():
            raise UserError(f"{run.path}: not a run directory (no config.yaml and journal.jsonl)")
        return run

    def config(self) -> RunConfig:
        try:
            config = validate_run(
                read_yaml(self.path / "config.yaml"), str(self.path / "config.yaml")
            )
        except ConfigError as exc:
            raise UserError(str(exc)) from None
        return run_paths(config, self.path)  # relative paths: against the repository

    def lock(self) -> None:
        """One writer per run directory; a second process gets a clear refusal."""
        f = open(self.path / ".lock", "a+")  # noqa: SIM115 - held while the run lives
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise UserError(f"{self.path} is in use by es-runner pid {holder}") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._lock_file = f

    def unlock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    # -- writing ------------------------------------------------------------------------
    def write_text(self, name: str, text: str) -> None:
        atomic_write(self.path / name, lambda p: p.write_text(text))

    def write_json(self, name: str, data: Any) -> None:
        self.write_text(name, json.dumps(data, indent=2, default=str) + "\n")

    def write_table(self, name: str, frame: pd.DataFrame) -> None:
        atomic_write(self.path / name, lambda p: frame.to_parquet(p, index=False))

    def read_table(self, name: str) -> pd.DataFrame | None:
        path = self.path / name
        return pd.read_parquet(path) if path.exists() else None

    def merge_eval(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Add evaluation rows, replacing earlier rows of the same version, split and seed."""
        old = self.read_table("eval.parquet")
        if old is not None and len(old):
            keys = set(map(tuple, rows[list(EVAL_KEYS)].drop_duplicates().to_numpy().tolist()))
            stale = old[list(EVAL_KEYS)].apply(tuple, axis=1).isin(keys)
            rows = pd.concat([old[~stale], rows], ignore_index=True)
        rows = rows.sort_values([*EVAL_KEYS, "task"], kind="stable").reset_index(drop=True)
        self.write_table("eval.parquet", rows)
        return rows
