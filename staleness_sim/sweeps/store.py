"""Where a sweep's results live, so that nothing finished is ever lost.

Finished batches are appended as part files (``DIR/parts/*.parquet``); at the end they are
consolidated into ``DIR/results.parquet`` and ``DIR/lag_hists.parquet``. Every file is
written to a temporary name and renamed, so each appears whole or not at all; part files
are deleted only after the consolidated table that holds their rows is in place. A result
row is keyed by the hash of its full scenario and seed, so a re-run skips what is done.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

RESULTS = "results.parquet"
LAG_HISTS = "lag_hists.parquet"
SWEEP_INFO = "sweep.json"
PARTS = "parts"
UNUSED_PART = "part-0-unused.parquet"


def atomic_write(path: Path, write) -> None:
    """Write through a temporary file in the same folder, then rename over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class ResultStore:
    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.parts = self.folder / PARTS
        self.results_path = self.folder / RESULTS

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One sweep at a time per folder: a second one would fold away the first's parts."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ValueError(f"{self.folder}: another sweep is writing here") from None
            yield

    def check_readable(self) -> None:
        """Refuse to go on (and later overwrite) when the existing table cannot be read."""
        if self.results_path.exists():
            try:
                pd.read_parquet(self.results_path, columns=["key"])
            except Exception as e:  # any unreadable file is the user's to fix
                raise ValueError(
                    f"{self.results_path}: cannot read the existing results ({e})"
                ) from None

    def finished(self) -> pd.DataFrame:
        """Every finished result row (results table and parts), one per key, result columns only."""
        frames = []
        if self.results_path.exists():
            table = pd.read_parquet(self.results_path)
            # the table is: point, axis columns, then seed and the result columns
            frames.append(table.loc[:, "seed":])
        if self.parts.is_dir():
            frames += [pd.read_parquet(p) for p in sorted(self.parts.glob("part-*.parquet"))]
        frames = [f for f in frames if len(f)]
        if not frames:
            return pd.DataFrame({"key": pd.Series(dtype=str)})
        done = pd.concat(frames, ignore_index=True)
        return done.drop_duplicates("key", keep="last").reset_index(drop=True)

    def append(self, rows: list[dict[str, Any]]) -> Path:
        """Save one finished batch as its own part file."""
        self.parts.mkdir(parents=True, exist_ok=True)
        path = self.parts / f"part-{time.time_ns()}-{os.getpid()}.parquet"
        frame = pd.DataFrame(rows)
        atomic_write(path, lambda p: frame.to_parquet(p, index=False))
        return path

    def consolidate(self, points: pd.DataFrame) -> pd.DataFrame:
        """Join this sweep's runs (``points``: point, axes..., key) with their finished results,
        write results.parquet and lag_hists.parquet, then drop the folded-in part files."""
        folded = sorted(self.parts.glob("part-*.parquet")) if self.parts.is_dir() else []
        finished = self.finished()
        unused = finished[~finished["key"].isin(points["key"])]
        done = finished.drop(
            columns=[c for c in points.columns if c in finished.columns and c != "key"]
        )
        table = points.merge(done, on="key", how="inner", validate="many_to_one")
        table = table.sort_values(["point", "seed"], kind="stable").reset_index(drop=True)
        front = [c for c in points.columns if c != "key"] + ["seed"]
        table = table[front + [c for c in table.columns if c not in front and c != "key"] + ["key"]]
        lags = lag_table(table)
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write(self.folder / LAG_HISTS, lambda p: lags.to_parquet(p, index=False))
        atomic_write(self.results_path, lambda p: table.to_parquet(p, index=False))
        # finished runs of an earlier, different sweep in this folder: kept for a later re-run
        kept = self.parts / UNUSED_PART
        if len(unused):
            self.parts.mkdir(parents=True, exist_ok=True)
            atomic_write(kept, lambda p: unused.to_parquet(p, index=False))
        for part in folded:
            if part != kept or unused.empty:
                part.unlink(missing_ok=True)
        if self.parts.is_dir() and not any(self.parts.iterdir()):
            self.parts.rmdir()
        return table


def lag_table(table: pd.DataFrame) -> pd.DataFrame:
    """The per-run lag histograms as a long table: point, seed, key, lag, count."""
    rows = [
        (point, seed, key, int(lag), int(count))
        for point, seed, key, hist in zip(
            table["point"], table["seed"], table["key"], table["lag_hist"], strict=True
        )
        for lag, count in json.loads(hist).items()
    ]
    frame = pd.DataFrame(rows, columns=["point", "seed", "key", "lag", "count"])
    return frame.astype({"point": "int64", "seed": "int64", "lag": "int64", "count": "int64"})
