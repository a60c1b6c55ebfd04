"""``RUN_DIR/tracking.json``: the ids a tracker gave the run, so a resume continues it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

FILE = "tracking.json"


def recorded_id(run_dir: Path, sink: str) -> str | None:
    path = run_dir / FILE
    return json.loads(path.read_text()).get(sink) if path.is_file() else None


def record_id(run_dir: Path, sink: str, value: str) -> None:
    path = run_dir / FILE
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[sink] = value
    tmp = path.with_name(f".{FILE}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def tracker_id(run_dir: Path, sink: str) -> str:
    """The run's id at ``sink``, made once."""
    found = recorded_id(run_dir, sink)
    if found is None:
        found = uuid.uuid4().hex[:16]
        record_id(run_dir, sink, found)
    return found
