"""Shared fixtures for the sweep tests: a tiny, fast scenario and sweep files built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

# A few milliseconds per run: 5 updates of 4 results, jobs of 8 episodes over 4 sessions.
TINY_BASE: dict[str, Any] = {
    "name": "tiny",
    "workers": 2,
    "cohort": 4,
    "updates": 5,
    "policy": {"kind": "bounded", "max_lag": 1, "on_stale": "drop"},
    "job": {
        "episodes": 8,
        "concurrency": 4,
        "episode": {"dist": "lognormal", "median": 10.0, "sigma": 1.0, "cap": 100.0},
    },
}


def _tiny_sweep(**overrides: Any) -> dict[str, Any]:
    sweep: dict[str, Any] = {
        "name": "tiny",
        "base": TINY_BASE,
        "grid": {
            "workers": [2, 4],
            "policy": [{"kind": "sync"}, {"kind": "bounded", "max_lag": 1, "on_stale": "drop"}],
        },
        "seeds": [0, 1],
    }
    sweep.update(overrides)
    return sweep


@pytest.fixture
def write_sweep(tmp_path: Path):
    """Write a sweep mapping to a YAML file in tmp_path and return its path."""

    def write(sweep: dict[str, Any], name: str = "sweep.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(sweep, sort_keys=False))
        return path

    return write


@pytest.fixture
def tiny_sweep():
    """Factory: the tiny sweep mapping (2 worker counts x 2 policies x 2 seeds), with overrides."""
    return _tiny_sweep


@pytest.fixture
def tiny_base() -> dict[str, Any]:
    return dict(TINY_BASE)
