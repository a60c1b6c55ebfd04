"""Ray workers (``placement: ray``), the orchestrator's side: each worker is a Ray actor.

The orchestrator stays the single controller, in its own process (Ray's driver): the
scheduling policy, the journal, the trace and the update rule never leave it. A
:class:`RayWorker` is the orchestrator's handle on one actor and is a
:class:`runner.workers.protocol.Worker`, as a ``LocalWorker`` is, so the orchestrator
cannot tell them apart. The actor (:class:`runner.workers.ray_actor.WorkerActor`) wraps a
``LocalWorker`` (a backend with its own copy of the weights, its batcher) with its own
Docker client and :class:`ImageBuilder`, and runs its jobs.

What crosses between the processes, and how:

- **Updates** go as :class:`UpdateRecord` lists, (seed, coefficient) entries, never as
  weights: the actor keeps its own copy of the update log and replays the records it
  misses, exactly as a local worker does. Only the records the actor lacks are sent.
- **Abort.** A ``threading.Event`` cannot cross processes. The actor is threaded
  (``max_concurrency`` 4) and has ``abort(job_id)``; while a job runs, the orchestrator's
  thread polls its abort event every 50 ms and, once it is set, calls ``abort``, which sets
  the actor's own event for that job: its episodes stop at their next turn, as locally.
- **Clock.** Episode start and end times are the orchestrator's run time. With each job
  the orchestrator sends its run time and its ``time.monotonic()`` read at the same
  moment. On the same machine (the same ``/proc/sys/kernel/random/boot_id``) the monotonic
  clock is shared by every process, so the actor's clock is exactly the orchestrator's:
  ``t_run + (monotonic() - monotonic_then)``. On another host the monotonic clocks are
  unrelated, so the actor sets its clock to ``t_run`` when the job arrives: its times are
  early by the call's one-way latency (milliseconds on a LAN) and never before the job's
  start; clock drift over one job is negligible.
- **Crashes.** An actor that dies (``RayActorError`` / ``ActorDiedError``: killed, out of
  memory, its node lost) raises :class:`WorkerDied` from ``sync`` or ``run_job``: the
  orchestrator's crashed-worker path logs it, cancels the job with the reason in the trace
  and builds a new worker, i.e. a new actor. An exception raised inside the actor's job is
  re-raised unwrapped (as a local worker would raise it).
- **Containers.** A container carries its creator's owner label (host, boot id, pid, start
  time; :mod:`runner.terminal.reaper`): an actor's containers name the actor's pid, not the
  orchestrator's. An actor that shuts down removes its live containers. For one that died,
  ``close`` (the crashed-worker path) waits until its pid is gone and removes the
  containers with its exact owner label (same host only). If the orchestrator itself is
  killed (SIGKILL), each actor on its host notices within 0.5 s (it watches the
  orchestrator's owner label), removes its containers and exits; Ray would otherwise keep
  the actors running for a few seconds. A container missed in between has a dead owner, so
  ``es-runner train --resume`` reaps it at start-up like any dead owner's, and each new
  actor does the same on its own host when it starts (the only cleanup on other hosts,
  whose actors Ray kills a few seconds after their driver).

Resources: with ``model.device`` cuda each actor gets one GPU (``num_gpus=1``) from one
placement group with one ``{GPU: 1, CPU: 1}`` bundle per worker (``PACK``: several GPUs of a
node are used before other nodes), reserved before any actor starts; Ray sets the actor's
``CUDA_VISIBLE_DEVICES``, so its device is ``cuda``. Otherwise each actor takes one CPU
(Ray then sets ``OMP_NUM_THREADS=1`` in it). The GPU path is not tested here (no GPU).

``RAY_ADDRESS`` set: join that cluster, shipping this code (``runner``, ``staleness_sim``)
with the job; every node needs the runner's dependencies, a Docker engine with the base
image, the model at ``model.path`` and the task folder at the same path. Unset: start a
local Ray instance (as many CPUs as the machine has, at least ``workers``), stopped when
the run ends. An already initialised Ray (``ray.init`` by the caller) is used as it is.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from runner.config import RunConfig
from runner.errors import RunFailed, UserError
from runner.es import UpdateRecord
from runner.rollouts import JobOutcome, JobSpec
from runner.terminal import reaper
from runner.workers.ray_actor import WorkerActor, uses_gpu

log = logging.getLogger(__name__)

ABORT_POLL_S = 0.05  # how often a waiting job checks the orchestrator's abort event
START_TIMEOUT_S = 1800.0  # an actor that is not ready by then (no room on the cluster)
RESOURCES_TIMEOUT_S = 600.0  # the GPU placement group


class WorkerDied(RuntimeError):
    """The worker's Ray actor died (killed, out of memory, its node lost)."""


def import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("placement: ray needs Ray: pip install -e .[ray]") from None
    return ray


def connect(workers: int) -> bool:
    """Join ``RAY_ADDRESS``'s cluster, or start a local Ray; True if this call started it."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    if address:  # ship this code to the cluster (its dependencies must be there)
        import runner
        import staleness_sim

        env = {"py_modules": [runner, staleness_sim]}
        ray.init(address=address, runtime_env=env, log_to_driver=False)
    else:
        root = str(Path(__file__).resolve().parents[2])  # the repository
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        ray.init(
            num_cpus=max(workers, os.cpu_count() or 1),
            runtime_env={"env_vars": {"PYTHONPATH": path}},
            include_dashboard=False,
            log_to_driver=False,
        )
    return True


class RayWorkerPool:
    """Builds the run's Ray workers: ``pool(index, config, client, builder, clock)``.

    Connects to Ray and reserves the GPUs on first use; :meth:`shutdown` (called by the
    orchestrator at the end of the run) releases them and stops a Ray it started.
    """

    def __init__(self, config: RunConfig) -> None:
        import_ray()  # a missing Ray is said now, in one line
        self.config = config
        self._actor_class = None
        self._group = None
        self._started = False

    def __call__(
        self, index: int, config: RunConfig, client, builder, clock: Callable[[], float]
    ) -> RayWorker:
        return RayWorker(index, config, client, builder, clock, pool=self)

    def actor(self, index: int):
        """A new actor for worker ``index`` (not waited for)."""
        ray = import_ray()
        if self._actor_class is None:
            self._started = connect(self.config.workers)
            self._actor_class = ray.remote(max_concurrency=4)(WorkerActor)
            if uses_gpu(self.config):
                self._group = self._reserve_gpus()
        if self._group is None:
            options: dict[str, Any] = {"num_cpus": 1}
        else:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options = {
                "num_cpus": 1,
                "num_gpus": 1,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self._group, placement_group_bundle_index=index
                ),
            }
        driver = reaper.owner_label()  # this process: the actor watches it
        return self._actor_class.options(**options).remote(index, self.config, driver)

    def _reserve_gpus(self):
        """One placement group, one {GPU: 1, CPU: 1} bundle per worker (a restarted actor
        takes its predecessor's bundle)."""
        ray = import_ray()
        from ray.util.placement_group import placement_group, remove_placement_group

        n = self.config.workers
        group = placement_group([{"GPU": 1, "CPU": 1}] * n, strategy="PACK")
        ready, _ = ray.wait([group.ready()], timeout=RESOURCES_TIMEOUT_S)
        if not ready:
            remove_placement_group(group)
            raise RunFailed(
                f"the Ray cluster has no room for {n} workers with one GPU each after "
                f"{RESOURCES_TIMEOUT_S:.0f}s (available: {ray.available_resources()})"
            )
        return group

    def shutdown(self) -> None:
        if self._actor_class is None:
            return
        ray = import_ray()
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._group)
            self._group = None
        if self._started:
            ray.shutdown()
        self._actor_class = None


class RayWorker:
    """The orchestrator's handle on one worker's actor: a :class:`~runner.workers.Worker`."""

    def __init__(
        self,
        index: int,
        config: RunConfig,
        client,
        builder,
        clock: Callable[[], float],
        *,
        pool: RayWorkerPool | None = None,
    ) -> None:
        self.index, self.config = index, config
        self.client, self.builder, self.clock = client, builder, clock
        self.pool = pool or RayWorkerPool(config)
        self.actor = self.pool.actor(index)
        self._ready = self.actor.info.remote()  # the actor loads while the others start
        self._info: dict[str, Any] | None = None
        self._synced = 0  # versions the actor holds
        self._dead = False

    # -- the interface ------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        """The actor's base hash, ES config and owner label; waits until it is ready."""
        if self._info is None:
            ray = import_ray()
            ready, _ = ray.wait([self._ready], timeout=START_TIMEOUT_S)
            if not ready:
                raise RunFailed(
                    f"worker {self.index}: its Ray actor did not start in {START_TIMEOUT_S:.0f}s "
                    f"(the cluster has {ray.available_resources()} free)"
                )
            try:
                self._info = self._get(self._ready)
            except WorkerDied as exc:
                raise RunFailed(
                    f"worker {self.index}: its Ray actor could not start: {exc}"
                ) from None
            log.info(
                "worker %d: Ray actor pid %d on %s",
                self.index,
                self._info["pid"],
                self._info["host"],
            )
        return self._info

    @property
    def base_hash(self) -> str | None:
        return self.info["base_hash"]

    @property
    def pid(self) -> int:
        return self.info["pid"]

    @property
    def owner(self) -> str:
        """The owner label of the containers this worker's actor starts."""
        return self.info["owner"]

    def es_config(self) -> dict[str, Any]:
        return self.info["es_config"]

    def sync(self, log: Sequence[UpdateRecord]) -> int:
        """Send the records the actor lacks (seeds and coefficients); it replays them."""
        target = len(log)
        if target < self._synced:
            raise RuntimeError(f"cannot go back from version {self._synced} to {target}")
        applied = self._get(self.actor.sync.remote(self._synced, list(log[self._synced :])))
        self._synced = target
        return applied

    def run_job(self, job: JobSpec, abort: threading.Event) -> JobOutcome:
        ray = import_ray()
        clock = (self.clock(), time.monotonic(), reaper.boot_id())
        ref = self.actor.run_job.remote(job, clock)
        sent = False
        while True:
            ready, _ = ray.wait([ref], timeout=ABORT_POLL_S)
            if ready:
                return self._get(ref)
            if not sent and abort.is_set():
                self.actor.abort.remote(job.job_id)
                sent = True

    def close(self) -> None:
        ray = import_ray()
        if not self._dead:
            try:
                self._get(self.actor.shutdown.remote(), timeout=120)
            except WorkerDied:
                pass
            except Exception as exc:  # noqa: BLE001 - killed below in any case
                log.warning("worker %d: its actor did not shut down cleanly: %s", self.index, exc)
                self._dead = True  # its containers are reaped below, once it is gone
        ray.kill(self.actor, no_restart=True)
        if self._dead:
            self._reap()

    # -- helpers ------------------------------------------------------------------------
    def _get(self, ref, timeout: float | None = None):
        """``ray.get``: a dead actor becomes WorkerDied; an error of the job is re-raised."""
        ray = import_ray()
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayActorError as exc:
            self._dead = True
            raise WorkerDied(self._death(exc)) from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, Exception):
                raise cause from None
            raise

    def _death(self, exc: Exception) -> str:
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in str(exc).splitlines()]
        lines = [ln for ln in lines if ln]
        pid = self._info["pid"] if self._info else "?"
        last = lines[-1] if lines else type(exc).__name__
        return f"its Ray actor (pid {pid}) died: {last}"[:300]

    def _reap(self, wait_s: float = 10.0) -> None:
        """Remove the containers a dead actor left (on this host; others: see the module doc)."""
        if self._info is None:
            return  # it never got as far as starting a container
        info = self._info
        if info["host"] != socket.gethostname() or info["boot"] != reaper.boot_id():
            log.warning(
                "worker %d: its dead actor's containers on %s are removed when a worker or "
                "run next starts there",
                self.index,
                info["host"],
            )
            return
        deadline = time.monotonic() + wait_s
        while not reaper.owner_is_dead(info["owner"]) and time.monotonic() < deadline:
            time.sleep(0.1)  # the process may take a moment to go
        if not reaper.owner_is_dead(info["owner"]):
            log.warning("worker %d: its actor (pid %d) is still running", self.index, info["pid"])
            return
        removed = remove_owned(self.client, info["owner"])
        if removed:
            log.warning("worker %d: removed %d container(s) of its dead actor", self.index, removed)


def remove_owned(client, owner: str) -> int:
    """Force-remove the sandbox containers whose owner label is exactly ``owner``."""
    return reaper.remove_sandboxes(client, lambda label: label == owner)
