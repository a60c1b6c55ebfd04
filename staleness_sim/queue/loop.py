"""The queue rules' event loop: slots start samples when the rule and admission control
let them (served first come, first served), samples land in time order, a slot replays
missed versions (``sync_seconds``) before its next sample; the trainer's side is the
shared ``GroupQueue``. Conventions: ``staleness_sim.queue.engine``."""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque

import numpy as np

from staleness_sim.queue.groups import GroupQueue
from staleness_sim.queue.parts import GENERATING, INF
from staleness_sim.queue.slots import Samples


class EventLoop(GroupQueue):
    def __init__(self, *args) -> None:  # GroupQueue's
        super().__init__(*args)
        self.sync = self.sc.rollout.sync_seconds
        self.g_left: list[int] = []  # per group: samples still to land
        self.g_minv: list[int] = []  # per group: the oldest version among its samples

    def version_of(self, g: int) -> int:
        return self.g_minv[g] if self.in_flight else self.s_v0[g * self.S]

    def _new_group(self) -> None:
        self.g_state.append(GENERATING)
        self.g_end.append(math.nan)
        self.g_take.append(math.nan)
        self.g_v.append(-1)
        self.g_left.append(self.S)
        self.g_minv.append(-1)

    def run(self) -> Samples:
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
        # admission counts a sample at the version it generated under
        self.versions_used = self.s_v1 if self.in_flight else self.s_v0
        self._pump(0.0)
        heap, start_heap, idle = self.heap, self.start_heap, self.idle
        s_v1, s_t0, s_dur = self.s_v1, self.s_t0, self.s_dur
        g_left, g_minv = self.g_left, self.g_minv
        free, in_flight, admission = self.free, self.in_flight, self.admission
        producers_wait, allowance = self.rule.producers_wait, self.allowance
        inline = self.sync == 0  # a landing slot may restart in place
        heappop, heapreplace, heappush = heapq.heappop, heapq.heapreplace, heapq.heappush
        while not self.finished:
            t_land = heap[0][0] if heap else INF
            t_start = start_heap[0][0] if start_heap else INF
            if self.step_end <= t_land and self.step_end <= t_start:
                if self.step_end == INF:
                    raise RuntimeError("queue pipeline stalled: nothing in flight, no step running")
                now = self.step_end
                self.step_done(now)
                self.settle(now)
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
                if admission is not None:
                    admission.landed(v)
            left = g_left[g] - 1
            g_left[g] = left
            if left == 0:
                self.group_done(g, now)
                if self.finished:
                    heappop(heap)
                    break
            if inline and (free or (not idle and allowance(1) == 1)):
                # the slot starts its next sample at once: the hot path, no state change
                if admission is not None:
                    admission.started(1, self.v)
                j, d = self._draw(slot, now)
                s_t0.append(now)
                heapreplace(heap, (now + d, slot, j))
                continue
            heappop(heap)
            idle.append(slot)
            if not producers_wait(self.queued + self.held):
                self._pump(now)
        return self._samples()

    def _draw(self, slot: int, now: float) -> tuple[int, float]:
        """A new sample on ``slot`` dispatched at ``now``: its id (a new group every S) and
        duration, its row written but for its start."""
        i = self.next_id
        self.next_id = i + 1
        if i % self.S == 0:
            self._new_group()
        n = self.slot_n[slot]
        self.slot_n[slot] = n + 1
        values = self.durations.per_slot[slot]
        if n >= len(values):
            values = self.durations.extend(slot)
        d = values[n]
        self.s_slot.append(slot)
        self.s_v0.append(self.v)
        self.s_v1.append(-1)
        self.s_tdisp.append(now)
        self.s_dur.append(d)
        return i, d

    def _pump(self, now: float) -> None:
        """Serve waiting slots first come, first served, as many as may start."""
        idle = self.idle
        k = self.allowance(len(idle)) if idle else 0
        if not k:
            return
        v, sync = self.v, self.sync
        if self.admission is not None:
            self.admission.started(k, v)
        synced, s_t0 = self.synced, self.s_t0
        heap = self.heap
        for _ in range(k):
            slot = idle.popleft()
            i, d = self._draw(slot, now)
            missed = v - synced[slot]
            synced[slot] = v
            if sync and missed > 0:  # replay the missed versions first
                ready = now + sync * missed
                s_t0.append(math.nan)
                heapq.heappush(self.start_heap, (now + (ready - now), slot, i))
                continue
            s_t0.append(now)
            heapq.heappush(heap, (now + d, slot, i))

    def _samples(self) -> Samples:
        n = self.next_id

        def np_of(buf, dtype):
            return np.frombuffer(buf, dtype=dtype)[:n].copy() if n else np.empty(0, dtype)

        return Samples(
            n,
            np_of(self.s_slot, np.int64),
            np_of(self.s_v0, np.int64),
            np_of(self.s_v1, np.int64),
            np_of(self.s_tdisp, np.float64),
            np_of(self.s_t0, np.float64),
            np_of(self.s_dur, np.float64),
        )
