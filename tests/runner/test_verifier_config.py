"""tasks.verifier: the light verifier by default in training and evaluation, pytest on demand,
anything else one line naming the field."""

from __future__ import annotations

import pytest

from runner.config import validate_run
from runner.workers.local import episode_config
from staleness_sim.core.settings import ConfigError

BASE = {
    "name": "t", "workers": 1, "cohort": 2, "updates": 1, "policy": {"kind": "sync"},
    "model": {"backend": "hf", "path": "m"}, "episodes_per_job": 1, "concurrency": 1,
}  # fmt: skip


def test_the_runs_verifier_reaches_every_episode():
    assert episode_config(validate_run({**BASE, "tasks": {"dir": "t"}})).verifier == "light"
    pinned = validate_run({**BASE, "tasks": {"dir": "t", "verifier": "pytest"}})
    assert episode_config(pinned).verifier == "pytest"
    with pytest.raises(ConfigError, match="tasks.verifier"):
        validate_run({**BASE, "tasks": {"dir": "t", "verifier": "fast"}})
