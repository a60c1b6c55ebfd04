"""The sandbox against a real engine: persistence, limits and hostile commands."""

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

# the docker SDK is the runner extra; without it this module is skipped, with the reason
pytest.importorskip("docker", reason="the docker SDK is not installed (pip install -e .[runner])")

from runner.terminal.images import ImageConfig
from runner.terminal.reaper import (
    LABEL_SANDBOX,
    count_ours,
    force_remove,
    gone_or_going,
    reap_orphans,
)
from runner.terminal.sandbox import Sandbox, SandboxConfig
from runner.terminal.task import TaskLimits

pytestmark = pytest.mark.docker
BASE = ImageConfig().base_image


@pytest.fixture
def sandbox(docker_client, no_leak):
    limits = TaskLimits(pids=128, storage_mb=32, memory_mb=512)
    with Sandbox(
        docker_client,
        BASE,
        task_id="sandbox-test",
        limits=limits,
        config=SandboxConfig(kill_grace_s=1.0),
    ) as sb:
        yield sb


def test_shell_persists_and_runs_as_user(sandbox):
    r = sandbox.run("id -un; pwd; cd /tmp && export X=41", 5)
    assert (r.exit_code, r.output) == (0, "user\n/home/user")
    r = sandbox.run(
        "echo $((X+1)) $PWD; echo err >&2; exit_code_test() { return 3; }; exit_code_test", 5
    )
    assert r.exit_code == 3 and r.output == "42 /tmp\nerr"


def test_network_is_off_and_limits_apply(sandbox):
    r = sandbox.run("cat /sys/class/net/*/operstate 2>/dev/null | wc -l; ls /sys/class/net", 5)
    assert r.output.split() == ["1", "lo"]  # only loopback
    attrs = sandbox.container.attrs["HostConfig"]
    assert (
        attrs["PidsLimit"] == 128 and attrs["Memory"] == 512 * 2**20 and attrs["NanoCpus"] == 10**9
    )


def test_flood_is_cut_with_exact_note(sandbox):
    r = sandbox.run("yes | head -c 300000; printf '\\033[32mgreen\\033[0m'", 10)
    assert r.exit_code == 0 and r.truncated
    assert r.total_chars == 300_005
    assert r.output.endswith("[output truncated: showing the first 50,000 of 300,005 characters]")
    assert sandbox.run("echo next", 5).output == "next"


def test_sleep_forever_is_interrupted_and_state_survives(sandbox):
    sandbox.run("cd /tmp; V=kept", 5)
    t0 = time.monotonic()
    r = sandbox.run("sleep 1000", 2)
    assert time.monotonic() - t0 < 100  # interrupted, not waited for (no claim on speed)
    assert r.timed_out and r.exit_code == 124 and not r.shell_restarted
    assert "timed out after 2 s and was interrupted" in r.output
    r = sandbox.run("echo $V $PWD; pgrep -c -u user -x sleep || true", 5)
    assert r.output.splitlines()[0] == "kept /tmp"
    assert r.output.splitlines()[1] == "0"


def test_builtin_busy_loop_restarts_the_shell(sandbox):
    r = sandbox.run("while :; do :; done", 1)
    assert r.timed_out and r.shell_restarted and "shell had to be restarted" in r.output
    assert sandbox.run("echo alive; pwd", 5).output == "alive\n/home/user"


def test_killing_or_exiting_the_shell(sandbox):
    r = sandbox.run("kill -9 $$", 5)
    assert (
        r.shell_restarted
        and "[the shell exited; a new shell was started in /home/user]" in r.output
    )
    r = sandbox.run("exit 7", 5)
    assert r.exit_code == 7 and r.shell_restarted
    assert sandbox.run("echo ok", 5).output == "ok"


def test_stdin_cannot_swallow_the_protocol(sandbox):
    r = sandbox.run("cat; read x; python3", 5)
    assert not r.timed_out
    assert sandbox.run("echo fine", 5).output == "fine"


def test_fork_bomb_is_contained(sandbox):
    """The kernel stops the bomb at the process limit, the sandbox kills what it left and
    says so, and the container is back at its idle processes: each seen by the engine."""
    first = sandbox.run(":(){ :|:& };:", 5)
    # The bomb fills the container (unless the first command's check killed it already):
    # wait until the engine counts the limit, however loaded the machine is.
    deadline = time.monotonic() + 60
    while "its process limit" not in first.output and time.monotonic() < deadline:
        if sandbox.container.stats(stream=False, one_shot=True)["pids_stats"]["current"] >= 128:
            break
        time.sleep(0.2)
    second = sandbox.run("ls /home | head -1", 10)  # two forks: fails in a full container
    assert "its process limit (128)" in first.output + second.output
    assert second.exit_code == 0 and second.output.splitlines()[0] == "user"
    # the cgroup refused forks (the limit is what stopped it): pids.events "max N", N > 0
    events = "cat /sys/fs/cgroup/pids/pids.events 2>/dev/null || cat /sys/fs/cgroup/pids.events"
    rc, out = sandbox.exec_root(["sh", "-c", events], 10)
    assert rc == 0 and out.split()[0] == "max" and int(out.split()[1]) > 0, out
    # the engine's count: init, the idle main process and the shell are all that is left
    pids = sandbox.container.stats(stream=False, one_shot=True)["pids_stats"]
    assert pids["limit"] == 128 and pids["current"] <= 3, pids
    assert sandbox.run("echo clean; ls /home", 5).output == "clean\nuser"


def test_filling_the_disk_reports_enospc(sandbox):
    r = sandbox.run("head -c 100M /dev/zero > big; echo rc=$?; df -m . | tail -1", 10)
    assert "No space left on device" in r.output and "rc=1" in r.output
    assert sandbox.run("rm big && echo freed", 5).output == "freed"


def test_leftover_container_of_a_killed_parent_is_reaped(docker_client, no_leak):
    code = textwrap.dedent(f"""
        import docker, sys, time
        from runner.terminal.sandbox import Sandbox
        sb = Sandbox(docker.from_env(), {BASE!r}, task_id="orphan")
        sb.start()
        print("ready", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    assert proc.stdout.readline().strip() == "ready"
    assert count_ours(docker_client) == no_leak + 1
    # A live owner's container is never reaped.
    assert reap_orphans(docker_client) == 0
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert count_ours(docker_client) == no_leak + 1
    assert reap_orphans(docker_client) == 1


def test_reaping_survives_containers_that_vanish_meanwhile(docker_client, no_leak):
    """Two runs on one host: another process may remove its containers while this one lists
    them. A container listed and then gone must not fail the reaper (it did: the docker
    SDK's listing inspects each container it lists, and raised NotFound)."""
    from runner.terminal.reaper import LABEL_OWNER

    dead_owner = '{"boot": "another boot", "host": "%s", "pid": 1, "start": "0"}'
    dead_owner %= __import__("socket").gethostname()
    gone = docker_client.containers.create(
        BASE, ["true"], labels={LABEL_SANDBOX: "1", LABEL_OWNER: dead_owner}
    )
    listing = docker_client.api.containers(all=True, filters={"label": LABEL_SANDBOX})
    gone.remove(force=True)

    class StaleListing:  # the engine as it was when listed, then the real one
        def __init__(self, client):
            self._client = client

        def __getattr__(self, name):
            return getattr(self._client, name)

        def containers(self, **kwargs):
            return listing

    class Client:
        api = StaleListing(docker_client.api)

    assert any(c["Id"] == gone.id for c in listing)
    assert reap_orphans(Client()) == 0
    assert count_ours(docker_client) == no_leak


def test_ctrl_c_removes_running_sandboxes(docker_client, no_leak):
    code = textwrap.dedent(f"""
        import docker, time
        from runner.terminal.sandbox import Sandbox
        sbs = []
        try:
            for i in range(3):
                sb = Sandbox(docker.from_env(), {BASE!r}, task_id=f"ctrlc{{i}}")
                sb.start()
                sbs.append(sb)
            print("ready", flush=True)
            sbs[0].run("sleep 1000", 600)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    assert count_ours(docker_client) == no_leak + 3
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline().strip() == "interrupted"
    proc.wait(timeout=30)
    # atexit removed the containers the process still held.
    labels = {
        c.labels.get("es-runner.task")
        for c in docker_client.containers.list(
            all=True, filters={"label": LABEL_SANDBOX}, ignore_removed=True
        )
    }
    assert not labels & {"ctrlc0", "ctrlc1", "ctrlc2"}


def test_timeout_kill_from_inside_when_host_cannot_see_processes(docker_client, no_leak):
    # Where the engine runs elsewhere (remote daemon, rootless), processes are killed by a
    # python3 helper run in the container with docker exec.
    with Sandbox(docker_client, BASE, task_id="inside-kill") as sb:
        sb.host = None
        r = sb.run("sleep 1000", 1)
        assert r.timed_out and not r.shell_restarted and "was interrupted" in r.output
        assert sb.run("echo ok", 5).output == "ok"


def test_copying_into_a_container_that_stopped_names_the_stop(docker_client, no_leak):
    """The race behind a flaky hostile-agent test: ``kill -9 -1`` as root stops the container a
    moment after ensure_running last saw it alive, then the verifier's copy met the engine's
    404 for a directory its failed mkdir never made. The copy now names the stop."""
    from runner.terminal.errors import SandboxError

    with Sandbox(docker_client, BASE, task_id="stopped-copy") as sb:
        sb.put_files("/tests", {"a/test_x.py": b"x = 1\n"})  # a live container takes it
        assert sb.exec_root(["cat", "/tests/a/test_x.py"], timeout=5) == (0, "x = 1")
        sb.container.kill()
        sb.container.wait(timeout=10)
        with pytest.raises(SandboxError, match="the container stopped during the episode"):
            sb.put_files("/fresh", {"test_y.py": b"y = 2\n"})


def test_a_removal_already_in_progress_is_not_a_failure(
    docker_client, no_leak, monkeypatch, caplog
):
    """Two removers of one container (a sandbox closing while Ctrl-C removes every live
    container): the engine answers the later ones 409 "removal ... already in progress",
    which is no failure and says nothing. Another 409 (a running container removed without
    force) is a failure."""
    import docker

    statuses = []
    remove = docker_client.api.remove_container

    def spy(*args, **kwargs):
        try:
            return remove(*args, **kwargs)
        except docker.errors.APIError as exc:
            statuses.append(exc.status_code)
            raise

    monkeypatch.setattr(docker_client.api, "remove_container", spy)
    labels = {LABEL_SANDBOX: "1"}
    for _ in range(5):  # four at once gave a 409 every time measured (5 of 5 rounds)
        c = docker_client.containers.run(BASE, ["sleep", "600"], detach=True, labels=labels)
        with pytest.raises(docker.errors.APIError) as conflict:
            docker_client.api.remove_container(c.id)  # running, no force: a real conflict
        assert conflict.value.status_code == 409 and not gone_or_going(conflict.value)
        statuses.clear()
        start, removed = threading.Barrier(4), []

        def remover(cid=c.id, start=start, removed=removed):
            start.wait()
            removed.append(force_remove(docker_client.api, cid))

        threads = [threading.Thread(target=remover) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(removed) == [False, False, False, True]
        if 409 in statuses:
            break
    assert 409 in statuses  # the in-progress answer was met, not only "gone" (404)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def _notes_image(docker_client) -> str:
    """A small image shaped like a native task's: labelled native, with build notes."""
    import io

    tag = "es-runner/test-notes:1"
    dockerfile = f"FROM {BASE}\nRUN mkdir -p /.es && echo 'a note' > /.es/build-notes\n"
    docker_client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), tag=tag, labels={"es-runner.native": "1"}, rm=True
    )
    return tag


def test_a_reader_of_build_notes_killed_midway_leaves_nothing_after_the_next_reap(
    docker_client, no_leak
):
    """Issue 21: reading a cached image's notes creates a container that a SIGKILL between
    create and remove left behind for good (no owner label, so no reaper looked at it)."""
    from runner.terminal.images import _stored_notes
    from runner.terminal.reaper import LABEL_OWNER, owner_label

    tag = _notes_image(docker_client)
    # In-process the notes are read and the container is gone again.
    assert _stored_notes(docker_client.images.get(tag)) == ["a note"]
    mine = {"label": f"{LABEL_OWNER}={owner_label()}"}
    assert not docker_client.api.containers(all=True, filters=mine)
    code = textwrap.dedent(f"""
        import time, docker
        from docker.models.containers import Container
        from runner.terminal.images import _stored_notes

        def stalled(self, path):  # the process is killed while the container exists
            print("created " + self.id, flush=True)
            time.sleep(600)

        Container.get_archive = stalled
        client = docker.from_env()
        _stored_notes(client.images.get({tag!r}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("created "), line
    cid = line.split()[1]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    # The finally never ran: the container is there, carrying its dead owner's label.
    info = docker_client.api.inspect_container(cid)
    assert LABEL_OWNER in info["Config"]["Labels"]
    assert reap_orphans(docker_client) >= 1
    assert not docker_client.api.containers(all=True, filters={"id": cid})
