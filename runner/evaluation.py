"""Held-out evaluation: the unperturbed weights of one version on a task split.

Each evaluation seed runs every task of the split once with its own sampling stream;
success is the share of episodes that passed (``passed``); ``graded`` (the fraction of the
verifier's checks that passed) is recorded beside it. Results go to ``eval.parquet`` (one row per version, split,
seed and task), during training every ``eval_every`` updates (on a separate copy of the
weights, in the background) and on demand with ``es-runner eval``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence

import pandas as pd

from runner.config import RunConfig
from runner.errors import UserError
from runner.es import UpdateRecord
from runner.rollouts import JobSpec
from runner.run_dir import RunDir
from runner.seeds import derive_seed
from runner.task_pool import TaskPool
from runner.workers.local import LocalWorker

log = logging.getLogger(__name__)

EVAL_COLUMNS = (
    "version",
    "split",
    "seed",
    "task",
    "reward",
    "category",
    "passed",
    "turns",
    "error",
    "graded",
)


def eval_worker(config: RunConfig, client, builder) -> LocalWorker:
    """A worker of its own for evaluation, on the model's device, at the base weights."""
    return LocalWorker(-1, config, client, builder, lambda: 0.0, device=config.model.device)


def evaluate(
    worker: LocalWorker,
    pool: TaskPool,
    *,
    version: int,
    split: str,
    seeds: Sequence[int],
    abort: threading.Event | None = None,
) -> pd.DataFrame:
    """Rows of ``eval.parquet`` for ``worker``'s current weights (at ``version``), unperturbed."""
    if worker.backend.version != version:
        raise ValueError(f"the backend holds version {worker.backend.version}, not {version}")
    abort = abort or threading.Event()
    rows = []
    for seed in seeds:
        job = JobSpec(-1, version, 0, 1, derive_seed(seed, "eval"), tuple(pool.tasks))
        outcome = worker.run_job(job, abort, perturb=False)
        if abort.is_set():
            break
        for e in outcome.episodes:
            rows.append(
                {
                    "version": version,
                    "split": split,
                    "seed": seed,
                    "task": e["task_id"],
                    "reward": e["reward"],
                    "category": e["category"],
                    "passed": e["passed"],
                    "turns": e["turns"],
                    "error": e["error"],
                    "graded": e["graded"],
                }
            )
    return pd.DataFrame(rows, columns=list(EVAL_COLUMNS))


def success_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Success (the share of episodes that passed) per version, split and seed."""
    per_seed = rows.groupby(["version", "split", "seed"], as_index=False)["passed"].mean()
    return per_seed.rename(columns={"passed": "success"})


def success_gain(rows: pd.DataFrame, before: int, after: int) -> dict[str, float]:
    """Held-out success of version ``after`` minus version ``before`` on the same tasks and
    seeds, with its standard error: each task's difference averaged over the seeds, then
    the standard error of the mean over tasks (sample std / sqrt(tasks)), so that a task's
    seeds, which are not independent draws of the task set, count once."""
    keys = ["split", "task", "seed"]
    a = rows[rows["version"] == before].set_index(keys)["passed"].astype(float)
    b = rows[rows["version"] == after].set_index(keys)["passed"].astype(float)
    both = a.index.intersection(b.index)
    if len(both) == 0:
        raise ValueError(f"versions {before} and {after} share no (task, seed) evaluation")
    per_task = (b[both] - a[both]).groupby(level=["split", "task"]).mean()
    n = len(per_task)
    se = float(per_task.std(ddof=1) / n**0.5) if n > 1 else float("nan")
    gain = float(per_task.mean())
    return {
        "gain": gain,
        "se": se,
        "z": gain / se if se and se == se else float("nan"),
        "tasks": n,
        "episodes": len(both),
    }


class Evaluator:
    """Evaluates committed versions in the background, on its own copy of the weights."""

    def __init__(
        self, run: RunDir, config: RunConfig, pool: TaskPool, client, builder, tracker=None
    ) -> None:
        self.run, self.config, self.pool = run, config, pool
        self.tracker = tracker  # live metrics (runner.tracking), or None
        self.client, self.builder = client, builder
        self._queue: queue.Queue = queue.Queue()
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker: LocalWorker | None = None
        self._busy = 0
        self.failures: list[str] = []

    def wanted(self, version: int) -> bool:
        every = self.config.eval_every
        if version == 0 and not self.config.eval.initial:
            return False
        return bool(every) and (version % every == 0 or version == self.config.updates)

    def schedule_missing(self, version: int, log_: Sequence[UpdateRecord]) -> None:
        """Queue every wanted version up to ``version`` that has no rows yet (a resume)."""
        done = self.run.read_table("eval.parquet")
        have = (
            set()
            if done is None
            else set(done.loc[done["split"] == self.config.eval.split, "version"])
        )
        for v in range(version + 1):
            if self.wanted(v) and v not in have:
                self._put(v, log_[:v])

    def committed(self, version: int, log_: Sequence[UpdateRecord]) -> None:
        if self.wanted(version):
            self._put(version, list(log_[:version]))

    def _put(self, version: int, log_: Sequence[UpdateRecord]) -> None:
        self._queue.put((version, list(log_)))
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="evaluator", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while not self._abort.is_set():
            item = self._queue.get()
            if item is None:
                break
            version, log_ = item
            self._busy = 1
            try:
                if self._worker is None or self._worker.backend.version > version:
                    if self._worker is not None:  # weights go forward only: start again
                        self._worker.close()
                    self._worker = eval_worker(self.config, self.client, self.builder)
                self._worker.sync(log_)
                rows = evaluate(
                    self._worker, self.pool, version=version, split=self.config.eval.split,
                    seeds=self.config.eval.seeds, abort=self._abort,
                )  # fmt: skip
                if not self._abort.is_set():
                    self.run.merge_eval(rows)
                    if self.tracker is not None:
                        self.tracker.evaluated(rows)
                    log.info("evaluated version %d: success %.3f", version, rows["passed"].mean())
            except Exception as exc:  # noqa: BLE001 - evaluation never stops training
                trace = None if isinstance(exc, UserError) else exc  # a user's error: one line
                log.error("evaluation of version %d failed: %s", version, exc, exc_info=trace)
                self.failures.append(f"version {version}: {exc}")
            finally:
                self._busy = 0
        if self._worker is not None:
            self._worker.close()

    def pending(self) -> int:
        """Versions queued or being evaluated."""
        return self._queue.qsize() + self._busy

    def close(self, wait: bool) -> None:
        """Finish the queued evaluations (``wait``), or abandon them (an interrupted run)."""
        if not wait:
            self._abort.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join()
