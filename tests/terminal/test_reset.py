"""A training episode's container is reused only after a verified reset; a container that
fails it (a stray file in the image's filesystem, a stray process) is removed."""

from __future__ import annotations

import pytest

pytest.importorskip("docker")

from runner.terminal import procs  # noqa: E402
from runner.terminal.generator.writer import generate_specs  # noqa: E402
from runner.terminal.loaders import load_native  # noqa: E402
from runner.terminal.reset import SandboxPool, reusable  # noqa: E402
from runner.terminal.verifier import verify_final  # noqa: E402


@pytest.fixture
def task_and_image(tmp_path, builder):
    task_id, spec = generate_specs(1, 11)[0]
    task = load_native(spec.write(tmp_path, task_id))
    return task, builder.ensure(task).tag, spec.solution


def _exists(client, cid):
    return bool(client.api.containers(all=True, filters={"id": cid}))


def test_reset_reuses_a_clean_container_and_removes_a_dirty_one(
    docker_client, task_and_image, no_leak
):
    task, tag, solution = task_and_image
    pool = SandboxPool()
    try:
        with pool.lease(docker_client, tag, task) as fresh:
            if reusable(fresh, task) is not None:
                pytest.skip(reusable(fresh, task))
            cid = fresh.container.id
            before = verify_final(fresh, task, verifier="pytest")
            # the agent solves the task, leaves files in its home, /tmp and /dev/shm, and a
            # background process
            for command in solution:
                fresh.run(command, 20)
            fresh.run("echo x > ~/left.txt; echo y > /tmp/t; echo z > /dev/shm/s", 10)
            fresh.run("nohup sleep 300 >/dev/null 2>&1 &", 10)
            assert verify_final(fresh, task, verifier="pytest").passed
        assert pool.counts["kept"] == 1 and pool.counts["started"] == 1
        # the same container, back at the task's initial state, with a working shell
        with pool.lease(docker_client, tag, task) as again:
            assert again.container.id == cid and pool.counts["reused"] == 1
            after = verify_final(again, task, verifier="pytest")
            assert (after.passed, after.graded) == (before.passed, before.graded)
            assert not after.passed
            listing = again.run("ls -A ~ /tmp /dev/shm; pgrep -c sleep", 10).output
            assert "left.txt" not in listing and "\nt\n" not in listing
            assert listing.splitlines()[-1] == "1"  # the idle main process's sleep only
            # a stray file in the image's own filesystem (the writable layer)
            again.exec_root(["sh", "-c", "echo stray > /opt/stray"], timeout=10)
        assert pool.counts["discarded: its writable layer differs from a fresh container's"] == 1
        assert not _exists(docker_client, cid)

        with pool.lease(docker_client, tag, task) as third:
            cid = third.container.id
            # a stray process the kill step does not reach (it counts from the session's
            # start, so one started before it stands for any it might miss)
            third.exec_root(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 &"], timeout=10)
            third._session_ticks = procs.now_ticks() + 1
        assert pool.counts["discarded: a process outlived the session's end"] == 1
        assert not _exists(docker_client, cid)
    finally:
        pool.close()
