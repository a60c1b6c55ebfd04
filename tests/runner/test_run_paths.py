"""A run directory records its model and task folders relative to the repository that holds
it, so a copy of the repository elsewhere (a fresh clone) finds them; other paths stay
absolute."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from conftest import REPO

from runner.config import repository_root, validate_run
from runner.run_dir import RunDir


def _config(model: str, tasks: str):
    return validate_run({
        "workers": 1, "cohort": 1, "updates": 1, "policy": {"kind": "sync"},
        "model": {"path": model}, "tasks": {"dir": tasks}, "episodes_per_job": 1,
        "concurrency": 1,
    })  # fmt: skip


def test_paths_inside_the_repository_are_recorded_relative_and_follow_a_copy(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "models" / "m").mkdir(parents=True)
    outside = tmp_path / "elsewhere" / "tasks"
    outside.mkdir(parents=True)
    config = _config(str(repo / "models" / "m"), str(outside))
    run = RunDir.create(repo / "runs" / "r1", config)
    run.unlock()
    recorded = yaml.safe_load((repo / "runs" / "r1" / "config.yaml").read_text())
    assert recorded["model"]["path"] == "models/m"  # inside the repository: relative
    assert recorded["tasks"]["dir"] == str(outside)  # outside it: absolute
    (repo / "runs" / "r1" / "journal.jsonl").touch()
    assert RunDir.open(repo / "runs" / "r1").config().model.path == str(repo / "models" / "m")
    # the same repository copied elsewhere: the run finds the copy's model
    clone = tmp_path / "clone"
    shutil.copytree(repo, clone)
    assert RunDir.open(clone / "runs" / "r1").config().model.path == str(clone / "models" / "m")


def test_a_run_outside_any_repository_records_absolute_paths(tmp_path):
    assert repository_root(tmp_path) is None
    run = RunDir.create(tmp_path / "r", _config(str(tmp_path / "m"), str(tmp_path / "t")))
    run.unlock()
    recorded = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert recorded["model"]["path"] == str(tmp_path / "m")
    assert recorded["tasks"]["dir"] == str(tmp_path / "t")


def test_example_runs_name_their_model_and_tasks_by_repository_relative_paths():
    configs = sorted((REPO / "examples" / "runs").glob("**/config.yaml"))
    assert len(list((REPO / "examples" / "runs" / "learn").glob("*_s[0-9]*/config.yaml"))) >= 3
    for path in configs:
        recorded = yaml.safe_load(path.read_text())
        for where in (recorded["model"]["path"], recorded["tasks"]["dir"]):
            if where is not None:  # tasks.generate: written into the run directory
                assert not Path(where).is_absolute() and ".." not in Path(where).parts, path
        # the habit warm start, on the committed warm start's tasks
        if path.parent.parent.name == "learn":
            assert recorded["model"]["path"] == "examples/warm_start_habit"
            assert recorded["tasks"]["dir"] == "examples/warm_start/tasks"
