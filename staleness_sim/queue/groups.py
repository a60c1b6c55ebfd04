"""The trainer's side of the queue rules, shared by the event loop (``loop.py``) and the
vectorised rollout (``vectorised.py``): finished groups, the queue and the groups held for
room, and the trainer that takes the B oldest queued samples and publishes a version when
its step ends. What happens to a group is its rule's decision (``rules.py``)."""

from __future__ import annotations

import math
from collections import deque

from staleness_sim.queue.config import QueueScenario
from staleness_sim.queue.parts import (
    GENERATING,
    HELD,
    INF,
    QUEUED,
    TAKEN,
    StepDurations,
)
from staleness_sim.queue.rules import Admission, Block, Drop, Evict, Hold
from staleness_sim.queue.slots import SlotDurations


def producers_never_wait(sc: QueueScenario, rule: Block) -> bool:
    """Nothing makes a producer wait and no weights are synced: the rollout side does not
    depend on the trainer (and can be computed vectorised)."""
    return not rule.limits_producers and not sc.queue.admission and sc.rollout.sync_seconds == 0


class GroupQueue:
    """Groups by id (their state, when they finished, were taken, the version at take or
    drop), the FIFO queue and the held groups, the trainer's version and steps. A path
    supplies the samples: it calls ``group_done`` as groups finish and ``step_done`` as
    steps end, and says which version a group generated under (``version_of``)."""

    def __init__(
        self, sc: QueueScenario, rule: Block, durations: SlotDurations, steps: StepDurations
    ) -> None:
        self.sc, self.rule, self.durations, self.steps = sc, rule, durations, steps
        self.C, self.S, self.B = sc.rollout.concurrency, sc.rollout.group_size, sc.trainer.batch
        self.in_flight = sc.in_flight_updates
        q = sc.queue
        self.admission = Admission(q.max_staleness, self.B, self.in_flight) if q.admission else None
        self.free = producers_never_wait(sc, rule)
        # per group, by id
        self.g_state: list[int] = []
        self.g_end: list[float] = []
        self.g_take: list[float] = []
        self.g_v: list[int] = []  # version at take or at drop
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
        # per sample: the version admission counts it at (the event loop sets it)
        self.versions_used = None
        self.finished = False
        self.end = 0.0

    def version_of(self, g: int) -> int:
        """The oldest version among a finished group's samples."""
        raise NotImplementedError

    def new_groups(self, m: int) -> None:
        self.g_state.extend([GENERATING] * m)
        self.g_end.extend([math.nan] * m)
        self.g_take.extend([math.nan] * m)
        self.g_v.extend([-1] * m)

    def allowance(self, wanted: int) -> int:
        """How many samples may start now (starting one does not change the queue, and uses
        one unit of the admission bound)."""
        rule = self.rule
        if rule.limits_producers and rule.producers_wait(self.queued + self.held):
            return 0
        if self.admission is not None:
            return max(0, min(wanted, self.admission.room(self.v, self.busy)))
        return wanted

    # -- groups and the queue --------------------------------------------------------------
    def group_done(self, g: int, now: float) -> None:
        self.g_end[g] = now
        rule = self.rule
        version = self.version_of(g) if rule.ages else 0
        decision = rule.on_group(self.v - version, self.queued)
        kind = type(decision)
        if kind is Drop:
            self._drop(g, decision.state)
            return
        if kind is Hold:
            self.g_state[g] = HELD
            self.hd.append(g)
            self.held += self.S
        else:
            self._enqueue(g)
            if kind is Evict:
                while rule.overflow(self.queued):
                    self._drop(self._front(), decision.drop.state)
        if rule.ages:
            rule.remember(g, version)
        if not self.busy:
            self.settle(now)

    def _enqueue(self, g: int) -> None:
        self.g_state[g] = QUEUED
        self.qd.append(g)
        self.queued += self.S

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
        if self.admission is not None:
            self.admission.consumed(self.versions_used, g * self.S, (g + 1) * self.S)

    def settle(self, now: float) -> None:
        """Take batches while the trainer is free and the queue holds one; let held groups in."""
        while not self.finished:
            while not self.busy and self.queued >= self.B and not self.finished:
                self._take(now)
            if not self._admit_held() or self.busy:
                return

    def _admit_held(self) -> bool:
        moved = False
        hd, state = self.hd, self.g_state
        while hd and (state[hd[0]] != HELD or self.rule.has_room(self.queued)):
            g = hd.popleft()
            if state[g] != HELD:
                continue
            self.held -= self.S
            state[g] = QUEUED
            self.qd.append(g)
            self.queued += self.S
            moved = True
        return moved

    # -- the trainer -----------------------------------------------------------------------
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
            self.step_done(now)

    def step_done(self, now: float) -> None:
        if self.admission is not None:
            self.admission.stepped()
        self.v += 1
        self.u_time.append(now)
        self.busy = False
        self.step_end = INF
        if self.v >= self.sc.updates:
            self.finished = True
            self.end = now
            return
        state = self.g_state
        for g, drop in self.rule.on_step(self.v):
            if state[g] in (QUEUED, HELD):
                self._drop(g, drop.state)
