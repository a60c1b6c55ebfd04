"""A hostile agent against the hardened sandbox (real engine): every usual escape fails,
the host and a concurrent episode are unaffected, and the next episode passes."""

import dataclasses
import platform
import re
import socket
import threading
from pathlib import Path

import pytest

# the docker SDK is the runner extra; without it this module is skipped, with the reason
pytest.importorskip("docker", reason="the docker SDK is not installed (pip install -e .[runner])")

from runner.terminal.check import solution_agent
from runner.terminal.episode import EpisodeConfig, run_episode, run_episodes
from runner.terminal.loaders import load_task
from runner.terminal.protocol import ScriptedAgent
from runner.terminal.sandbox import SandboxConfig

pytestmark = pytest.mark.docker
ESCAPES = Path(__file__).parent / "hostile" / "escapes.txt"
NAMES = ["setuid", "sudo", "su", "mount-proc", "mount-bind", "sys", "proc-sys", "module"]
NAMES += ["raw-socket-check", "host-server-check", "fill-tmp-check", "fill-home-check"]
NAMES += ["kill-all"]
# linux/capability.h: CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, KILL 5
PROFILE_MASK = f"{sum(1 << b for b in (0, 1, 3, 5)):016x}"
TMP_MB, HOME_MB, MEMORY_MB = 32, 64, 256


class HostileAgent(ScriptedAgent):
    """The escapes file, one command a turn; a setuid-root copy of `id` is planted first
    (as a task's image might ship one) so that no-new-privileges is what stops it."""

    def prepare(self, sandbox, task):
        plant = "cp /usr/bin/id /usr/local/bin/rootid && chmod 4755 /usr/local/bin/rootid"
        assert sandbox.exec_root(["sh", "-c", plant], timeout=10)[0] == 0


class LoopbackServer:
    """A TCP server on the host's loopback only, counting who reached it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.reached = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.reached += 1
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


def _hostile(task, port):
    limits = dataclasses.replace(task.limits, memory_mb=MEMORY_MB, storage_mb=HOME_MB)
    return dataclasses.replace(task, limits=limits, env={**task.env, "HOST_PORT": str(port)})


@pytest.mark.skipif(platform.machine() != "x86_64", reason="finit_module's number is x86_64's")
def test_a_hostile_agent_is_contained(docker_client, builder, fixtures_dir, generated, no_leak):
    server = LoopbackServer()
    try:
        # the loopback server answers on the host itself (so reaching it would be visible)
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
        swappiness = Path("/proc/sys/vm/swappiness").read_text()
        tbench = load_task(fixtures_dir / "tbench1")  # the agent is root
        native = load_task(next(iter(generated.values())))  # the agent is uid 1000
        hostile = HostileAgent.from_file(ESCAPES)
        config = EpisodeConfig(
            max_turns=40, command_timeout_s=20, sandbox=SandboxConfig(tmp_size_mb=TMP_MB)
        )
        # a root agent writes where no tmpfs caps it: the image's own filesystem
        filler = ScriptedAgent(["head -c 200M /dev/zero > /fill; echo wrote", "echo still-here"])
        jobs = [
            (_hostile(tbench, server.port), hostile),
            (_hostile(native, server.port), hostile),
            (_hostile(tbench, server.port), filler),
            (tbench, solution_agent(tbench, None, "script")),  # an episode alongside
        ]
        root, user, filled, alongside = run_episodes(
            jobs, concurrency=4, config=config, client=docker_client, builder=builder
        )
        after = run_episode(
            tbench, solution_agent(tbench, None, "script"), client=docker_client, builder=builder
        )
        assert server.reached == 1  # only the host's own check above
    finally:
        server.close()
    assert Path("/proc/sys/vm/swappiness").read_text() == swappiness
    assert alongside.reward == 1.0 and after.reward == 1.0, (alongside.error, after.error)
    for who, rec in (("root", root), ("uid 1000", user)):
        text = "\n".join(t.observation for t in rec.transcript)
        assert rec.reward == 0.0 and not rec.passed, (who, rec.verifier_output)
        # a marker starts a line (bash's "Killed python3 -c ..." repeats the command's text)
        assert not re.search(r"^ESCAPED-", text, re.M), (who, text)
        # as root, kill -9 -1 stops the container (below): its turn may end the episode
        expected = NAMES[:-1] if who == "root" else NAMES
        missing = [n for n in expected if f"contained-{n}" not in text]
        assert not missing, (who, missing, text)
        assert f"CapBnd:\t{PROFILE_MASK}" in text and "NoNewPrivs:\t1" in text, (who, text)
        effective = PROFILE_MASK if who == "root" else "0" * 16
        assert f"CapEff:\t{effective}" in text, (who, text)
        tmp_mb = int(text.split("tmp=")[1].split("MB")[0])
        assert tmp_mb <= TMP_MB and "No space left on device" in text, (who, text)
        assert "memory-rc=137" in text, (who, text)  # killed by the OOM killer, not the host
    user_text = "\n".join(t.observation for t in user.transcript)
    assert int(user_text.split("home=")[1].split("MB")[0]) <= HOME_MB, user_text
    # kill -9 -1 as root ends the main process, so the container, and the episode with it
    assert "the container stopped during the episode" in root.error, root.error
    assert user.error is None and user.transcript[-2].observation.startswith(
        "Command executed successfully. Output: still-here"
    ), user.transcript[-2]
    assert filled.reward == 0.0 and filled.turns == 1, filled
    assert f"more than its storage limit of {HOME_MB} MB" in filled.error, filled.error
