"""Training episodes' containers reused after a verified reset (``tasks.reuse_containers``).

A container is reused only for the same task (its image, its seeded home) and only when
the reset proves it is the task's fresh initial state again; anything else removes it:

1. every process started since the agent's session began is killed (the shell included),
   and what runs is exactly what ran before the session (init and the idle main process);
2. ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/dev/mqueue`` and the home are emptied, and the
   home is seeded again from the image's copy, as at start (``sandbox.SEED_HOME``);
3. a digest of everything a process in the container can change without writing to its
   writable layer (the listing of those folders: path, type, mode, owner, size, link
   target, a regular file's sha256; ``/etc/hosts``, ``/etc/hostname``,
   ``/etc/resolv.conf``; the System V IPC tables), read from the host through the
   container's root, equals the digest of a fresh container of the task;
4. the container's writable layer (overlay2's upper directory, read from the host) lists
   exactly what a fresh container's does (the ready file its start writes): so nothing
   of the image's own filesystem was changed, which (3) does not list.

Only native tasks with a tmpfs home qualify, and only where the host sees the container's
processes and writable layer (root, overlay2); elsewhere every container is removed, as
without reuse. Held-out evaluation never reuses: only training workers hold a pool.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import docker

from runner.terminal import procs
from runner.terminal.sandbox import SEED_HOME, Sandbox, SandboxConfig
from runner.terminal.task import Task

log = logging.getLogger(__name__)

EMPTIED = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/home/user")
RESET = f"find {' '.join(EMPTIED)} -mindepth 1 -delete 2>/dev/null; {SEED_HOME}"
# what a process in the container can change outside its writable layer, besides EMPTIED
CONTENTS = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/proc/sysvipc/shm",
            "/proc/sysvipc/msg", "/proc/sysvipc/sem")  # fmt: skip


def upper_listing(path: str) -> list[tuple]:
    """The writable layer's entries (relative path, type, mode, owner, size, link target)."""
    out = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(dirs + files):
            p = os.path.join(root, name)
            st = os.lstat(p)
            target = os.readlink(p) if stat.S_ISLNK(st.st_mode) else ""
            out.append((os.path.relpath(p, path), st.st_mode, st.st_uid, st.st_gid,
                        st.st_size if stat.S_ISREG(st.st_mode) else 0, target))  # fmt: skip
    return out


def state_digest(sandbox: Sandbox) -> str | None:
    """The digest of the container's resettable state, read from the host through its init
    process's root (the container's own mounts); None where it cannot be read."""
    root = f"/proc/{sandbox.container.attrs['State']['Pid']}/root"
    h = hashlib.sha256()

    def entry(path: str) -> None:
        st = os.lstat(root + path)
        line = f"{path}|{stat.S_IFMT(st.st_mode):o}|{stat.S_IMODE(st.st_mode):o}|{st.st_uid}|"
        line += f"{st.st_gid}|{st.st_size}"
        if stat.S_ISLNK(st.st_mode):
            line += "|" + os.readlink(root + path)
        elif stat.S_ISREG(st.st_mode):
            with open(root + path, "rb") as f:
                line += "|" + hashlib.file_digest(f, "sha256").hexdigest()
        h.update(line.encode("utf-8", "surrogateescape") + b"\n")

    try:
        for top in EMPTIED:
            entry(top)
            for folder, dirs, files in os.walk(root + top):
                dirs.sort()
                for name in sorted(dirs + files):
                    entry(os.path.join(folder, name)[len(root) :])
        for name in CONTENTS:
            with open(root + name, "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    except OSError:
        return None
    return h.hexdigest()


def reusable(sandbox: Sandbox, task: Task) -> str | None:
    """Why a container of this task cannot be reused at all, or None."""
    if task.layout != "native" or not task.home_tmpfs:
        return "not a native task with a tmpfs home"
    if sandbox.host is None or sandbox._upper_dir is None:
        return "the host does not see its processes and writable layer"
    return None


def reset(sandbox: Sandbox, fresh: tuple[str, list[tuple]], settle_s: float = 2.0) -> str | None:
    """Bring ``sandbox`` back to ``fresh`` (its task's digest and writable layer when new);
    None when it is proved there, else why not (then it must be removed)."""
    assert sandbox.host is not None and sandbox._upper_dir is not None
    if sandbox.shell is not None:
        sandbox.shell.close()
        sandbox.shell = None
    sandbox.host.kill_since(sandbox._session_ticks, set(sandbox._baseline))
    deadline = time.monotonic() + settle_s
    while set(sandbox.host.pids()) != sandbox._baseline:
        if time.monotonic() > deadline:
            return "a process outlived the session's end"
        time.sleep(0.05)
    code, out = sandbox.exec_root(["/bin/sh", "-c", RESET], timeout=60)
    if code != 0:
        return f"the reset script failed ({code}): {out[-200:]}"
    if state_digest(sandbox) != fresh[0]:
        return "the digest of its files differs from a fresh container's"
    if upper_listing(sandbox._upper_dir) != fresh[1]:
        return "its writable layer differs from a fresh container's"
    if set(sandbox.host.pids()) != sandbox._baseline:  # the reset's own execs are gone
        return "a process outlived the reset"
    sandbox._session_ticks = procs.now_ticks()
    sandbox.shell = sandbox._open_shell()
    return None


class SandboxPool:
    """Idle containers of training episodes, each reset and verified, keyed by task."""

    def __init__(self, max_idle: int = 8) -> None:
        self.max_idle = max_idle
        self._idle: dict[tuple, list[Sandbox]] = {}
        self._fresh: dict[tuple, tuple[str, list[tuple]]] = {}
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()  # started, reused, kept, and each discard reason

    @contextmanager
    def lease(
        self,
        client: docker.DockerClient,
        image: str,
        task: Task,
        config: SandboxConfig | None = None,
        *,
        verifier_network: bool = False,
    ) -> Iterator[Sandbox]:
        """A started sandbox for an episode of ``task``: an idle one of the same task, or a
        new one; afterwards reset and kept, or removed (always after an exception)."""
        key = (image, task.task_id, verifier_network)
        sandbox = self._take(key)
        if sandbox is None:
            sandbox = Sandbox.for_task(
                client, image, task, config, verifier_network=verifier_network
            )
            sandbox.start()
            self.counts["started"] += 1
            self._reference(key, sandbox, task)
        else:
            self.counts["reused"] += 1
        try:
            yield sandbox
        except BaseException:
            sandbox.close()
            raise
        self._give_back(key, sandbox, task)

    def _take(self, key: tuple) -> Sandbox | None:
        with self._lock:
            idle = self._idle.get(key)
            return idle.pop() if idle else None

    def _reference(self, key: tuple, sandbox: Sandbox, task: Task) -> None:
        """A fresh container's digest and writable layer, once per task."""
        if key in self._fresh or reusable(sandbox, task) is not None:
            return
        digest = state_digest(sandbox)
        if digest is not None:
            assert sandbox._upper_dir is not None
            self._fresh[key] = (digest, upper_listing(sandbox._upper_dir))

    def _give_back(self, key: tuple, sandbox: Sandbox, task: Task) -> None:
        t0 = time.perf_counter()
        why = reusable(sandbox, task) or ("no fresh reference" if key not in self._fresh else None)
        if why is None:
            try:
                why = reset(sandbox, self._fresh[key])
            except Exception as exc:  # noqa: BLE001 - any failure means: remove it
                why = f"the reset failed: {type(exc).__name__}: {exc}"
        if why is not None:
            self.counts[f"discarded: {why}"] += 1
            log.debug("%s: container removed, not reused: %s", task.task_id, why)
            sandbox.close()
            return
        sandbox.start_s = time.perf_counter() - t0  # what the next episode's start cost
        with self._lock:
            self._idle.setdefault(key, []).append(sandbox)
            idle = sum(len(v) for v in self._idle.values())
            oldest = (
                next((k for k, v in self._idle.items() if v), None)
                if idle > self.max_idle
                else None
            )
            evicted = self._idle[oldest].pop(0) if oldest is not None else None
        self.counts["kept"] += 1
        if evicted is not None:
            evicted.close()

    def close(self) -> None:
        if self.counts:
            log.info("training containers: %s", dict(sorted(self.counts.items())))
        with self._lock:
            idle = [s for v in self._idle.values() for s in v]
            self._idle.clear()
        for sandbox in idle:
            sandbox.close()
