"""Fixtures for the runner tests: a tiny model made by the CLI, a task folder, run configs.

Tests that need Docker use ``engine``: with REQUIRE_DOCKER=1 (CI) a missing engine or base
image FAILS them; otherwise they are skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("torch")
pytest.importorskip("transformers")


def load_benchmark(name: str):
    """benchmarks/NAME.py as a module, with its sibling imports (the shared harness) found
    as ``python benchmarks/NAME.py`` finds them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO / "benchmarks"))
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def cli(*args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """Run ``es-runner ARGS`` in a fresh process (as a user would)."""
    return subprocess.run(
        [sys.executable, "-m", "runner.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny"
    done = cli("model", "make-tiny", str(out), "--seed", "0")
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="session")
def engine():
    """A reachable Docker engine with the base image (the runner's own check)."""
    try:
        import docker  # noqa: F401

        from runner.errors import UserError
        from runner.rollouts import docker_client

        return docker_client()
    except (ImportError, UserError) as exc:
        if os.environ.get("REQUIRE_DOCKER") == "1":
            pytest.fail(f"REQUIRE_DOCKER=1 but {exc}", pytrace=False)
        pytest.skip(str(exc))


BROKEN_BUILD = "broken_build"
BROKEN_LOAD = "broken_load"


@pytest.fixture(scope="session")
def task_dir(tmp_path_factory) -> Path:
    """Generated tasks plus two broken ones in the train split (a build and a load failure)."""
    from runner.terminal.generator.writer import write_tasks

    out = tmp_path_factory.mktemp("tasks")
    paths = write_tasks(out, 16, seed=5)
    good = paths[0]
    bad = out / BROKEN_BUILD
    shutil.copytree(good, bad)
    meta = json.loads((bad / "task.json").read_text())
    meta["name"] = BROKEN_BUILD
    (bad / "task.json").write_text(json.dumps(meta))
    definition = (bad / "container.def").read_text()
    (bad / "container.def").write_text(
        definition.replace("%post\n", "%post\n    echo 'this task cannot build' >&2; exit 3\n", 1)
    )
    shutil.copytree(good, out / BROKEN_LOAD)
    (out / BROKEN_LOAD / "task.json").write_text("{ not json")
    with open(out / "train.txt", "a") as f:
        f.write(f"{BROKEN_BUILD}\n{BROKEN_LOAD}\n")
    return out


@pytest.fixture
def run_config(tmp_path, tiny_model, task_dir):
    """Write a small run config (dotted overrides) and return its path."""

    def write(**overrides) -> Path:
        from staleness_sim.config import with_overrides

        base = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
        base.update(
            {
                "workers": 2,
                "cohort": 2,
                "updates": 2,
                "episodes_per_job": 2,
                "concurrency": 2,
                "max_turns": 2,
                "command_timeout_s": 5,
                "eval_every": 0,
                "tasks": {"dir": str(task_dir), "split": "train"},
            }
        )
        base["model"]["path"] = str(tiny_model)
        base["sampling"]["max_new_tokens"] = 12
        base["eval"] = {"split": "test", "seeds": [42], "max_tasks": 2}
        data = with_overrides(base, overrides)
        path = tmp_path / f"run-{len(list(tmp_path.glob('run-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return write


WARM_CATEGORIES = ("find_files",)


@pytest.fixture(scope="session")
def warm(tmp_path_factory):
    """A small warm-started model (about a minute on 2 cores) and its pretrain.json; its
    generated tasks are in ``model/tasks``."""
    out = tmp_path_factory.mktemp("warm") / "model"
    done = cli(
        "model", "pretrain", str(out), "--tasks", "150", "--categories", *WARM_CATEGORIES,
        "--steps", "300", "--batch-size", "8", "--hidden", "64", "--layers", "2",
        "--vocab", "512", "--context", "640", "--max-new-tokens", "96", "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads((out / "pretrain.json").read_text())
