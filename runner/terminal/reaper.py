"""Labels that mark our containers, and removal of containers whose owner died.

Every container the project creates carries an owner label naming host, boot id, pid and
that pid's start time (:func:`owned_labels`); sandboxes also carry ``es-runner.sandbox=1``.
At start-up a process removes every container of ours whose owner is provably dead (same
host, and another boot or no such process), whatever created it: a sandbox, or the
short-lived container that reads a cached image's build notes. Containers of live
processes and of other hosts are never touched. Live containers are also tracked
in-process so exceptions, Ctrl-C and ``atexit`` remove them.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import docker
import docker.errors

log = logging.getLogger(__name__)

LABEL_SANDBOX = "es-runner.sandbox"
LABEL_OWNER = "es-runner.owner"


def boot_id() -> str:
    """This boot of this machine: processes that share it share the monotonic clock."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()[19].decode()


def owner_label(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return json.dumps(
        {"host": socket.gethostname(), "boot": boot_id(), "pid": pid, "start": _start_time(pid)},
        sort_keys=True,
    )


def owner_is_dead(label: str) -> bool:
    """True only when the owner is on this host and certainly no longer running."""
    try:
        owner: dict[str, Any] = json.loads(label)
    except (json.JSONDecodeError, TypeError):
        return False
    if owner.get("host") != socket.gethostname():
        return False
    if owner.get("boot") != boot_id():
        return True
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    return _start_time(pid) != owner.get("start")


def owned_labels() -> dict[str, str]:
    """The labels every container this process creates must carry, so that the reaper
    removes it when the process dies before its own ``finally`` does (a SIGKILL)."""
    return {LABEL_OWNER: owner_label()}


def sandbox_labels(task_id: str) -> dict[str, str]:
    return {LABEL_SANDBOX: "1", **owned_labels(), "es-runner.task": task_id[:200]}


def _listing(client: docker.DockerClient, label: str) -> list[dict[str, Any]]:
    # the low-level listing: one call, no per-container inspect, so a container that
    # another process removes meanwhile cannot make the listing fail
    return client.api.containers(all=True, filters={"label": label})


def count_ours(client: docker.DockerClient) -> int:
    """Every container of ours (sandboxes and any other that carries the owner label)."""
    return len(_listing(client, LABEL_OWNER))


def gone_or_going(exc: docker.errors.APIError) -> bool:
    """Whether a failed removal means another remover got there first (not a failure): the
    container is gone (404), or its removal is already in progress (409: auto-remove, the
    orphan reaper, a sandbox closing while Ctrl-C removes every live container)."""
    if isinstance(exc, docker.errors.NotFound):
        return True
    return exc.status_code == 409 and "already in progress" in str(exc)


def force_remove(api: docker.APIClient, container_id: str) -> bool:
    """Force-remove a container and its volumes; True if this call removed it. A removal
    that another remover has made or is making is no failure; any other is warned of."""
    try:
        api.remove_container(container_id, force=True, v=True)
        return True
    except docker.errors.APIError as exc:
        if not gone_or_going(exc):
            log.warning("could not remove container %s: %s", container_id[:12], exc)
        return False


def remove_sandboxes(client: docker.DockerClient, owner_matches: Callable[[str], bool]) -> int:
    """Force-remove our containers (sandboxes or not) whose owner label matches; return how
    many."""
    removed = 0
    for info in _listing(client, LABEL_OWNER):
        if owner_matches((info.get("Labels") or {}).get(LABEL_OWNER, "")):
            removed += force_remove(client.api, info["Id"])
    return removed


def reap_orphans(client: docker.DockerClient) -> int:
    """Remove our containers whose owning process is dead; return how many."""
    removed = remove_sandboxes(client, owner_is_dead)
    if removed:
        log.warning("removed %d container(s) left behind by dead processes", removed)
    return removed


_reaped_once = False
_reap_lock = threading.Lock()


def reap_orphans_once(client: docker.DockerClient) -> None:
    global _reaped_once
    with _reap_lock:
        if not _reaped_once:
            reap_orphans(client)
            _reaped_once = True


# --- in-process registry ------------------------------------------------------------------
_live: dict[str, docker.models.containers.Container] = {}
_live_lock = threading.Lock()


def register(container: docker.models.containers.Container) -> None:
    with _live_lock:
        _live[container.id] = container


def unregister(container_id: str) -> None:
    with _live_lock:
        _live.pop(container_id, None)


def remove_all_live() -> int:
    """Force-remove every container this process still holds (Ctrl-C, exit)."""
    with _live_lock:
        containers = list(_live.values())
        _live.clear()
    for container in containers:
        try:
            force_remove(container.client.api, container.id)
        except Exception as exc:  # noqa: BLE001 - best effort at shutdown (engine unreachable)
            log.warning("could not remove container %s: %s", container.short_id, exc)
    return len(containers)


atexit.register(remove_all_live)
