"""One Docker container per episode with a persistent bash session for the agent.

The session and its command protocol are :mod:`runner.terminal.shell`; the files going
in and the bytes the agent wrote, :mod:`runner.terminal.container_files`. On timeout the
command's processes are killed (see :mod:`runner.terminal.procs`); if the shell itself is
stuck (a builtin loop) or has exited, a new shell is started and the observation says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field

import docker
import docker.errors

from runner.terminal import procs, reaper
from runner.terminal.container_files import disk_usage, tar_archive
from runner.terminal.errors import SandboxError
from runner.terminal.output import OUTPUT_LIMIT, OutputCollector
from runner.terminal.shell import READY_FILE, Shell, ShellDied, restarted_note
from runner.terminal.task import Task, TaskLimits

# the names this module held before the split, still imported from here
_Shell = Shell
__all__ = ["Sandbox", "SandboxConfig", "CommandResult", "Shell", "ShellDied", "TIMEOUT_EXIT_CODE"]

log = logging.getLogger(__name__)

TIMEOUT_EXIT_CODE = 124  # as GNU timeout reports it
# Seed the tmpfs home from the image's copy (at start, and by a verified reset: reset.py).
SEED_HOME = (
    'if [ "$ES_HOME_TMPFS" = 1 ] && [ -d /.es/home-seed ]; then '
    "cp -a /.es/home-seed/. /home/user/; "
    "chown --reference=/.es/home-seed /home/user; chmod --reference=/.es/home-seed /home/user; "
    'elif [ "$ES_HOME_TMPFS" = 1 ]; then chown user:user /home/user 2>/dev/null; fi'
)
# PID 1's child: seed the home, then idle.
_MAIN = SEED_HOME + "; : > " + READY_FILE + "; exec sleep infinity"


# What runs in an agent's container is whatever a model wrote, often as root (Harbor and
# Terminal-Bench tasks): every capability is dropped but those measured to be needed, and no
# process can gain privileges (setuid binaries, sudo, su, file capabilities). Measured with
# every fixture (generated, native, Harbor, Terminal-Bench) and the sandbox tests: with no
# capability the home cannot be seeded as root (chown/chmod: EPERM) and a root verifier cannot
# read the agent's 0600 files; with CHOWN, DAC_OVERRIDE and FOWNER every fixture passes; KILL
# lets root stop the agent's processes from inside where the host cannot see them. Dropped:
# the rest of Docker's default set (NET_RAW: raw sockets, MKNOD, SETUID/SETGID: root cannot
# switch users, FSETID, SETFCAP, SETPCAP, SYS_CHROOT, AUDIT_WRITE, NET_BIND_SERVICE). A task
# that needs one names it in Task.capabilities.
AGENT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL")
SECURITY_OPT = ("no-new-privileges",)


@dataclass
class SandboxConfig:
    network: bool = False
    output_limit: int = OUTPUT_LIMIT
    home_size_mb: int = 1024  # cap on the tmpfs home (the task's storage_mb if smaller)
    tmp_size_mb: int = 256
    kill_grace_s: float = 2.0
    start_timeout_s: float = 30.0
    pids_alarm_fraction: float = 0.9
    capabilities: tuple[str, ...] = AGENT_CAPABILITIES


@dataclass
class CommandResult:
    output: str
    exit_code: int
    timed_out: bool = False
    shell_restarted: bool = False
    truncated: bool = False
    total_chars: int = 0
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)


class Sandbox:
    """A started container with the agent's shell; use as a context manager."""

    def __init__(
        self,
        client: docker.DockerClient,
        image: str,
        *,
        task_id: str = "adhoc",
        limits: TaskLimits | None = None,
        config: SandboxConfig | None = None,
        user: str = "user",
        workdir: str = "/home/user",
        home_tmpfs: bool = True,
        home: str | None = "/home/user",
        env: dict[str, str] | None = None,
        umask: str | None = None,
        verifier_network: bool = False,
        pipefail: bool = False,
        capabilities: tuple[str, ...] = (),
    ) -> None:
        self.client = client
        self.image = image
        self.task_id = task_id
        self.limits = limits or TaskLimits()
        self.config = config or SandboxConfig()
        self.user = user
        self.workdir = workdir
        self.home_tmpfs = home_tmpfs
        self.home = home
        self.env = dict(env or {})
        self.umask = umask
        self.pipefail = pipefail
        # a task that genuinely needs a capability beyond the profile names it (Task)
        self.capabilities = tuple(dict.fromkeys((*self.config.capabilities, *capabilities)))
        # The verifier may get a network the agent never has: the container starts on the
        # bridge, is cut off before the agent's shell starts, and reconnected to verify.
        self.verifier_network = verifier_network and not self.config.network
        self.network_connected = bool(self.config.network)
        self.container: docker.models.containers.Container | None = None
        self.shell: Shell | None = None
        self.host: procs.HostView | None = None
        self._session_ticks = 0
        self._baseline: set[int] = set()  # host pids of init and the idle main process
        self._baseline_ns: set[int] = set()  # the same, as pids inside the container
        self._upper_dir: str | None = None  # the container's writable layer, seen from here
        self.start_s = 0.0

    # --- lifecycle -----------------------------------------------------------------------
    @classmethod
    def for_task(
        cls,
        client: docker.DockerClient,
        image: str,
        task: Task,
        config: SandboxConfig | None = None,
        *,
        verifier_network: bool = False,
    ) -> Sandbox:
        """The sandbox an episode of ``task`` runs in (not started)."""
        return cls(
            client,
            image,
            task_id=task.task_id,
            limits=task.limits,
            config=config,
            user=task.agent_user,
            workdir=task.workdir,
            home_tmpfs=task.home_tmpfs,
            home=task.home,
            env=task.env,
            umask=task.umask,
            verifier_network=verifier_network,
            pipefail=task.pipefail,
            capabilities=task.capabilities,
        )

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        t0 = time.perf_counter()
        reaper.reap_orphans_once(self.client)
        lim, cfg = self.limits, self.config
        tmpfs = {
            "/tmp": f"size={cfg.tmp_size_mb}m,mode=1777,exec",
            "/var/tmp": "size=64m,mode=1777,exec",
        }
        if self.home_tmpfs:
            tmpfs["/home/user"] = f"size={min(lim.storage_mb, cfg.home_size_mb)}m,mode=0755,exec"
        try:
            self.container = self.client.containers.create(
                self.image,
                ["/bin/sh", "-c", _MAIN],
                labels=reaper.sandbox_labels(self.task_id),
                init=True,
                network_mode="bridge" if cfg.network or self.verifier_network else "none",
                nano_cpus=int(lim.cpus * 1e9),
                mem_limit=f"{lim.memory_mb}m",
                memswap_limit=f"{lim.memory_mb}m",
                pids_limit=lim.pids,
                tmpfs=tmpfs,
                environment={**self.env, "ES_HOME_TMPFS": "1" if self.home_tmpfs else "0"},
                user="root",
                cap_drop=["ALL"],
                cap_add=list(self.capabilities),
                security_opt=list(SECURITY_OPT),
                hostname="sandbox",
                detach=True,
            )
        except docker.errors.ImageNotFound:
            raise SandboxError(f"{self.task_id}: image {self.image} not found") from None
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"{self.task_id}: cannot create container: {exc.explanation}"
            ) from None
        reaper.register(self.container)
        try:
            self.container.start()
            if self.verifier_network:
                self.client.api.disconnect_container_from_network(self.container.id, "bridge")
            self.container.reload()
            init_pid = self.container.attrs["State"]["Pid"]
            self.host = procs.HostView.open(self.container.id, init_pid)
            upper = self.container.attrs.get("GraphDriver", {}).get("Data", {}).get("UpperDir")
            self._upper_dir = (
                upper if self.host is not None and upper and os.path.isdir(upper) else None
            )
            self._session_ticks = procs.now_ticks()
            self.shell = self._open_shell()
        except BaseException:
            self.close()
            raise
        self.start_s = time.perf_counter() - t0

    def close(self) -> None:
        if self.shell is not None:
            self.shell.close()
            self.shell = None
        if self.container is not None:
            cid = self.container.id
            reaper.force_remove(self.client.api, cid)
            reaper.unregister(cid)
            self.container = None

    def _open_shell(self) -> Shell:
        assert self.container is not None
        try:
            shell = Shell(
                self.client.api,
                self.container.id,
                self.user,
                self.workdir,
                home=self.home,
                env=self.env,
                umask=self.umask,
                pipefail=self.pipefail,
            )
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"{self.task_id}: cannot start the shell: {exc.explanation}"
            ) from None
        pattern = re.compile(rb"\n__ES_READY_" + shell.nonce.encode() + rb" (\d+) ([\d ]*)\n")
        buf = b""
        deadline = time.monotonic() + self.config.start_timeout_s
        while time.monotonic() < deadline:
            chunk = shell.read(deadline - time.monotonic())
            if chunk is None:
                raise SandboxError(
                    f"{self.task_id}: the shell exited at start-up: {buf.decode(errors='replace')[-300:]}"
                )
            buf += chunk
            match = pattern.search(buf)
            if match:
                shell.pid_in_container = int(match.group(1))
                if self.host is not None:
                    shell.host_pid = self.host.host_pid_of(shell.pid_in_container)
                    # Never kill what ran before the agent's shell (init, the idle main).
                    self._baseline.update(set(self.host.pids()) - {shell.host_pid})
                else:
                    self._baseline_ns.update(int(x) for x in match.group(2).split())
                return shell
        shell.close()
        raise SandboxError(
            f"{self.task_id}: the shell did not start within {self.config.start_timeout_s} s"
        )

    # --- commands ------------------------------------------------------------------------
    def run(self, command: str, timeout: float) -> CommandResult:
        """Run one command in the persistent shell; never raises for command failures."""
        if self.shell is None or self.container is None:
            raise SandboxError("sandbox is not started")
        t0 = time.perf_counter()
        notes: list[str] = []
        if self._pids_alarm():
            killed = self._kill_since(self._session_ticks)
            notes.append(
                f"[the container had reached its process limit ({self.limits.pids}); "
                f"{killed} leftover process(es) were killed before this command]"
            )
        self.shell.drain()
        start_ticks = procs.now_ticks()
        collector = OutputCollector(self.config.output_limit)
        rc, timed_out, restarted = self._execute(command, timeout, collector, start_ticks, notes)
        if not timed_out and self._pids_alarm():
            killed = self._kill_since(start_ticks)
            notes.append(
                f"[the container reached its process limit ({self.limits.pids}); the "
                f"{killed} process(es) this command started were killed]"
            )
        self.ensure_running()
        self._check_still_bounded()
        output = collector.finish()
        if notes:
            output = (output + "\n" if output else "") + "\n".join(notes)
        return CommandResult(
            output=output,
            exit_code=rc,
            timed_out=timed_out,
            shell_restarted=restarted,
            truncated=collector.truncated,
            total_chars=collector.total_chars,
            duration_s=time.perf_counter() - t0,
            notes=notes,
        )

    def _check_still_bounded(self) -> None:
        """End the episode (SandboxError) when the agent's commands left more on the
        container's writable layer than the task's storage: tmpfs mounts are capped by the
        kernel, the image's own filesystem (a root agent writing under / or /app) is not, as
        overlay2 on ext4 takes no size option, so it is measured after every command."""
        if self._upper_dir is None:
            return
        limit = self.limits.storage_mb * 2**20
        used = disk_usage(self._upper_dir, stop_above=limit)
        if used > limit:
            raise SandboxError(
                f"{self.task_id}: the agent wrote more than its storage limit of "
                f"{self.limits.storage_mb} MB to the container's filesystem"
            )

    def ensure_running(self) -> None:
        """A command that killed the container's main process (``kill -9 -1`` as root) stops
        the container: end the episode saying so (checked after every command and before
        verifying, so that no later turn or verifier meets the engine's words for a dying
        container)."""
        assert self.container is not None
        if self.host is not None and self._baseline:
            if all(procs.alive(pid) for pid in self._baseline):
                return
        else:
            with contextlib.suppress(docker.errors.APIError):
                self.container.reload()
            if self.container.attrs.get("State", {}).get("Running", True):
                return
        raise SandboxError(
            f"{self.task_id}: the container stopped during the episode: a command killed "
            f"its main process"
        )

    def _execute(
        self,
        command: str,
        timeout: float,
        collector: OutputCollector,
        start_ticks: int,
        notes: list[str],
    ) -> tuple[int, bool, bool]:
        """(exit code, timed out?, shell restarted?); the output goes to ``collector``."""
        assert self.shell is not None
        timed_out = False
        try:
            pattern = self.shell.send_command(command)
            rc = self.shell.collect(pattern, collector, time.monotonic() + timeout)
            if rc is not None:
                return rc, False, False
            timed_out = True
            return self._interrupt(pattern, collector, start_ticks, timeout, notes)
        except ShellDied:
            code = self.shell.exit_code()
            self._restart_shell()
            if timed_out:
                notes.append(restarted_note(timeout))
                return TIMEOUT_EXIT_CODE, True, True
            notes.append(f"[the shell exited; a new shell was started in {self.workdir}]")
            return (code if code is not None else 1), False, True

    def _interrupt(
        self,
        pattern: re.Pattern[bytes],
        collector: OutputCollector,
        start_ticks: int,
        timeout: float,
        notes: list[str],
    ) -> tuple[int, bool, bool]:
        """A command past its timeout: kill what it started, then everything since the
        session began, then the shell itself (a builtin loop), until the shell answers."""
        self._kill_since(start_ticks)
        rc = self.shell.collect(pattern, collector, time.monotonic() + self.config.kill_grace_s)
        if rc is None:
            self._kill_since(self._session_ticks)
            rc = self.shell.collect(pattern, collector, time.monotonic() + self.config.kill_grace_s)
        if rc is None:
            self._restart_shell()
            notes.append(restarted_note(timeout))
            return TIMEOUT_EXIT_CODE, True, True
        notes.append(f"[command timed out after {timeout:g} s and was interrupted]")
        return TIMEOUT_EXIT_CODE, True, False

    def _restart_shell(self) -> None:
        self.ensure_running()
        if self.shell is not None:
            if self.host and self.shell.host_pid > 0:
                with contextlib.suppress(OSError):
                    os.kill(self.shell.host_pid, signal.SIGKILL)
            else:
                self.exec_root(["kill", "-9", str(self.shell.pid_in_container)], timeout=10)
            self.shell.close()
        self._kill_since(self._session_ticks)
        self.shell = self._open_shell()

    def _kill_since(self, ticks: int) -> int:
        assert self.shell is not None
        if self.host is not None:
            return self.host.kill_since(ticks, {self.shell.host_pid} | self._baseline)
        script = procs.in_container_script(ticks, {self.shell.pid_in_container} | self._baseline_ns)
        rc, out = self.exec_root(["python3", "-c", script], timeout=15)
        try:
            return int(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def _pids_alarm(self) -> bool:
        if self.host is None:
            return False
        current = self.host.pids_current()
        return current is not None and current >= self.config.pids_alarm_fraction * self.limits.pids

    # --- plumbing for verifiers ----------------------------------------------------------
    def connect_network(self) -> bool:
        """Give the container the network for the verifier; False when it cannot have one."""
        if self.network_connected:
            return True
        if not self.verifier_network or self.container is None:
            return False
        try:
            self.client.api.connect_container_to_network(self.container.id, "bridge")
        except docker.errors.APIError as exc:
            log.warning("%s: could not connect the verifier's network: %s", self.task_id, exc)
            return False
        self.network_connected = True
        return True

    def exec_root(
        self,
        cmd: list[str],
        timeout: float,
        user: str = "root",
        workdir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> tuple[int, str]:
        """Run ``cmd`` via docker exec, bounded by ``timeout`` (coreutils timeout inside)."""
        assert self.container is not None
        wrapped = ["timeout", "-k", "5", str(int(max(1, timeout)))] + cmd
        try:
            exec_id = self.client.api.exec_create(
                self.container.id,
                wrapped,
                stdout=True,
                stderr=True,
                user=user,
                workdir=workdir or "/",
                environment={**self.env, **(env or {}), "PYTHONDONTWRITEBYTECODE": "1"},
            )["Id"]
            raw = self.client.api.exec_start(exec_id)
            code = self.client.api.exec_inspect(exec_id).get("ExitCode")
        except docker.errors.APIError as exc:
            return -1, f"docker exec failed: {exc.explanation or exc}"
        text = OutputCollector(self.config.output_limit)
        text.feed(raw if isinstance(raw, bytes) else b"")
        return (code if code is not None else -1), text.finish()

    def put_files(self, dest_dir: str, files: dict[str, bytes], mode: int = 0o644) -> None:
        """Copy ``files`` (relative name -> bytes) into ``dest_dir`` as root-owned files."""
        assert self.container is not None
        code, why = self.exec_root(["mkdir", "-p", "-m", "755", dest_dir], timeout=10)
        if code == 0:
            try:
                if self.container.put_archive(dest_dir, tar_archive(files, mode)):
                    return
                why = "the engine refused the archive"
            except docker.errors.APIError as exc:
                why = f"{exc.explanation or exc}"
        # a container its agent killed (kill -9 -1 as root) may still have looked alive a
        # moment ago: name that, not the engine's words for a vanished directory
        self.ensure_stopped_is_named()
        raise SandboxError(f"{self.task_id}: could not copy files to {dest_dir}: {why.strip()}")

    def ensure_stopped_is_named(self, settle_s: float = 2.0) -> None:
        """After a failed engine call: raise :meth:`ensure_running`'s error if the container
        stops within ``settle_s`` (its main process may take a moment to be reaped)."""
        deadline = time.monotonic() + settle_s
        while True:
            self.ensure_running()
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)
