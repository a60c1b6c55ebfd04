"""The rollout slots of the queue rules: their durations, drawn per slot so that every
rule and both paths give a slot's n-th sample the same duration, and the busy / idle /
syncing intervals their samples make (the trace's workers table)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from staleness_sim.core.trace import WORKER_COLUMNS
from staleness_sim.queue.parts import BUSY, IDLE, SLOT_STATES, SYNCING


class Samples(NamedTuple):
    """A rollout's samples by id (in start order): slot, version at dispatch, version at
    landing (-1: did not land), dispatch time, start time (NaN: never started), duration."""

    n: int
    slot: np.ndarray
    v0: np.ndarray
    v1: np.ndarray
    tdisp: np.ndarray
    t0: np.ndarray
    dur: np.ndarray


class SlotDurations:
    """Sample n of slot s takes ``block(b)[r, s]`` with ``b, r = divmod(n, rows)``: blocks of
    ``rows`` x C durations drawn in order from one generator. So a slot's n-th sample has the
    same duration under every queue rule, capacity and trainer for a given seed (paired
    comparisons), and a free-running rollout is a cumulative sum per slot."""

    def __init__(self, job, seed: int, slots: int) -> None:
        self.job, self.slots = job, slots
        self.rows = max(16, (1 << 16) // slots)
        self._rng = np.random.default_rng(seed)
        self._blocks: list[np.ndarray] = []
        self.per_slot: list[list[float]] = [[] for _ in range(slots)]  # for the event loop

    def block(self, b: int) -> np.ndarray:
        while len(self._blocks) <= b:
            n = self.rows * self.slots
            self._blocks.append(self.job.sample(self._rng, n).reshape(self.rows, self.slots))
        return self._blocks[b]

    def extend(self, slot: int) -> list[float]:
        values = self.per_slot[slot]
        values.extend(self.block(len(values) // self.rows)[:, slot].tolist())
        return values


def slot_intervals(
    slots: int, end: float, slot: np.ndarray, tdisp: np.ndarray, t0: np.ndarray, t1: np.ndarray
) -> pd.DataFrame:
    """The workers table from the samples alone: a slot is idle until it is given a sample,
    syncing from then until the sample starts, busy until it ends (or the run ends), idle
    until its next sample; adjacent intervals in one state are merged."""
    n = len(slot)
    order = np.lexsort((np.arange(n), slot))  # per slot, in the order samples were given
    sl, given, start = slot[order], tdisp[order], t0[order]
    ready = np.where(np.isnan(start), end, start)  # never started: syncing until the end
    done = np.where(np.isnan(start), end, t1[order])
    first = np.r_[True, sl[1:] != sl[:-1]] if n else np.empty(0, dtype=bool)
    last = np.r_[sl[1:] != sl[:-1], True] if n else np.empty(0, dtype=bool)
    free_since = np.where(first, 0.0, np.r_[0.0, done[:-1]])
    unused = np.setdiff1d(np.arange(slots), sl)  # slots never given a sample
    k = 3 * np.arange(n, dtype=np.float64)  # per sample: idle, syncing, busy, in this order
    parts = [  # (slot, state, start, end, rank within the slot)
        (sl, IDLE, free_since, given, k),
        (sl, SYNCING, given, ready, k + 1),
        (sl, BUSY, ready, done, k + 2),
        (sl[last], IDLE, done[last], np.full(int(last.sum()), end), k[last] + 2.5),
        (unused, IDLE, np.zeros(len(unused)), np.full(len(unused), end), np.zeros(len(unused))),
    ]
    w = np.concatenate([p[0] for p in parts])
    code = np.concatenate([np.full(len(p[0]), p[1], dtype=np.int8) for p in parts])
    a = np.concatenate([p[2] for p in parts])
    b = np.concatenate([p[3] for p in parts])
    rank = np.concatenate([p[4] for p in parts])
    keep = b > a  # no zero-length intervals
    w, code, a, b, rank = w[keep], code[keep], a[keep], b[keep], rank[keep]
    o = np.lexsort((rank, w))
    w, code, a, b = w[o], code[o], a[o], b[o]
    new = np.r_[True, (w[1:] != w[:-1]) | (code[1:] != code[:-1])]
    heads = np.flatnonzero(new)
    tails = np.r_[heads[1:], len(w)] - 1
    return pd.DataFrame(
        {
            "worker": w[heads].astype(np.int64),
            "state": np.array(SLOT_STATES, dtype=object)[code[heads]],
            "start": a[heads],
            "end": b[tails],
        },
        columns=list(WORKER_COLUMNS),
    )
