"""The queue pipeline: C rollout slots, groups of S samples, a queue of finished groups, and
a trainer that takes B samples per step and needs its own time per step.

Two ways of forming a batch share one set of conventions (those of the cohort engine,
``engine.py``) and one trace schema:

* the **queue rules** (``block``, ``drop_oldest``, ``max_staleness``; optional admission
  control and in-flight updates): the trainer, when free, takes the B oldest queued
  samples (whole groups) and publishes version v + 1 when its step ends; a slot that
  starts a sample uses the newest published version (``run.py``: the rules as state
  objects in ``rules.py``, asked by the queue in ``groups.py``, on the event loop of
  ``loop.py`` or the vectorised rollout of ``vectorised.py``);
* the **cohort rule**: an ES policy of ``policies.py`` closes a cohort of N = B results and
  the trainer applies cohorts one after another (the cohort engine's semantics, so an ES
  scenario written in this pipeline reproduces the cohort engine exactly; ``cohort.py``).

Conventions (tested in ``tests/sim/test_queue_engine.py``):

1. A landing sample is booked (its group completed, queued, perhaps taken) *before* its
   slot asks for its next sample; with a zero-time step, the new version is published
   before that, so the slot starts at the new version (as the cohort engine does).
2. Idle slots are served first come, first served; serving stops at the first refusal.
3. At equal times, a trainer step that ends is handled before samples that land: the
   landing sample is judged at the new version.
4. The run ends when step ``updates`` ends (its weights are published). Samples still
   generating then are ``cancelled`` ("run ended", end time = the end of the run);
   finished samples not yet used are ``cancelled`` with the reason saying where they were.
5. Sample k gets the same duration under every rule for a given seed (drawn exactly as
   the cohort engine draws job k's duration); step j the same step time.

Staleness of a used sample = the trainer's version when it takes the batch minus the
version the sample generated under: its start version, or with ``in_flight_updates`` the
newest version it generated under (the version when it ended).
"""

from __future__ import annotations

from staleness_sim.core.trace import Trace
from staleness_sim.queue.cohort import CohortRun
from staleness_sim.queue.config import QueueScenario
from staleness_sim.queue.run import QueueRun


def simulate_queue(scenario: QueueScenario) -> Trace:
    """Run one queue-pipeline scenario and return its trace."""
    if scenario.queue.rule == "cohort":
        return CohortRun(scenario).run()
    return QueueRun(scenario).run()
