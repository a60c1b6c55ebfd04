"""The queue rules and admission control as small state objects: each decision, by hand,
from what the rule means (docs/queue.md), without a queue or a clock around them."""

from __future__ import annotations

import pytest

from staleness_sim.config import validate
from staleness_sim.queue.parts import DROPPED_FULL, DROPPED_STALE
from staleness_sim.queue.rules import (
    Admission,
    Block,
    Drop,
    DropOldest,
    Enqueue,
    Evict,
    Hold,
    MaxStaleness,
    make_rule,
)


def test_block_holds_a_group_that_finds_no_room_and_makes_producers_wait_when_full():
    rule = Block(capacity=8, group_size=4)  # two groups
    assert isinstance(rule.on_group(staleness=5, queued=4), Enqueue)  # age does not matter
    held = rule.on_group(staleness=0, queued=5)
    assert isinstance(held, Hold) and "room" in held.reason
    assert rule.has_room(4) and not rule.has_room(5)
    assert rule.producers_wait(8) and not rule.producers_wait(7)
    assert rule.on_step(10) == []


def test_block_without_a_capacity_never_holds_nor_waits():
    rule = Block(capacity=None, group_size=4)
    assert isinstance(rule.on_group(staleness=0, queued=10**9), Enqueue)
    assert not rule.producers_wait(10**9)


def test_drop_oldest_enqueues_and_evicts_while_over_capacity_and_never_makes_producers_wait():
    rule = DropOldest(capacity=8, group_size=4)
    assert isinstance(rule.on_group(staleness=0, queued=4), Enqueue)
    full = rule.on_group(staleness=0, queued=8)
    assert isinstance(full, Evict)
    assert full.drop == Drop(DROPPED_FULL, "dropped: queue full (drop_oldest)")
    # with the new group in: 12 samples, one group over; after one eviction: 8, fits
    assert rule.overflow(12) and not rule.overflow(8)
    assert not rule.producers_wait(10**9)


def test_max_staleness_drops_a_group_older_than_k_when_it_finishes():
    rule = MaxStaleness(capacity=None, group_size=4, max_staleness=1)
    assert isinstance(rule.on_group(staleness=1, queued=0), Enqueue)
    assert rule.on_group(staleness=2, queued=0) == Drop(
        DROPPED_STALE, "dropped: older than max_staleness 1"
    )


def test_max_staleness_blocks_for_room_like_block():
    rule = MaxStaleness(capacity=8, group_size=4, max_staleness=3)
    assert isinstance(rule.on_group(staleness=0, queued=8), Hold)
    assert rule.producers_wait(8)


def test_max_staleness_names_each_waiting_group_once_when_a_step_leaves_it_too_old():
    rule = MaxStaleness(capacity=None, group_size=4, max_staleness=1)
    for group, version in ((7, 2), (5, 0), (6, 1), (8, 0)):
        rule.remember(group, version)
    # version 1: nothing generated before 0; version 2: groups of version 0; version 3: of 1
    assert rule.on_step(1) == []
    assert [g for g, _ in rule.on_step(2)] == [5, 8]
    old = rule.on_step(3)
    assert [g for g, _ in old] == [6]
    assert old[0][1].state == DROPPED_STALE
    assert rule.on_step(3) == []


def test_make_rule_maps_each_queue_rule_and_refuses_the_cohort_rule():
    def scenario(queue, group_size=2):
        return validate(
            {
                "pipeline": "queue",
                "updates": 2,
                "rollout": {
                    "concurrency": 4,
                    "group_size": group_size,
                    "sample": {"dist": "exponential", "mean": 1.0},
                },
                "trainer": {"batch": 4, "step": {"dist": "constant", "value": 1.0}},
                "queue": queue,
            }
        )

    rule = make_rule(scenario({"rule": "block", "capacity": 1.5}))
    assert type(rule) is Block and rule.capacity == 6  # 1.5 batches of 4, whole groups of 2
    assert type(make_rule(scenario({"rule": "drop_oldest", "capacity": 1}))) is DropOldest
    stale = make_rule(scenario({"rule": "max_staleness", "max_staleness": 2}))
    assert type(stale) is MaxStaleness and stale.max_staleness == 2
    cohort = scenario({"rule": "cohort", "policy": {"kind": "sync"}}, group_size=1)
    with pytest.raises(ValueError, match="not a queue rule"):
        make_rule(cohort)


def test_admission_lets_start_only_what_can_be_taken_within_k():
    # K = 1, B = 4: a sample started at version 0 must be taken at version 0 or 1, so two
    # batches' worth (8) may be unconsumed; with a step running the next take is at 1, so 4.
    adm = Admission(max_staleness=1, batch=4, in_flight=False)
    assert adm.room(version=0, busy=True) == 4
    adm = Admission(max_staleness=1, batch=4, in_flight=False)
    assert adm.room(version=0, busy=False) == 8
    adm.started(8, version=0)
    assert adm.room(version=0, busy=False) == 0
    versions = [0] * 8
    adm.consumed(versions, 0, 4)  # a batch taken at version 0
    adm.stepped()  # version 1: the 4 left of version 0 must be taken now
    assert adm.room(version=1, busy=False) == 0
    adm.consumed(versions, 4, 8)
    adm.stepped()  # version 2: nothing unconsumed
    assert adm.room(version=2, busy=False) == 8


def test_admission_with_in_flight_updates_counts_a_sample_at_its_landing_version():
    adm = Admission(max_staleness=0, batch=2, in_flight=True)
    assert adm.room(version=0, busy=False) == 2
    adm.started(2, version=0)
    adm.stepped()
    adm.landed(1)
    adm.landed(1)
    # version 1, both count at 1: the oldest unconsumed version is 1, so room is
    # (1 + 0 - 1 + 1) * 2 - 2 = 0; once taken, 2 more
    assert adm.room(version=1, busy=False) == 0
    adm.consumed([1, 1], 0, 2)
    assert adm.room(version=1, busy=False) == 2
