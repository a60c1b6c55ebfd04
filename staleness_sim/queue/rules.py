"""The queue rules (``block``, ``drop_oldest``, ``max_staleness``): the trainer takes the B
oldest queued samples; see ``staleness_sim.queue.engine`` for the conventions."""

from __future__ import annotations

import bisect
import heapq
import math
from array import array
from collections import deque

import numpy as np
import pandas as pd

from staleness_sim.core.trace import (
    JOB_COLUMNS,
    UPDATE_COLUMNS,
    WORKER_COLUMNS,
    Trace,
)
from staleness_sim.durations import make_duration, make_job
from staleness_sim.queue.config import QueueScenario
from staleness_sim.queue.parts import (
    BUSY,
    DROPPED_FULL,
    DROPPED_STALE,
    EXTRA_JOB_COLUMNS,
    GENERATING,
    HELD,
    IDLE,
    INF,
    QUEUED,
    SLOT_STATES,
    SYNCING,
    TAKEN,
    VERDICT_CODES,
    StepDurations,
    trace_meta,
)


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


class _Grow:
    """A buffer that grows by doubling (appending chunks without re-copying them all)."""

    def __init__(self, dtype=np.float64) -> None:
        self._buf = np.empty(1 << 16, dtype=dtype)
        self.n = 0

    def append(self, x: np.ndarray) -> None:
        if self.n + len(x) > len(self._buf):
            grown = np.empty(max(2 * len(self._buf), self.n + len(x)), dtype=self._buf.dtype)
            grown[: self.n] = self._buf[: self.n]
            self._buf = grown
        self._buf[self.n : self.n + len(x)] = x
        self.n += len(x)

    def view(self) -> np.ndarray:
        return self._buf[: self.n]


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


class QueueRun:
    def __init__(self, sc: QueueScenario, vectorised: bool = True) -> None:
        self.sc = sc
        self.vectorised = vectorised  # False: always the event loop (tests compare the two)
        self.job = make_job(sc.rollout.job_spec())
        self.step_model = make_duration(sc.trainer.step)
        self.durations = SlotDurations(self.job, sc.seed, sc.rollout.concurrency)
        self.steps = StepDurations(self.step_model, sc.seed)

    def run(self) -> Trace:
        sc = self.sc
        self.C, self.S, self.B = sc.rollout.concurrency, sc.rollout.group_size, sc.trainer.batch
        q = sc.queue
        self.K = q.max_staleness
        self.cap = sc.capacity_samples
        self.drop_oldest = q.rule == "drop_oldest"
        self.stale_rule = q.rule == "max_staleness"
        self.limited = self.cap is not None and not self.drop_oldest  # producers wait when full
        self.admission = q.admission
        self.in_flight = sc.in_flight_updates
        self.sync = sc.rollout.sync_seconds
        # per group, by id
        self.g_left: list[int] = []
        self.g_state: list[int] = []
        self.g_end: list[float] = []
        self.g_take: list[float] = []
        self.g_v: list[int] = []  # version at take or at drop
        self.g_minv: list[int] = []  # oldest version among its samples (in-flight updates)
        # trainer
        self.v = 0
        self.busy = False
        self.step_end = INF
        self.u_commit: list[float] = []
        self.u_time: list[float] = []
        # queue: FIFO of group ids (entries of groups no longer queued are skipped)
        self.qd: deque[int] = deque()
        self.queued = 0
        self.hd: deque[int] = deque()  # finished groups waiting for room (blocking rules)
        self.held = 0
        self.purge_heap: list[tuple[int, int]] = []
        # admission: unconsumed samples and their versions
        self.uncons = 0
        self.room: int | None = None  # cached admission room
        self.cnt = [0]  # unconsumed samples per version (with in-flight updates: landed ones)
        self.oldest = 0
        self.finished = False
        self.end = 0.0
        # Nothing makes a producer wait and no weights are synced: the rollout side does not
        # depend on the trainer and is computed vectorised (the event loop gives the same).
        self.free = not self.limited and not self.admission and self.sync == 0
        if self.free and self.vectorised:
            return self._trace(*self._free_run())
        self._loop()
        return self._trace(*self._loop_arrays())

    # -- the event loop ----------------------------------------------------------------
    def _loop(self) -> None:
        C, S = self.C, self.S
        # per sample, by id
        self.s_slot, self.s_v0, self.s_v1 = array("q"), array("q"), array("q")
        self.s_tdisp, self.s_t0, self.s_dur = array("d"), array("d"), array("d")
        self.heap: list[tuple[float, int, int]] = []  # (end, slot, sample): one per busy slot
        self.start_heap: list[tuple[float, int, int]] = []  # (start, slot, sample) after syncing
        self.synced = [0] * C
        self.slot_n = [0] * C  # samples each slot has started
        self.idle: deque[int] = deque(range(C))
        self.next_id = 0
        self._pump(0.0)
        heap, start_heap, idle = self.heap, self.start_heap, self.idle
        per_slot, slot_n = self.durations.per_slot, self.slot_n
        s_slot, s_v0, s_v1 = self.s_slot, self.s_v0, self.s_v1
        s_tdisp, s_t0, s_dur = self.s_tdisp, self.s_t0, self.s_dur
        g_left, g_minv, cnt = self.g_left, self.g_minv, self.cnt
        free, in_flight, admission = self.free, self.in_flight, self.admission
        inline = self.sync == 0  # a landing slot may restart in place
        heappop, heapreplace, heappush = heapq.heappop, heapq.heapreplace, heapq.heappush
        while not self.finished:
            t_land = heap[0][0] if heap else INF
            t_start = start_heap[0][0] if start_heap else INF
            if self.step_end <= t_land and self.step_end <= t_start:
                if self.step_end == INF:
                    raise RuntimeError("queue pipeline stalled: nothing in flight, no step running")
                now = self.step_end
                self._step_done(now)
                self._settle(now)
                if not self.finished:
                    self._pump(now)
                continue
            if t_start < t_land:
                now, slot, i = heappop(start_heap)
                s_t0[i] = now
                heappush(heap, (now + s_dur[i], slot, i))
                continue
            now, slot, i = heap[0]
            v = self.v
            s_v1[i] = v
            g = i // S
            if in_flight:
                if g_minv[g] < 0:
                    g_minv[g] = v  # samples land in time order: the first is the oldest
                if admission:
                    cnt[v] += 1
            left = g_left[g] - 1
            g_left[g] = left
            if left == 0:
                self._group_done(g, now)
                if self.finished:
                    heappop(heap)
                    break
            if inline and (free or (not idle and self._can_start())):
                # the slot starts its next sample at once: the hot path, no state change
                j = self.next_id
                self.next_id = j + 1
                if j % S == 0:
                    self._new_group()
                v = self.v
                if admission:
                    self.uncons += 1
                    self.room -= 1
                    if not in_flight:
                        cnt[v] += 1
                n = slot_n[slot]
                slot_n[slot] = n + 1
                values = per_slot[slot]
                if n >= len(values):
                    values = self.durations.extend(slot)
                d = values[n]
                s_slot.append(slot)
                s_v0.append(v)
                s_v1.append(-1)
                s_tdisp.append(now)
                s_t0.append(now)
                s_dur.append(d)
                heapreplace(heap, (now + d, slot, j))
                continue
            heappop(heap)
            idle.append(slot)
            if not (self.limited and self.queued + self.held >= self.cap):
                self._pump(now)

    def _allowance(self, wanted: int) -> int:
        """How many samples may start now (starting one does not change the queue, and uses
        one unit of the admission bound): producers wait while the queue is full, and no
        sample starts that could exceed max_staleness."""
        if self.limited and self.queued + self.held >= self.cap:
            return 0
        if self.admission:
            return max(0, min(wanted, self._room_now()))
        return wanted

    def _room_now(self) -> int:
        """Samples that may still start under admission control; it changes only when samples
        are taken or dropped and when a step ends (cached in between, less each start)."""
        if self.room is None:
            v, cnt = self.v, self.cnt
            oldest = self.oldest
            while oldest < v and cnt[oldest] == 0:
                oldest += 1
            self.oldest = oldest
            # every later sample is taken at a version >= next_take; the oldest unconsumed one
            # must be taken by version oldest + K, so at most this many may be unconsumed
            next_take = v + 1 if self.busy else v
            self.room = (oldest + self.K - next_take + 1) * self.B - self.uncons
        return self.room

    def _can_start(self) -> bool:
        return self._allowance(1) == 1

    def _new_group(self) -> None:
        self.g_left.append(self.S)
        self.g_state.append(GENERATING)
        self.g_end.append(math.nan)
        self.g_take.append(math.nan)
        self.g_v.append(-1)
        self.g_minv.append(-1)

    def _pump(self, now: float) -> None:
        """Serve waiting slots first come, first served, as many as may start."""
        idle = self.idle
        k = self._allowance(len(idle)) if idle else 0
        if not k:
            return
        v, S, sync = self.v, self.S, self.sync
        if self.admission:
            self.uncons += k
            self.room -= k
            if not self.in_flight:
                self.cnt[v] += k
        per_slot, slot_n, synced = self.durations.per_slot, self.slot_n, self.synced
        s_slot, s_v0, s_v1 = self.s_slot, self.s_v0, self.s_v1
        s_tdisp, s_t0, s_dur = self.s_tdisp, self.s_t0, self.s_dur
        heap = self.heap
        for _ in range(k):
            slot = idle.popleft()
            i = self.next_id
            self.next_id = i + 1
            if i % S == 0:
                self._new_group()
            n = slot_n[slot]
            slot_n[slot] = n + 1
            values = per_slot[slot]
            if n >= len(values):
                values = self.durations.extend(slot)
            d = values[n]
            s_slot.append(slot)
            s_v0.append(v)
            s_v1.append(-1)
            s_tdisp.append(now)
            s_dur.append(d)
            missed = v - synced[slot]
            synced[slot] = v
            if sync and missed > 0:  # replay the missed versions first
                ready = now + sync * missed
                s_t0.append(math.nan)
                heapq.heappush(self.start_heap, (now + (ready - now), slot, i))
                continue
            s_t0.append(now)
            heapq.heappush(heap, (now + d, slot, i))

    def _loop_arrays(self):
        n = self.next_id

        def np_of(buf, dtype):
            return np.frombuffer(buf, dtype=dtype)[:n].copy() if n else np.empty(0, dtype)

        return (
            n,
            np_of(self.s_slot, np.int64),
            np_of(self.s_v0, np.int64),
            np_of(self.s_v1, np.int64),
            np_of(self.s_tdisp, np.float64),
            np_of(self.s_t0, np.float64),
            np_of(self.s_dur, np.float64),
        )

    # -- the vectorised rollout (nothing makes a producer wait) ---------------------------
    def _free_run(self):
        """Every slot restarts the moment it frees up, so slot s's samples start at the
        running sum of its durations. Samples are numbered in start order (ties: by slot),
        and finished groups reach the trainer in the event loop's order (time, then the slot
        of the sample that completed the group), interleaved with step ends (a step that
        ends at the same time comes first), one block of durations at a time: every sample
        starting before the earliest slot's next free time is known."""
        C, S = self.C, self.S
        free_at = np.zeros(C)  # when each slot next frees up
        carry = (
            np.empty(0),
            np.empty(0),
            np.empty(0, np.int64),
        )  # (start, end, slot) not yet numbered
        starts, ends, slot_of = _Grow(), _Grow(), _Grow(np.int64)
        self.g_first: list[float] = []
        self.g_minend: list[float] = []
        pending: list[tuple[float, int, int]] = []  # (completion, completing slot, group)
        block, groups = 0, 0
        heappush, heappop = heapq.heappush, heapq.heappop
        while not self.finished:
            d = self.durations.block(block)
            block += 1
            e = d.copy()
            e[0] += free_at
            np.cumsum(e, axis=0, out=e)  # sequential sums: the event loop's now + d, exactly
            st = np.vstack([free_at, e[:-1]])
            free_at = e[-1].copy()
            horizon = float(free_at.min())  # no sample not yet drawn starts before this
            cand_st = np.concatenate([carry[0], st.ravel()])
            cand_en = np.concatenate([carry[1], e.ravel()])
            cand_sl = np.concatenate([carry[2], np.tile(np.arange(C), len(d))])
            final = cand_st < horizon
            order = np.lexsort((cand_sl[final], cand_st[final]))
            starts.append(cand_st[final][order])
            ends.append(cand_en[final][order])
            slot_of.append(cand_sl[final][order])
            carry = (cand_st[~final], cand_en[~final], cand_sl[~final])
            g_hi = starts.n // S  # groups whose S samples are all numbered
            if g_hi > groups:
                en = ends.view()[groups * S : g_hi * S].reshape(-1, S)
                sl = slot_of.view()[groups * S : g_hi * S].reshape(-1, S)
                done = en.max(axis=1)
                # the completing sample: the last to land, i.e. the largest (end, slot)
                key = np.where(en == done[:, None], sl, -1).max(axis=1)
                self.g_first.extend(starts.view()[groups * S : g_hi * S : S].tolist())
                self.g_minend.extend(en.min(axis=1).tolist())
                m = g_hi - groups
                self.g_state.extend([GENERATING] * m)
                self.g_end.extend([math.nan] * m)
                self.g_take.extend([math.nan] * m)
                self.g_v.extend([-1] * m)
                for item in zip(done.tolist(), key.tolist(), range(groups, g_hi), strict=True):
                    heappush(pending, item)
                groups = g_hi
            while not self.finished:
                t_arrive = pending[0][0] if pending else INF
                t_step = self.step_end
                if t_step <= t_arrive and t_step <= horizon:
                    self._step_done(t_step)
                    self._settle(t_step)
                elif t_arrive < horizon:
                    tc, _, g = heappop(pending)
                    self._group_done(g, tc)
                else:
                    break
        end = self.end
        st_all = starts.view()
        n = int(np.searchsorted(st_all, end, side="left"))  # samples started before the end
        st, en = st_all[:n], ends.view()[:n]
        u_time = np.asarray(self.u_time)
        v0 = np.searchsorted(u_time, st, side="right")
        v1 = np.where(en < end, np.searchsorted(u_time, en, side="right"), -1)
        return n, slot_of.view()[:n].copy(), v0, v1, st.copy(), st.copy(), en - st

    # -- groups and the queue --------------------------------------------------------------
    def _version_of(self, g: int) -> int:
        """The oldest version among a finished group's samples."""
        if self.free and self.vectorised:  # the version at a time: steps ended by then
            t = self.g_minend[g] if self.in_flight else self.g_first[g]
            return bisect.bisect_right(self.u_time, t)
        return self.g_minv[g] if self.in_flight else self.s_v0[g * self.S]

    def _group_done(self, g: int, now: float) -> None:
        self.g_end[g] = now
        if self.stale_rule and self.v - self._version_of(g) > self.K:
            self._drop(g, DROPPED_STALE)
            return
        S, cap = self.S, self.cap
        if cap is None or self.queued + S <= cap:
            self._enqueue(g)
        elif self.drop_oldest:
            self._enqueue(g)
            while self.queued > cap:
                self._drop(self._front(), DROPPED_FULL)
        else:
            self.g_state[g] = HELD
            self.hd.append(g)
            self.held += S
            if self.stale_rule:
                heapq.heappush(self.purge_heap, (self._version_of(g), g))
        if not self.busy:
            self._settle(now)

    def _enqueue(self, g: int) -> None:
        self.g_state[g] = QUEUED
        self.qd.append(g)
        self.queued += self.S
        if self.stale_rule:
            heapq.heappush(self.purge_heap, (self._version_of(g), g))

    def _front(self) -> int:
        qd, state = self.qd, self.g_state
        while state[qd[0]] != QUEUED:
            qd.popleft()
        return qd.popleft()

    def _drop(self, g: int, why: int) -> None:
        state = self.g_state[g]
        if state == QUEUED:
            self.queued -= self.S
        elif state == HELD:
            self.held -= self.S
        self.g_state[g] = why
        self.g_v[g] = self.v
        self._consumed(g)

    def _consumed(self, g: int) -> None:
        """Group g leaves the unconsumed samples (taken or dropped)."""
        if not self.admission:
            return
        self.room = None
        self.uncons -= self.S
        versions = self.s_v1 if self.in_flight else self.s_v0
        cnt = self.cnt
        for i in range(g * self.S, (g + 1) * self.S):
            cnt[versions[i]] -= 1

    def _settle(self, now: float) -> None:
        """Take batches while the trainer is free and the queue holds one; let held groups in."""
        while not self.finished:
            while not self.busy and self.queued >= self.B and not self.finished:
                self._take(now)
            if not self._admit_held() or self.busy:
                return

    def _admit_held(self) -> bool:
        moved = False
        hd, state = self.hd, self.g_state
        while hd and (state[hd[0]] != HELD or self.queued + self.S <= self.cap):
            g = hd.popleft()
            if state[g] != HELD:
                continue
            self.held -= self.S
            state[g] = QUEUED
            self.qd.append(g)
            self.queued += self.S
            moved = True
        return moved

    def _take(self, now: float) -> None:
        taken, v = 0, self.v
        while taken < self.B:
            g = self._front()
            self.g_state[g] = TAKEN
            self.g_take[g] = now
            self.g_v[g] = v
            self._consumed(g)
            taken += self.S
        self.queued -= self.B
        self.u_commit.append(now)
        d = self.steps.next()
        if d > 0:
            self.busy = True
            self.step_end = now + d
        else:  # a step of no time (a float underflow: atoms at 0 are refused) ends at once
            self._step_done(now)

    def _step_done(self, now: float) -> None:
        self.room = None
        self.v += 1
        self.cnt.append(0)
        self.u_time.append(now)
        self.busy = False
        self.step_end = INF
        if self.v >= self.sc.updates:
            self.finished = True
            self.end = now
            return
        if self.stale_rule:
            limit = self.v - self.K
            heap, state = self.purge_heap, self.g_state
            while heap and heap[0][0] < limit:
                _, g = heapq.heappop(heap)
                if state[g] in (QUEUED, HELD):
                    self._drop(g, DROPPED_STALE)

    # -- the trace -------------------------------------------------------------------------
    def _trace(self, n, slot, v0, v1, tdisp, t0, dur) -> Trace:
        end, S = self.end, self.S
        ids = np.arange(n, dtype=np.int64)
        landed = v1 >= 0
        started = ~np.isnan(t0)
        end_time = np.where(landed, t0 + dur, np.where(started, end, np.nan))
        g = ids // S
        g_state = np.asarray(self.g_state, dtype=np.int8)[g]
        g_v = np.asarray(self.g_v, dtype=np.int64)[g]
        used = v1 if self.in_flight else v0
        accepted = g_state == TAKEN
        dropped = (g_state == DROPPED_FULL) | (g_state == DROPPED_STALE)
        keep = accepted | dropped
        lag = np.where(keep, g_v - used, 0)
        reason = np.zeros(n, dtype=np.int8)
        for code, mask in (
            (1, accepted),
            (2, g_state == DROPPED_FULL),
            (3, g_state == DROPPED_STALE),
            (4, landed & ((g_state == QUEUED) | (g_state == HELD))),
            (5, landed & (g_state == GENERATING)),
            (6, ~started),
        ):
            reason[mask] = code
        verdict = np.where(accepted, 1, np.where(dropped, 2, 0)).astype(np.int8)
        jobs = pd.DataFrame(
            {
                "job_id": ids,
                "worker": slot,
                "seed": ids,
                "dispatch_version": v0,
                "dispatch_time": tdisp,
                "start_time": t0,
                "end_time": end_time,
                "completion_version": pd.arrays.IntegerArray(np.where(landed, v1, 0), ~landed),
                "verdict": pd.Categorical.from_codes(verdict, categories=list(VERDICT_CODES)),
                "lag": pd.arrays.IntegerArray(lag.astype(np.int64), ~keep),
                "reward": np.full(n, np.nan),
                "reason": pd.Categorical.from_codes(reason, categories=self._reasons()),
                "group": g,
                "group_end_time": np.asarray(self.g_end, dtype=np.float64)[g],
                "take_time": np.asarray(self.g_take, dtype=np.float64)[g],
                "generated": landed,
            },
            columns=list(JOB_COLUMNS + EXTRA_JOB_COLUMNS),
        )
        updates = self._updates(g_v[accepted], (g_v - used)[accepted])
        meta = trace_meta(self.sc, self.job, self.step_model, end, samples_started=n)
        workers = slot_intervals(self.C, end, slot, tdisp, t0, end_time)
        return Trace(jobs, updates, workers, meta)

    def _reasons(self) -> list[str]:
        return [
            "run ended",
            "taken by the trainer",
            "dropped: queue full (drop_oldest)",
            f"dropped: older than max_staleness {self.K}"
            if self.K is not None
            else "dropped: too old",
            "in the queue when the run ended",
            "group incomplete when the run ended",
            "never finished",
        ]

    def _updates(self, take_v: np.ndarray, lags: np.ndarray) -> pd.DataFrame:
        steps = len(self.u_time)
        size = np.bincount(take_v, minlength=steps)[:steps]
        total = np.bincount(take_v, weights=lags, minlength=steps)[:steps]
        biggest = np.full(steps, -1, dtype=np.int64)
        order = np.lexsort((lags, take_v))  # the last of each step's run holds its largest lag
        if len(order):
            last = np.r_[take_v[order][1:] != take_v[order][:-1], True]
            biggest[take_v[order][last]] = lags[order][last]
        return pd.DataFrame(
            {
                "version": np.arange(1, steps + 1, dtype=np.int64),
                "time": np.asarray(self.u_time, dtype=np.float64),
                "commit_time": np.asarray(self.u_commit[:steps], dtype=np.float64),
                "cohort_size": size.astype(np.int64),
                "mean_lag": total / np.maximum(size, 1),
                "max_lag": biggest,
            },
            columns=list(UPDATE_COLUMNS),
        )
