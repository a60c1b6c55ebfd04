"""``jsonl`` (on by default): ``RUN_DIR/metrics.jsonl``, one JSON object a line with
``step`` (the version), ``wall_time`` (Unix seconds) and the scalars."""

from __future__ import annotations

import json

from runner.journal import drop_torn_tail

FILE = "metrics.jsonl"


class Sink:
    name = "jsonl"

    def __init__(self, run_dir, config) -> None:
        path = run_dir / FILE
        drop_torn_tail(path)  # a line torn by a kill is cut before appending after it
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held for the run

    def write(self, step: int, scalars: dict[str, float], wall: float) -> None:
        line = {"step": step, "wall_time": wall, **scalars}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
