"""The checkpoint document, without torch: a reference to the base weights plus the update
log, as JSON (kilobytes), written and read by whoever holds the log.

``<dir>/es_checkpoint.json`` holds the format tag, the base-weights sha256 (and an
optional path where they live), the optimizer's hyper-parameters and noise definition, and
every update record, plus the list of master snapshots (``master-v<version>.pt``). A
coordinator that holds no model (the runner's orchestrator) writes it with
:func:`write_checkpoint`; :mod:`runner.es.checkpoint` saves an optimizer's and loads one
back onto a model (torch).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from runner.es.records import UpdateRecord

FORMAT = "runner.es/checkpoint-v1"
CHECKPOINT_FILE = "es_checkpoint.json"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a reader never sees a half-written checkpoint


def write_checkpoint(
    directory: str | os.PathLike[str],
    *,
    base_hash: str,
    config: dict[str, Any],
    log: list[UpdateRecord],
    base_path: str | None = None,
    snapshots: list[dict[str, Any]] = (),
) -> Path:
    """Write the checkpoint JSON from its parts, atomically; returns its path.

    For a coordinator that holds the update log but no model (``config`` as
    :meth:`ESOptimizer.config` gives it, noise definition included).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_FILE
    doc = {
        "format": FORMAT,
        "base": {"sha256": base_hash, "path": base_path},
        "config": config,
        "version": len(log),
        "log": [r.to_dict() for r in log],
        "snapshots": sorted(snapshots, key=lambda s: s["version"]),
    }
    _atomic_write(path, json.dumps(doc, indent=1))
    return path


def read_checkpoint(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(directory)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"no ES checkpoint at {path}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"ES checkpoint {path} is not valid JSON: {exc}") from None
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path} has format {doc.get('format')!r}, expected {FORMAT!r}")
    return doc
