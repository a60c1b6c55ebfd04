"""The Ray actor of a worker (``placement: ray``): a :class:`LocalWorker` in its own process.

It runs on any node of the cluster. What it adds to the local worker it wraps is what
crossing processes needs: its own copy of the update log (only the records it lacks are
sent), a per-job clock, aborts by job id, and the cleanup of its containers when it or the
orchestrator goes. The orchestrator's side, and how these are used, is
:mod:`runner.workers.ray_driver`.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from runner.config import RunConfig
from runner.es import UpdateRecord
from runner.rollouts import JobOutcome, JobSpec, docker_client
from runner.terminal import reaper
from runner.terminal.images import ImageBuilder
from runner.workers.local import LocalWorker


def uses_gpu(config: RunConfig) -> bool:
    return config.model.device.startswith("cuda")


class WorkerActor:
    """One worker inside a Ray actor: a local worker with its own Docker client and builder."""

    def __init__(self, index: int, config: RunConfig, driver: str) -> None:
        client = docker_client()
        reaper.reap_orphans_once(client)  # dead owners' containers on this host
        # Ray shows this actor only its own GPU (CUDA_VISIBLE_DEVICES): "cuda" is that one.
        device = "cuda" if uses_gpu(config) else "cpu"
        # The clock is set per job (run_job); this one is never read.
        self.worker = LocalWorker(
            index, config, client, ImageBuilder(client), time.monotonic, device=device
        )
        self.log: list[UpdateRecord] = []
        self._lock = threading.Lock()
        self._aborts: dict[int, threading.Event] = {}
        self._aborted: set[int] = set()  # abort calls that arrived before their job
        self._driver = driver  # the orchestrator's owner label
        threading.Thread(target=self._watch_driver, name="watchdog", daemon=True).start()

    def info(self) -> dict[str, Any]:
        return {
            "base_hash": self.worker.base_hash,
            "es_config": self.worker.es_config(),
            "owner": reaper.owner_label(),  # the label of every container this actor starts
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "boot": reaper.boot_id(),
        }

    def weights_hash(self) -> tuple[int, str]:
        """(version, sha256 of the weights): to check a replay against another copy."""
        backend = self.worker.backend
        return backend.version, backend.weights_hash()

    def sync(self, start: int, records: Sequence[UpdateRecord]) -> int:
        """Append ``records`` (versions ``start + 1``...) to the log and replay them."""
        if start != len(self.log):
            raise RuntimeError(f"update log out of step: holds {len(self.log)}, sent from {start}")
        self.log.extend(records)
        return self.worker.sync(self.log)

    def run_job(self, job: JobSpec, clock: tuple[float, float, str]) -> JobOutcome:
        t_run, monotonic_then, boot = clock
        # One machine: the same monotonic clock, exact. Another: run time as the job arrives.
        shift = t_run - (monotonic_then if boot == reaper.boot_id() else time.monotonic())
        with self._lock:
            abort = self._aborts[job.job_id] = threading.Event()
            if job.job_id in self._aborted:
                abort.set()
        try:
            return self.worker.run_job(job, abort, clock=lambda: shift + time.monotonic())
        finally:
            with self._lock:
                self._aborts.pop(job.job_id, None)
                self._aborted.discard(job.job_id)

    def abort(self, job_id: int) -> None:
        """Stop job ``job_id``'s episodes at their next turn (the job then returns)."""
        with self._lock:
            event = self._aborts.get(job_id)
            if event is None:
                self._aborted.add(job_id)
            else:
                event.set()

    def shutdown(self) -> None:
        self._abort_all()
        reaper.remove_all_live()  # cut short what still runs
        self.worker.close()

    def _abort_all(self) -> None:
        with self._lock:
            for event in self._aborts.values():
                event.set()

    def _watch_driver(self) -> None:
        """On the orchestrator's host: once it is dead (SIGKILL), remove this actor's
        containers and exit, instead of running on until Ray notices (seconds)."""
        while not reaper.owner_is_dead(self._driver):  # never true for another host
            time.sleep(0.5)
        self._abort_all()
        reaper.remove_all_live()
        time.sleep(0.2)  # a container being created meanwhile
        reaper.remove_all_live()
        os._exit(1)
