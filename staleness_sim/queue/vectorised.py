"""The queue rules' vectorised path: when nothing makes a producer wait and no weights are
synced, every slot restarts the moment it frees up, so the rollout does not depend on the
trainer and is computed a block of durations at a time with numpy; the trainer's side (the
rule's decisions) runs on the groups as they finish. It gives exactly the event loop's
samples and decisions (tested against it)."""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from staleness_sim.queue.groups import GroupQueue
from staleness_sim.queue.parts import INF
from staleness_sim.queue.slots import Samples


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


class FreeRollout(GroupQueue):
    def __init__(self, *args) -> None:  # GroupQueue's
        super().__init__(*args)
        self.g_first: list[float] = []  # per group: its first sample's start
        self.g_minend: list[float] = []  # per group: its earliest landing

    def version_of(self, g: int) -> int:
        """The version at a time: the steps ended by then."""
        t = self.g_minend[g] if self.in_flight else self.g_first[g]
        return bisect.bisect_right(self.u_time, t)

    def run(self) -> Samples:
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
                self.new_groups(g_hi - groups)
                for item in zip(done.tolist(), key.tolist(), range(groups, g_hi), strict=True):
                    heappush(pending, item)
                groups = g_hi
            while not self.finished:
                t_arrive = pending[0][0] if pending else INF
                t_step = self.step_end
                if t_step <= t_arrive and t_step <= horizon:
                    self.step_done(t_step)
                    self.settle(t_step)
                elif t_arrive < horizon:
                    tc, _, g = heappop(pending)
                    self.group_done(g, tc)
                else:
                    break
        end = self.end
        st_all = starts.view()
        n = int(np.searchsorted(st_all, end, side="left"))  # samples started before the end
        st, en = st_all[:n], ends.view()[:n]
        u_time = np.asarray(self.u_time)
        v0 = np.searchsorted(u_time, st, side="right")
        v1 = np.where(en < end, np.searchsorted(u_time, en, side="right"), -1)
        return Samples(n, slot_of.view()[:n].copy(), v0, v1, st.copy(), st.copy(), en - st)
