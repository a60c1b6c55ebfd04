"""Find and kill the agent's processes inside a container, from the host or from inside.

Commands run in a persistent shell, so a timed-out command cannot simply be killed with
its shell. Its processes are recognised by start time (``/proc/PID/stat`` field 22,
clock ticks since boot; the kernel, hence the clock, is shared by host and container):
everything that started after the command was sent, except the shell itself. Processes
are stopped before they are killed so a fork bomb cannot replace them faster than they
die. The same function runs on the host (fast, works even when the container has no
free process slot for a ``docker exec``) or, where the host cannot see the container's
processes, shipped into the container with python3.
"""

from __future__ import annotations

import inspect
import os
import signal
import time
from collections.abc import Callable, Iterable

CLK_TCK = os.sysconf("SC_CLK_TCK")


def now_ticks() -> int:
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * CLK_TCK)


def kill_started_since(
    proc: str,
    list_pids: Callable[[], Iterable[int]],
    since_ticks: int,
    exclude: set[int],
    rounds: int = 50,
) -> int:
    """SIGSTOP then SIGKILL every live process started at or after ``since_ticks``."""
    killed = 0
    for _ in range(rounds):
        victims = []
        for pid in list_pids():
            if pid in exclude:
                continue
            try:
                with open(f"{proc}/{pid}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            fields = data[data.rindex(b")") + 2 :].split()
            if fields[0] == b"Z":  # already dead, waiting for its parent
                continue
            if int(fields[19]) >= since_ticks:
                victims.append(pid)
        if not victims:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in victims:
                try:  # noqa: SIM105 - shipped into containers, keep it import-free
                    os.kill(pid, sig)
                except OSError:
                    pass
        killed += len(victims)
        time.sleep(0.02)
    return killed


def in_container_script(since_ticks: int, exclude: set[int]) -> str:
    """Python source that runs :func:`kill_started_since` over the container's /proc."""
    src = inspect.getsource(kill_started_since)
    return (
        "from __future__ import annotations\nimport os, signal, time\n"
        + src
        + f"\nexcl = set({sorted(exclude)!r}) | {{os.getpid(), os.getppid()}}\n"
        + "pids = lambda: [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
        + f"print(kill_started_since('/proc', pids, {since_ticks}, excl))\n"
    )


class HostView:
    """The container's processes as seen from the host (root, same PID namespace)."""

    def __init__(self, container_id: str, init_pid: int) -> None:
        self.container_id = container_id
        self.cgroup_dirs = _cgroup_dirs(init_pid, container_id)

    @staticmethod
    def open(container_id: str, init_pid: int) -> HostView | None:
        try:
            view = HostView(container_id, init_pid)
        except OSError:
            return None
        if not view.cgroup_dirs or not view.pids():
            return None
        try:
            os.kill(init_pid, 0)  # permission to signal the container's processes?
        except OSError:
            return None
        return view

    def pids(self) -> list[int]:
        for d in self.cgroup_dirs:
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    return [int(x) for x in f.read().split()]
            except OSError:
                continue
        return []

    def pids_current(self) -> int | None:
        for d in self.cgroup_dirs:
            try:
                with open(os.path.join(d, "pids.current")) as f:
                    return int(f.read().strip())
            except OSError:
                continue
        return None

    def host_pid_of(self, ns_pid: int) -> int:
        """Host pid of the process whose pid inside the container is ``ns_pid``."""
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("NSpid:"):
                            if int(line.split()[-1]) == ns_pid:
                                return pid
                            break
            except (OSError, ValueError):
                continue
        return -1

    def kill_since(self, since_ticks: int, exclude: set[int]) -> int:
        return kill_started_since("/proc", self.pids, since_ticks, exclude)


def _cgroup_dirs(pid: int, container_id: str) -> list[str]:
    """Directories of the container's cgroup that hold cgroup.procs / pids.current."""
    with open(f"/proc/{pid}/cgroup") as f:
        lines = f.read().splitlines()
    dirs = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if container_id not in path:
            continue
        if controllers == "":
            dirs.append(f"/sys/fs/cgroup{path}")
        elif "pids" in controllers.split(","):
            dirs.insert(0, f"/sys/fs/cgroup/pids{path}")
    return [d for d in dirs if os.path.isdir(d)]


def alive(pid: int) -> bool:
    """Whether a host process runs (a killed one stays a zombie until its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")
