"""The orchestrator: the single controller of a run, in asyncio, over G workers.

Every dispatch, verdict, commit and cancel is a decision of the scheduling policy (the
simulator's own objects, held in :class:`RunState`), taken in this thread only, in the
order the SimPy engine takes them:

1. a landing result is judged, and any cohort it completes is committed, before its
   worker asks for its next job (so the worker that completes a cohort starts its next
   job at the new version);
2. idle workers are served first come, first served, stopping at the first ``Wait``;
3. a worker replays the updates it missed before its job starts (``syncing``);
4. the run ends with the last commit; jobs still running are cancelled.

Workers run their jobs on threads; what they return is handed back to this loop. With
``placement: ray`` each worker is a Ray actor (:mod:`runner.workers.ray_driver`) and the thread
waits on it; the policy, the journal and the trace stay here either way. Each
change of state is appended to the journal (commits fsync'd) as it happens, and the
trace tables are rewritten (throttled) as the run goes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pandas as pd

from runner.config import RunConfig, portable_path, portable_paths
from runner.errors import RunFailed
from runner.es import UpdateRecord, write_checkpoint
from runner.journal import Journal, drop_torn_tail, read_events
from runner.machine import CpuUse, machine
from runner.rollouts import EPISODE_COLUMNS, JobSpec
from runner.run_dir import RunDir
from runner.run_state import RunState
from runner.task_pool import TaskPool
from runner.terminal import reaper
from runner.workers import worker_factory
from staleness_sim.core.metrics import summarize

log = logging.getLogger(__name__)

MAX_CRASHES = 3  # consecutive crashes of one worker before the run gives up
FLUSH_EVERY_S = 2.0


@dataclass
class RunOutcome:
    status: str  # finished | interrupted | failed
    version: int
    reason: str = ""


def scenario_of(config: RunConfig) -> dict[str, Any]:
    """The run's keys that the simulator reads the same way."""
    keys = ("name", "seed", "workers", "cohort", "updates", "policy", "drain_every")
    return {k: v for k, v in config.model_dump(mode="json").items() if k in keys}


class Orchestrator:
    def __init__(
        self,
        run: RunDir,
        config: RunConfig,
        pool: TaskPool,
        client,
        builder,
        *,
        progress=None,
        evaluator=None,
        worker_class=None,
        tracker=None,
    ) -> None:
        self.run_dir, self.config, self.pool = run, config, pool
        self.client, self.builder = client, builder
        self.progress, self.evaluator = progress, evaluator
        self.tracker = tracker  # live metrics (runner.tracking), or None
        # Builds worker i: LocalWorker, or a Ray actor's handle with placement: ray.
        self.worker_class = worker_class or worker_factory(config)
        self.rule = config.es.update_rule()
        self.state = RunState(config, self.rule)
        self._offset = 0.0
        self._m0 = time.monotonic()
        self.stats = {"controller_s": 0.0, "journal_s": 0.0, "flush_s": 0.0, "sync_s": 0.0}
        self.stats["tracking_s"] = 0.0

    # -- the clock: run time, continuous across resumes ---------------------------------
    def clock(self) -> float:
        return self._offset + (time.monotonic() - self._m0)

    # -- entry point --------------------------------------------------------------------
    def run(self) -> RunOutcome:
        events, _ = read_events(self.run_dir.journal_path)
        for ev in events:
            self.state.replay(ev)
        # what the trackers already have: a resumed run logs only the updates they lack
        self._logged = {e["version"] for e in events if e["e"] == "logged"}
        self._members = {e["version"]: e["jobs"] for e in events if e["e"] == "commit"}
        if self.state.finished:
            return RunOutcome("finished", self.state.version, "the run had already finished")
        if self.evaluator is not None:  # versions a stopped run did not get to evaluate
            self.evaluator.schedule_missing(self.state.version, self.state.log)
        resumed = bool(self.state.segments)
        self.journal = Journal(self.run_dir.journal_path)
        drop_torn_tail(self.run_dir / "transcripts.jsonl")  # a kill mid-append tears it too
        try:
            self._start_workers()
            self._offset, self._m0 = self.state.now, time.monotonic()
            self._cpu = CpuUse()  # the cores busy over this segment (meta.json)
            reason = (
                "resumed: the previous process stopped with these jobs in flight"
                if resumed
                else "started"
            )
            n = len(self.state.segments) + 1
            ev = self.state.segment(n, time.time(), self._offset, reason, machine())
            ev["base_hash"] = self.base_hash
            ev["pid"] = os.getpid()
            self._write(ev, durable=True)
            if resumed:
                log.info("resumed at version %d (t=%.1fs)", self.state.version, self.state.now)
            return asyncio.run(self._main())
        finally:
            for w in getattr(self, "workers", {}).values():
                w.close()
            shutdown = getattr(self.worker_class, "shutdown", None)
            if shutdown is not None:  # e.g. the Ray workers' placement group, a local Ray
                shutdown()
            self.journal.close()

    def _start_workers(self) -> None:
        self.workers = workers = {}  # closed by run() whatever happens next
        for i in range(self.config.workers):
            workers[i] = self.worker_class(i, self.config, self.client, self.builder, self.clock)
        # (Ray workers load in parallel: reading base_hash waits until each one is ready.)
        hashes = {w.base_hash for w in workers.values()}
        recorded = [s.get("base_hash") for s in self._segment_events() if s.get("base_hash")]
        if len(hashes) != 1 or (recorded and recorded[0] not in hashes):
            raise RunFailed(
                f"the base weights at {self.config.model.path} differ from the ones this run "
                f"started from (sha256 {recorded[0] if recorded else '?'}); restore that model"
            )
        self.base_hash = hashes.pop()
        self._es_config = workers[0].es_config()

    def _segment_events(self) -> list[dict[str, Any]]:
        events, _ = read_events(self.run_dir.journal_path)
        return [e for e in events if e["e"] == "segment"]

    async def _main(self) -> RunOutcome:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._executor = ThreadPoolExecutor(
            2 * self.config.workers + 2, thread_name_prefix="worker"
        )
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()
        self._aborts: dict[int, threading.Event] = {}
        self._stop_reason: str | None = None
        self._failure: str | None = None
        self._done = asyncio.Event()
        self._last_flush = 0.0
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop, f"interrupted ({signal.Signals(sig).name})")
        try:
            for version in range(1, self.state.version + 1):
                self._track(version)  # (only those a stopped process did not log)
            while self.state.policy.ready() and not self._finished():
                self._commit()  # a result landed before the previous process could commit
            if self._finished():
                self._done.set()
            loops = [asyncio.create_task(self._worker_loop(w)) for w in self.workers]
            await self._done.wait()
            self._abort_all()
            await asyncio.gather(*loops)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            self._executor.shutdown(wait=True)
        if self._failure:
            reason, status = self._failure, "failed"
        elif self._stop_reason:
            reason, status = self._stop_reason, "interrupted"
        else:
            reason, status = "run ended", "finished"
        end = self.state.end(self._end_time(), reason, self._cpu.since())
        self._write(end, durable=True)
        self._checkpoint()
        self._flush(force=True)
        if self.progress is not None:
            self.progress.close(self.state)
        return RunOutcome(status, self.state.version, reason)

    def _finished(self) -> bool:
        return self.state.version >= self.config.updates

    def _end_time(self) -> float:
        # A finished run ends when its last update is available (the simulator's rule 4).
        if self._finished() and self.state.rec.updates["time"]:
            return self.state.rec.updates["time"][-1]
        return self.clock()

    def stop(self, reason: str) -> None:
        """Ctrl-C / SIGTERM: stop dispatching, cancel what runs, save everything."""
        if self._stop_reason is None:
            log.warning("stopping: %s", reason)
            self._stop_reason = reason
            self._done.set()

    # -- the worker loop ----------------------------------------------------------------
    async def _worker_loop(self, w: int) -> None:
        crashes = 0
        while not self._done.is_set():
            self._set_state(w, "idle")
            ev = await self._admit(w)
            if ev is None:
                break
            job, version = ev["job"], ev["version"]
            abort = self._aborts[job] = threading.Event()
            tasks = tuple(self.pool.by_id[t] for t in ev["tasks"])
            spec = JobSpec(job, version, ev["seed"], ev["sign"], ev["sampling_seed"], tasks)
            try:
                self._set_state(w, "syncing")
                t0 = time.perf_counter()
                await self._call(self.workers[w].sync, self.state.log[:version])
                sync_s = time.perf_counter() - t0
                self.stats["sync_s"] += sync_s
                if abort.is_set() or self._done.is_set():  # cancelled while it was syncing
                    continue
                self._set_state(w, "busy")
                self._write(self.state.job_started(job, self.clock(), sync_s))
                outcome = await self._call(self.workers[w].run_job, spec, abort)
            except RunFailed:
                raise
            except Exception as exc:  # noqa: BLE001 - a crashed worker is restarted
                crashes += 1
                await self._worker_crashed(w, job, exc, crashes)
                continue
            finally:
                self._aborts.pop(job, None)
            crashes = 0
            if abort.is_set() or self._done.is_set():
                continue  # cancelled meanwhile: the trace already says why
            self._land(job, outcome)

    async def _call(self, fn, *args):
        return await self._loop.run_in_executor(self._executor, fn, *args)

    async def _admit(self, w: int) -> dict[str, Any] | None:
        """Wait until the policy lets worker ``w`` start a job (FIFO among idle workers)."""
        if not self._waiting:
            ev = self._try_dispatch(w)
            if ev is not None:
                return ev
        fut = self._loop.create_future()
        self._waiting.append((w, fut))
        self._pump()
        return await fut

    def _try_dispatch(self, w: int) -> dict[str, Any] | None:
        if self._done.is_set():
            return None
        t0 = time.perf_counter()
        ev = self.state.dispatch(w, self.clock())
        if not isinstance(ev, dict):
            return None
        ev["tasks"] = [
            t.task_id for t in self.pool.batch(ev["task_seed"], self.config.episodes_per_job)
        ]
        self.stats["controller_s"] += time.perf_counter() - t0
        self._write(ev)
        self._show()
        return ev

    def _pump(self) -> None:
        while self._waiting:
            w, fut = self._waiting[0]
            if self._done.is_set():
                self._waiting.popleft()
                fut.set_result(None)
                continue
            ev = self._try_dispatch(w)
            if ev is None:
                return
            self._waiting.popleft()
            fut.set_result(ev)

    # -- events -------------------------------------------------------------------------
    def _land(self, job: int, outcome) -> None:
        t0 = time.perf_counter()
        ev = self.state.land(
            job,
            self.clock(),
            {
                "reward": outcome.fitness(self.config.es.reward),  # the ES fitness
                "episodes": outcome.episodes,
                "perturb_s": outcome.perturb_s,
                "generation_s": outcome.generation_s,
                "container_s": outcome.container_s,
            },
        )
        self._write(ev)
        self._append_transcripts(outcome.transcripts)
        while self.state.policy.ready() and not self._finished():
            self._commit()
        self.stats["controller_s"] += time.perf_counter() - t0
        self._pump()
        self._flush()
        self._show()

    def _commit(self) -> None:
        ev = self.state.commit(self.clock())
        self._write(ev, durable=True)  # the update exists once this line is on disk
        for job in ev["cancel"]:
            self._abort(job)
        version = ev["version"]
        self._members[version] = ev["jobs"]
        self._track(version)
        every = self.config.checkpoint_every
        if every and version % every == 0:
            self._checkpoint()
        if self.evaluator is not None:
            self.evaluator.committed(version, self.state.log)
        if self._finished():
            self._done.set()

    def _track(self, version: int) -> None:
        """Send update ``version``'s scalars to the trackers, once: the journal's ``logged``
        event says it was sent, so a resumed run neither repeats nor skips a step."""
        members = self._members.pop(version, None)
        if self.tracker is None or version in self._logged:
            return
        t0 = time.perf_counter()
        self.tracker.committed(self.state, version, members)
        self._write({"e": "logged", "version": version})
        self._logged.add(version)
        self.stats["tracking_s"] += time.perf_counter() - t0

    async def _worker_crashed(self, w: int, job: int, exc: Exception, crashes: int) -> None:
        log.error(
            "worker %d crashed on job %d: %s: %s", w, job, type(exc).__name__, exc, exc_info=exc
        )
        if self._done.is_set():  # stopping anyway: the end event cancels the job
            return
        if job in self.state.running:
            reason = f"worker {w} crashed: {type(exc).__name__}: {exc}"
            self._write(self.state.cancel(job, self.clock(), reason[:500]))
            self._pump()
        if crashes >= MAX_CRASHES:
            self._failure = (
                f"worker {w} crashed {crashes} times in a row (last: {type(exc).__name__}: {exc})"
            )
            self._done.set()
            return
        self._set_state(w, "syncing")  # rebuilding its weights: load, then replay
        old = self.workers.pop(w)
        await self._call(old.close)
        try:
            worker = await self._call(
                self.worker_class, w, self.config, self.client, self.builder, self.clock
            )
            self.workers[w] = worker
            base_hash = await self._call(lambda: worker.base_hash)  # (waits until it is ready)
        except Exception as exc:  # noqa: BLE001 - reported as the run's failure
            self._failure = f"worker {w} could not be restarted: {type(exc).__name__}: {exc}"
            self._done.set()
            return
        if base_hash != self.base_hash:
            self._failure = (
                f"worker {w} restarted on different base weights (sha256 {base_hash}, the run "
                f"has {self.base_hash}); restore the model at {self.config.model.path}"
            )
            self._done.set()
            return
        log.warning("worker %d restarted", w)

    def _abort(self, job: int) -> None:
        event = self._aborts.get(job)
        if event is not None:
            event.set()

    def _abort_all(self) -> None:
        for event in self._aborts.values():
            event.set()
        # Commands already running are cut short by removing their containers.
        if self._aborts:
            self._executor.submit(reaper.remove_all_live)

    def _set_state(self, w: int, state: str) -> None:
        if self._done.is_set():  # the run's time has ended: the end event closes intervals
            return
        ev = self.state.worker_state(w, state, self.clock())
        if ev is not None:
            self._write(ev)

    # -- writing ------------------------------------------------------------------------
    def _write(self, ev: dict[str, Any], durable: bool = False) -> None:
        t0 = time.perf_counter()
        try:
            self.journal.append(ev, durable=durable)
        except OSError as exc:
            self._failure = (
                f"cannot write the journal ({exc}); stopped. Committed updates up to version "
                f"{self.state.version - (ev['e'] == 'commit')} are safe; free space and resume"
            )
            self._done.set()
            raise RunFailed(self._failure) from None
        self.stats["journal_s"] += time.perf_counter() - t0

    def _append_transcripts(self, transcripts: list[dict[str, Any]]) -> None:
        import json

        with open(self.run_dir / "transcripts.jsonl", "a", encoding="utf-8") as f:
            for t in transcripts:
                f.write(json.dumps(t, default=str) + "\n")

    def _checkpoint(self) -> None:
        try:
            write_checkpoint(
                self.run_dir.checkpoint_dir,
                base_hash=self.base_hash,
                config=self._es_config,
                log=list(self.state.log),
                base_path=portable_path(self.config.model.path, self.run_dir.path),
            )
        except OSError as exc:  # the previous checkpoint file is intact (write, then rename)
            log.error("could not write the checkpoint: %s", exc)

    def meta(self) -> dict[str, Any]:
        return {
            "source": "measured",
            "workers": self.config.workers,
            "wall_clock_s": self.state.now,
            "scenario": scenario_of(self.config),
            "config": portable_paths(self.config, self.run_dir.path).model_dump(mode="json"),
            "segments": self.state.segments,
            "base_hash": getattr(self, "base_hash", None),
            "orchestrator": dict(self.stats),
        }

    def _flush(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last_flush < FLUSH_EVERY_S:
            return
        try:
            trace = self.state.trace(self.meta())
            trace.write(self.run_dir.path)
            episodes = pd.DataFrame(self.state.episodes, columns=list(EPISODE_COLUMNS))
            self.run_dir.write_table("episodes.parquet", episodes)
            summary = {"name": self.config.name, "seed": self.config.seed, **summarize(trace)}
            self.run_dir.write_json("summary.json", summary)
        except OSError as exc:
            log.error("could not write the trace tables: %s (the journal has everything)", exc)
        self._last_flush = time.perf_counter()
        self.stats["flush_s"] += self._last_flush - now

    def _show(self) -> None:
        if self.progress is not None:
            self.progress.update(self.state, self.clock())


def replay_log(run: RunDir) -> list[UpdateRecord]:
    """The committed update log of a run, from its journal."""
    events, _ = read_events(run.journal_path)
    return [UpdateRecord.from_dict(e["record"]) for e in events if e["e"] == "commit"]
