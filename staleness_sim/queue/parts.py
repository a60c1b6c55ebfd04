"""Pieces both batch-forming rules of the queue pipeline share: duration streams in sample
order, step times, slot state intervals, the trace's extra columns and its meta."""

from __future__ import annotations

import math
from array import array
from typing import Any

import numpy as np
import pandas as pd

from staleness_sim.core.settings import scenario_dict
from staleness_sim.core.trace import (
    WORKER_COLUMNS,
)
from staleness_sim.durations import stream_blocks
from staleness_sim.queue.config import QueueScenario

EXTRA_JOB_COLUMNS = ("group", "group_end_time", "take_time", "generated")
VERDICT_CODES = ("cancelled", "accepted", "discarded")  # jobs.verdict of the queue rules

# group states
GENERATING, QUEUED, HELD, TAKEN, DROPPED_FULL, DROPPED_STALE = range(6)
# slot states, in the trace's words
SLOT_STATES = ("busy", "idle", "syncing")
BUSY, IDLE, SYNCING = range(3)
INF = math.inf


class SampleDurations:
    """Durations by sample id, drawn exactly as ``engine.DurationStream`` draws job durations
    (one generator, blocks of :func:`~staleness_sim.durations.stream_blocks`), so sample k
    of a queue run gets job k's duration of the cohort engine for the same job model and
    seed."""

    def __init__(self, job, seed: int) -> None:
        self.job = job
        self._rng = np.random.default_rng(seed)
        self._block, self._max_block = stream_blocks(job)
        self._buf = np.empty(0)
        self.n = 0
        self.values: list[float] = []  # the same numbers as Python floats (the event loop)

    def ensure(self, n: int) -> None:
        while self.n < n:
            block = self.job.sample(self._rng, self._block)
            self._block = min(2 * self._block, self._max_block)
            if self.n + len(block) > len(self._buf):
                grown = np.empty(max(2 * len(self._buf), self.n + len(block)))
                grown[: self.n] = self._buf[: self.n]
                self._buf = grown
            self._buf[self.n : self.n + len(block)] = block
            self.n += len(block)

    def extend(self) -> None:
        """One more block of ``values`` (for the event loop)."""
        have = len(self.values)
        self.ensure(have + 1)
        self.values.extend(self._buf[have : self.n].tolist())

    def array(self, n: int) -> np.ndarray:
        self.ensure(n)
        return self._buf[:n]


class StepDurations:
    """Trainer step times in step order, from their own generator (seed, 1)."""

    def __init__(self, model, seed: int, block: int = 1024) -> None:
        self.model = model
        self._rng = np.random.default_rng([seed, 1])
        self._block = block
        self._values: list[float] = []
        self._next = 0

    def next(self) -> float:
        if self._next >= len(self._values):
            self._values = self.model.sample(self._rng, self._block).tolist()
            self._next = 0
        self._next += 1
        return self._values[self._next - 1]


class SlotStates:
    """Contiguous busy / idle / syncing intervals of every slot, from time 0 to the end."""

    def __init__(self, n: int, merge: bool = True) -> None:
        self.state = [IDLE] * n
        self.since = [0.0] * n
        self.merge = merge  # False: close an interval at every call, as the cohort engine does
        self.worker, self.code = array("q"), array("b")
        self.start, self.end = array("d"), array("d")

    def set(self, slot: int, state: int, now: float) -> None:
        if self.merge and state == self.state[slot]:
            return
        since = self.since[slot]
        if now > since:
            self.worker.append(slot)
            self.code.append(self.state[slot])
            self.start.append(since)
            self.end.append(now)
        self.state[slot] = state
        self.since[slot] = now

    def close(self, end: float) -> None:
        merge, self.merge = self.merge, False
        for slot in range(len(self.state)):
            self.set(slot, self.state[slot], end)
        self.merge = merge

    def frame(self) -> pd.DataFrame:
        codes = np.frombuffer(self.code, dtype=np.int8) if len(self.code) else np.empty(0, np.int8)
        return pd.DataFrame(
            {
                "worker": np.asarray(self.worker, dtype=np.int64),
                "state": np.array(SLOT_STATES, dtype=object)[codes],
                "start": np.asarray(self.start, dtype=np.float64),
                "end": np.asarray(self.end, dtype=np.float64),
            },
            columns=list(WORKER_COLUMNS),
        )


def trace_meta(sc: QueueScenario, job, step_model, end: float, **extra: Any) -> dict[str, Any]:
    return {
        "source": "simulation",
        "pipeline": "queue",
        "workers": sc.rollout.concurrency,
        "group_size": sc.rollout.group_size,
        "batch": sc.trainer.batch,
        "capacity_samples": sc.capacity_samples,
        "rule": sc.queue.rule,
        "wall_clock_s": end,
        "scenario": scenario_dict(sc),
        "job_model": job.describe(),
        "step_model": step_model.describe(),
        **extra,
    }
