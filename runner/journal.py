"""The journal: an append-only log of a run's events, one JSON object per line.

It is the run's source of truth: the trace tables, the update log and the scheduling
policy's state are all rebuilt from it when a run resumes. A process killed mid-write
leaves at most one torn last line, which reading ignores and reopening cuts off, so the
journal never holds half an event. Commits are fsync'd before anyone acts on them.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


class JournalError(ValueError):
    """A journal line other than the last is not valid JSON: the file was damaged."""


def read_events(path: Path) -> tuple[list[dict[str, Any]], int]:
    """(events, byte length of the complete lines); a torn last line is left out."""
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    events, good = [], 0
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        if not line.endswith(b"\n"):
            break  # torn by a kill mid-write
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if good + len(line) == len(data):
                break  # a damaged last line (a failed write) counts as torn too
            raise JournalError(
                f"{path}: line {number} is not valid JSON; the journal is damaged"
            ) from None
        good += len(line)
    return events, good


def drop_torn_tail(path: Path) -> None:
    """Cut a torn last line off a file of JSON lines before appending after it (else the
    next line would be glued to it): the journal, and the run's transcripts.jsonl."""
    _, good = read_events(path)
    if path.exists() and path.stat().st_size != good:
        with open(path, "r+b") as f:
            f.truncate(good)


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        drop_torn_tail(path)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held for the run

    def append(self, event: dict[str, Any], durable: bool = False) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()
        if durable:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError:  # a full disk: what it kept is a torn tail, cut when reopened
            pass
        finally:
            with contextlib.suppress(OSError):  # (closing flushes the same bytes again)
                self._file.close()
