"""Fixtures for the terminal tests.

Tests that need Docker use ``docker_client``: with REQUIRE_DOCKER=1 (CI) a missing
engine or base image FAILS them; otherwise they are skipped with the reason. Without the
docker SDK (the runner extra) the pure tests still run: the modules that need the SDK
skip themselves with the reason (``pytest.importorskip``), and REQUIRE_DOCKER=1 fails here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Task folders in the upstream shapes: their test_*.py files are the tasks' own verifiers.
collect_ignore = ["fixtures"]

if os.environ.get("REQUIRE_DOCKER") == "1":
    import docker  # noqa: F401 - CI: a missing SDK is an error, not a skip


def _unavailable(reason: str) -> None:
    if os.environ.get("REQUIRE_DOCKER") == "1":
        pytest.fail(f"REQUIRE_DOCKER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client():
    try:
        import docker

        client = docker.from_env(timeout=900, max_pool_size=64)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no usable engine
        _unavailable(
            f"no Docker engine is reachable ({type(exc).__name__}: {exc}); "
            f"run 'bash scripts/setup_docker.sh' as root"
        )
    from runner.terminal.images import ImageConfig

    config = ImageConfig()
    try:
        client.images.get(config.base_image)
    except Exception:  # noqa: BLE001
        _unavailable(
            f"base image {config.base_image} is missing; run 'bash scripts/setup_docker.sh'"
        )
    return client


@pytest.fixture(scope="session")
def builder(docker_client):
    from runner.terminal.images import ImageBuilder

    return ImageBuilder(docker_client)


@pytest.fixture
def no_leak(docker_client):
    """Yield the engine's count of our containers (every container that carries the owner
    label, sandbox or not: tests that start other processes compare with it), and assert
    afterwards that no container this process created remains. Only this process's are
    checked: other processes (other test runs, a training run) share the engine."""
    from runner.terminal.reaper import count_ours

    yield count_ours(docker_client)
    left = _mine(docker_client)
    assert not left, f"a container was leaked: {[c['Id'][:12] for c in left]}"


def _mine(client) -> list:
    from runner.terminal.reaper import LABEL_OWNER, owner_label

    return client.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={owner_label()}"})


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind():
    """At the end of the session no container this test process created remains (other
    processes on the engine may hold theirs, so only this pid's owner label is counted)."""
    yield
    try:
        import docker

        left = _mine(docker.from_env())
    except Exception:  # noqa: BLE001 - no engine or SDK: nothing can have been created
        return
    assert not left, f"the tests left container(s) behind: {[c['Id'][:12] for c in left]}"


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """Hand-written tasks in the upstream shapes (native, Harbor, Terminal-Bench 1)."""
    return FIXTURES


@pytest.fixture(scope="session")
def generated(tmp_path_factory) -> dict[str, Path]:
    """One generated task per category (seeded), written once for the session."""
    from runner.terminal.generator.categories import CATEGORIES
    from runner.terminal.generator.writer import write_tasks

    out = tmp_path_factory.mktemp("generated")
    paths = write_tasks(out, len(CATEGORIES), seed=11)
    by_cat = {}
    for p in paths:
        import json

        by_cat[json.loads((p / "task.json").read_text())["category"]] = p
    return by_cat
