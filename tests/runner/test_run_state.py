"""RunState without workers or Docker: a fake clock feeds it the events the orchestrator
would (dispatch, run, result, commit, cancel, end), and the journal it returns is replayed."""

from __future__ import annotations

import heapq
import json

import numpy as np
import pytest

from runner.config import validate_run
from runner.run_state import ReplayMismatch, RunState

BASE = {
    "name": "t", "seed": 3, "workers": 3, "cohort": 4, "updates": 5,
    "model": {"backend": "hf", "path": "m"}, "tasks": {"dir": "t"},
    "episodes_per_job": 2, "concurrency": 2,
}  # fmt: skip


def config(**over):
    return validate_run({**BASE, **over})


def fake_run(cfg, seed=0, order=None):
    """The orchestrator's order of events, with lognormal job times and random rewards
    (``order``: a function that may reorder a batch of results landing at one time).
    Returns the state and its journal."""
    rng = np.random.default_rng(seed)
    state, events = RunState(cfg, cfg.es.update_rule()), []

    def write(ev):
        if ev is not None:
            events.append(ev)

    heap, idle, owner = [], list(range(cfg.workers)), {}
    write(state.segment(1, 0.0, 0.0, "start"))

    def pump(t):
        while idle and state.version < cfg.updates:
            ev = state.dispatch(idle[0], t)
            if not isinstance(ev, dict):
                return
            w = idle.pop(0)
            write(ev)
            write(state.worker_state(w, "busy", t))
            write(state.job_started(ev["job"], t, 0.0))
            heapq.heappush(heap, (t + float(rng.lognormal(0.0, 0.8)), ev["job"]))
            owner[ev["job"]] = w

    pump(0.0)
    t = 0.0
    while heap and state.version < cfg.updates:
        t, job = heapq.heappop(heap)
        if job not in state.running:  # cancelled by a commit
            continue
        outcome = {"reward": float(rng.integers(0, 3)) / 2, "episodes": [{"tokens_out": 3}],
                   "perturb_s": 0.1, "generation_s": 0.2, "container_s": 0.3}  # fmt: skip
        write(state.land(job, t, outcome))
        freed = [owner.pop(job)]
        while state.policy.ready() and state.version < cfg.updates:
            ev = state.commit(t)
            write(ev)
            freed += [owner.pop(j) for j in ev["cancel"]]
        for w in freed:
            write(state.worker_state(w, "idle", t))
            idle.append(w)
        pump(t)
    write(state.end(t, "run ended"))
    return state, events


CASES = {
    "sync": {"policy": {"kind": "sync"}},
    "bounded_cancel": {"policy": {"kind": "bounded", "max_lag": 1, "on_stale": "cancel"},
                       "workers": 7},
    "controlled_delay_antithetic": {
        "policy": {"kind": "controlled_delay", "fraction": 0.5, "delay": 1}, "workers": 5,
        "es": {"antithetic": True}},
    "unbounded_drain": {"policy": {"kind": "unbounded"}, "workers": 5, "drain_every": 2},
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_journal_replays_into_the_same_state(case):
    cfg = config(**CASES[case])
    state, events = fake_run(cfg)
    assert state.version == cfg.updates
    again = RunState(cfg, cfg.es.update_rule())
    for ev in json.loads(json.dumps(events)):  # as read back from journal.jsonl
        again.replay(ev)
    assert again.finished and [r.to_dict() for r in again.log] == [r.to_dict() for r in state.log]
    assert again.trace({}).jobs.equals(state.trace({}).jobs)
    assert again.trace({}).updates.equals(state.trace({}).updates)


def test_a_journal_that_the_policy_would_not_write_is_refused():
    cfg = config(policy={"kind": "bounded", "max_lag": 0, "on_stale": "drop"}, workers=4)
    _, events = fake_run(cfg)
    discarded = next(e for e in events if e["e"] == "result" and e["verdict"] == "discarded")
    discarded["verdict"] = "accepted"
    again = RunState(cfg, cfg.es.update_rule())
    with pytest.raises(ReplayMismatch, match=r"differs in \['verdict'\]"):
        for ev in events:
            again.replay(ev)
