"""The queue rules (``block``, ``drop_oldest``, ``max_staleness``) and admission control as
small state objects, in the manner of the ES policies (``staleness_sim.core.policies``):
no clock, no queue of their own, every decision about a group with a reason.

A rule answers, for the queue it is given (``staleness_sim.queue.groups``):

* ``on_group(staleness, queued)``: a group finished with ``queued`` samples in the queue:
  :class:`Enqueue` it, :class:`Hold` it until there is room, :class:`Drop` it, or
  :class:`Evict` (enqueue it, then drop the oldest queued groups while ``overflow``);
* ``producers_wait(waiting)``: must idle slots wait, with ``waiting`` finished samples
  queued or held?
* ``has_room(queued)``: may a held group enter the queue now?
* ``on_step(version)``: after a step publishes ``version``, the groups now too old, each
  with its :class:`Drop` (``max_staleness``: those it remembered, queued or held,
  generated before ``version - K``); the queue drops those still waiting.

:class:`Admission` is the producer gate of ``queue.admission``: no sample starts that
could exceed ``max_staleness`` when taken.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from staleness_sim.queue.config import QueueScenario
from staleness_sim.queue.parts import DROPPED_FULL, DROPPED_STALE


@dataclass(frozen=True, slots=True)
class Enqueue:
    reason: str = "queued"


@dataclass(frozen=True, slots=True)
class Hold:
    reason: str


@dataclass(frozen=True, slots=True)
class Drop:
    state: int  # the group's state from now on (DROPPED_FULL, DROPPED_STALE)
    reason: str  # the reason its samples carry in the trace


@dataclass(frozen=True, slots=True)
class Evict:
    """Enqueue the group, then drop the oldest queued groups (``drop``) while the queue is
    over capacity."""

    drop: Drop
    reason: str = "queued; the oldest groups dropped while the queue is over capacity"


Arrival = Enqueue | Hold | Drop | Evict

ENQUEUE = Enqueue()
QUEUE_FULL = Drop(DROPPED_FULL, "dropped: queue full (drop_oldest)")


def too_old(max_staleness: int | None) -> Drop:
    if max_staleness is None:
        return Drop(DROPPED_STALE, "dropped: too old")
    return Drop(DROPPED_STALE, f"dropped: older than max_staleness {max_staleness}")


class Block:
    """Producers wait while the queue, with the groups held for room, is full; a finished
    group that finds no room is held until there is (a null capacity: never full)."""

    kind = "block"
    ages = False  # whether on_group needs the group's staleness

    def __init__(self, capacity: int | None, group_size: int) -> None:
        self.capacity, self.group_size = capacity, group_size
        self.limits_producers = capacity is not None
        self.hold = Hold("queue full: held until there is room")

    def has_room(self, queued: int) -> bool:
        return self.capacity is None or queued + self.group_size <= self.capacity

    def on_group(self, staleness: int, queued: int) -> Arrival:
        return ENQUEUE if self.has_room(queued) else self.hold

    def producers_wait(self, waiting: int) -> bool:
        return self.limits_producers and waiting >= self.capacity

    def overflow(self, queued: int) -> bool:
        return False

    def remember(self, group: int, version: int) -> None:
        """A group entered the queue or was held, generated at ``version``."""

    def on_step(self, version: int) -> list[tuple[int, Drop]]:
        return []


class DropOldest(Block):
    """Producers never wait; a group that finds the queue full enters it and the oldest
    queued groups are dropped until the queue fits its capacity."""

    kind = "drop_oldest"

    def __init__(self, capacity: int | None, group_size: int) -> None:
        super().__init__(capacity, group_size)
        self.limits_producers = False
        self.evict = Evict(QUEUE_FULL)

    def on_group(self, staleness: int, queued: int) -> Arrival:
        return ENQUEUE if self.has_room(queued) else self.evict

    def overflow(self, queued: int) -> bool:
        return queued > self.capacity


class MaxStaleness(Block):
    """``block`` for room, and a group older than ``max_staleness`` versions is dropped: when
    it finishes, and when a step leaves it behind in the queue or waiting for room."""

    kind = "max_staleness"
    ages = True

    def __init__(self, capacity: int | None, group_size: int, max_staleness: int) -> None:
        super().__init__(capacity, group_size)
        self.max_staleness = max_staleness
        self.drop = too_old(max_staleness)
        self._by_version: list[tuple[int, int]] = []  # (version, group): a min-heap

    def on_group(self, staleness: int, queued: int) -> Arrival:
        if staleness > self.max_staleness:
            return self.drop
        return super().on_group(staleness, queued)

    def remember(self, group: int, version: int) -> None:
        heapq.heappush(self._by_version, (version, group))

    def on_step(self, version: int) -> list[tuple[int, Drop]]:
        limit, heap, old = version - self.max_staleness, self._by_version, []
        while heap and heap[0][0] < limit:
            old.append((heapq.heappop(heap)[1], self.drop))
        return old


def make_rule(sc: QueueScenario) -> Block:
    q, cap, s = sc.queue, sc.capacity_samples, sc.rollout.group_size
    if q.rule == "block":
        return Block(cap, s)
    if q.rule == "drop_oldest":
        return DropOldest(cap, s)
    if q.rule == "max_staleness":
        return MaxStaleness(cap, s, q.max_staleness)
    raise ValueError(f"queue.rule: not a queue rule: {q.rule!r}")


class Admission:
    """``queue.admission``: a sample may start only if, taken at the earliest version it
    can be, it would not exceed ``max_staleness``. It counts the unconsumed samples (started
    and not yet taken or dropped) per version they generated under (with in-flight
    updates, the version they landed at; until then they count only in ``unconsumed``)."""

    def __init__(self, max_staleness: int, batch: int, in_flight: bool) -> None:
        self.max_staleness, self.batch, self.in_flight = max_staleness, batch, in_flight
        self.unconsumed = 0
        self.per_version = [0]  # unconsumed samples by version
        self.oldest = 0  # no unconsumed sample is older
        self.cached: int | None = None  # the room, while nothing it depends on changed

    def room(self, version: int, busy: bool) -> int:
        """How many more samples may start; it changes only when samples are taken or
        dropped and when a step ends (cached in between, less each start)."""
        if self.cached is None:
            count, oldest = self.per_version, self.oldest
            while oldest < version and count[oldest] == 0:
                oldest += 1
            self.oldest = oldest
            # every later sample is taken at a version >= next_take; the oldest unconsumed
            # one must be taken by version oldest + K, so at most this many may be unconsumed
            next_take = version + 1 if busy else version
            span = oldest + self.max_staleness - next_take + 1
            self.cached = span * self.batch - self.unconsumed
        return self.cached

    def started(self, k: int, version: int) -> None:
        self.unconsumed += k
        self.cached -= k
        if not self.in_flight:
            self.per_version[version] += k

    def landed(self, version: int) -> None:
        """With in-flight updates, a sample counts at the version it landed at."""
        self.per_version[version] += 1

    def consumed(self, versions, first: int, stop: int) -> None:
        """Samples ``first`` .. ``stop - 1`` (one group) were taken or dropped;
        ``versions[i]``: the version sample i counts at."""
        self.cached = None
        self.unconsumed -= stop - first
        count = self.per_version
        for i in range(first, stop):
            count[versions[i]] -= 1

    def stepped(self) -> None:
        self.cached = None
        self.per_version.append(0)
