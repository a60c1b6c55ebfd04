"""The agent's persistent bash session inside a container, and its command protocol.

Each command is sent to the shell as ``read -N <bytes>`` + the command text, then run
with ``eval`` (so ``cd`` and variables persist), stdin from /dev/null (an interactive
program cannot swallow the protocol) and stderr merged into stdout, followed by a
random sentinel carrying the exit code.
"""

from __future__ import annotations

import re
import select
import socket
import struct
import time
import uuid

import docker
import docker.errors

from runner.terminal.output import OutputCollector

READY_FILE = "/run/.es-ready"  # written by the container's main process once the home is seeded


def restarted_note(timeout: float) -> str:
    return (
        f"[command timed out after {timeout:g} s; the shell had to be restarted, so "
        f"the working directory, variables and background jobs were reset]"
    )


class ShellDied(Exception):
    pass


class Shell:
    """A bash process inside the container, attached through a docker exec socket."""

    def __init__(
        self,
        api: docker.APIClient,
        container_id: str,
        user: str,
        workdir: str,
        *,
        home: str | None = "/home/user",
        env: dict[str, str] | None = None,
        umask: str | None = None,
        pipefail: bool = False,
    ) -> None:
        self.api = api
        self.nonce = uuid.uuid4().hex[:16]
        name = user.split(":")[0]
        environment = dict(env or {})
        environment.update({"SHELL": "/bin/bash", "TERM": "dumb"})
        if name in ("root", "0"):
            environment["HOME"] = "/root"
        elif home:
            environment["HOME"] = home
        if not name.isdigit():
            environment["USER"] = environment["LOGNAME"] = name
        self.exec_id = api.exec_create(
            container_id,
            ["/bin/bash", "--noprofile", "--norc"],
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            user=user,
            workdir=workdir,
            environment=environment,
        )["Id"]
        self._sockio = api.exec_start(self.exec_id, socket=True)
        self.sock: socket.socket = self._sockio._sock
        self.sock.settimeout(30)
        self._frame = b""
        self._payload = bytearray()
        self.eof = False
        self.commands_sent = 0
        self.pending = b""  # output read past the last sentinel searched for
        who = ""
        if name.isdigit():  # a uid: name it as the image's passwd does
            who += 'USER=$(id -un 2>/dev/null || echo "$(id -u)"); LOGNAME=$USER; export USER LOGNAME\n'
        if "HOME" not in environment:
            who += 'HOME=$(getent passwd "$(id -u)" | cut -d: -f6); export HOME="${HOME:-/}"\n'
        if umask:
            who += f"umask {umask}\n"
        if pipefail:
            who += "set -o pipefail\n"
        init = (
            "exec 2>&1\n"
            f"i=0; while [ ! -e {READY_FILE} ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done\n"
            + who
            + "[ -r /.es/environment ] && . /.es/environment\n"
            f"cd {workdir}\n"
            f'printf \'\\n__ES_READY_{self.nonce} %s %s\\n\' "$$" "1 $(cat /proc/1/task/1/children 2>/dev/null)"\n'
        )
        self.send(init.encode())
        self.pid_in_container = -1
        self.host_pid = -1  # known once the shell has answered (see Sandbox._open_shell)

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise ShellDied(str(exc)) from None

    def read(self, timeout: float) -> bytes | None:
        """Next payload bytes; b'' when nothing arrived in ``timeout``; None at EOF."""
        if self._payload:
            out = bytes(self._payload)
            self._payload.clear()
            return out
        if self.eof:
            return None
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            return b""
        try:
            chunk = self.sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return None
        self._frame += chunk
        # Multiplexed stream: 8-byte header (stream, 0, 0, 0, big-endian size) + payload.
        while len(self._frame) >= 8:
            size = struct.unpack(">I", self._frame[4:8])[0]
            if len(self._frame) < 8 + size:
                break
            self._payload += self._frame[8 : 8 + size]
            self._frame = self._frame[8 + size :]
        out = bytes(self._payload)
        self._payload.clear()
        return out

    def send_command(self, command: str) -> re.Pattern[bytes]:
        """Send ``command`` behind its byte count; returns its sentinel's pattern."""
        self.commands_sent += 1
        # bash's read drops NUL bytes without counting them, which would desynchronise
        # the byte count below; a shell command cannot contain NUL anyway.
        data = command.replace("\x00", "").encode()
        sentinel = f"__ES_DONE_{self.nonce}_{self.commands_sent}"
        wrapper = (
            f"LC_ALL=C IFS= read -r -d '' -N {len(data)} __es_cmd; "
            f'eval "$__es_cmd" </dev/null 2>&1; __es_rc=$?; '
            f"printf '\\n%s %d\\n' {sentinel} \"$__es_rc\"\n"
        ).encode()
        self.send(wrapper + data)
        return re.compile(b"\n" + sentinel.encode() + rb" (\d+)\n")

    def collect(
        self, pattern: re.Pattern[bytes], collector: OutputCollector, deadline: float
    ) -> int | None:
        """Feed output to ``collector`` until the sentinel (return its code) or the deadline."""
        pending = self.pending
        keep = 64
        while True:
            match = pattern.search(pending)
            if match:
                collector.feed(pending[: match.start()])
                self.pending = b""
                return int(match.group(1))
            if len(pending) > keep:
                collector.feed(pending[:-keep])
                pending = pending[-keep:]
            self.pending = pending
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            chunk = self.read(min(remaining, 0.5))
            if chunk is None:
                collector.feed(pending)
                self.pending = b""
                raise ShellDied("eof")
            pending += chunk

    def drain(self) -> None:
        """Discard output that background jobs wrote between commands."""
        self.pending = b""
        for _ in range(100):
            chunk = self.read(0)
            if not chunk:
                return

    def exit_code(self) -> int | None:
        try:
            return self.api.exec_inspect(self.exec_id).get("ExitCode")
        except docker.errors.APIError:
            return None

    def close(self) -> None:
        try:
            self._sockio.close()
            self.sock.close()
        except OSError:
            pass
