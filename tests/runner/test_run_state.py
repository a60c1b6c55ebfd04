"""RunState without workers or Docker: a fake clock feeds it the events the orchestrator
would (dispatch, run, result, commit, cancel, end), and the journal it returns is replayed."""

from __future__ import annotations

import heapq
import json
from pathlib import Path

import numpy as np
import pytest

from runner.config import validate_run
from runner.es import Result
from runner.run_state import ReplayMismatch, RunState
from staleness_sim.core.metrics import summarize

DATA = Path(__file__).resolve().parent / "data"

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


# -- a cohort in dispatch order --------------------------------------------------------
REWARDS = {0: 0.1, 1: 0.7, 2: 0.3, 3: 0.9}


def one_update(landing: list[int]) -> tuple[dict, RunState]:
    """A sync cohort of 4 whose results land in ``landing`` order."""
    cfg = config(policy={"kind": "sync"}, workers=4, es={"staleness": "lag_weighted:0.5"})
    state = RunState(cfg, cfg.es.update_rule())
    for w in range(4):
        state.dispatch(w, 0.0)
    for i, job in enumerate(landing):
        outcome = {"reward": REWARDS[job], "episodes": [], "perturb_s": 0.0,
                   "generation_s": 0.0, "container_s": 0.0}  # fmt: skip
        state.land(job, 1.0 + i, outcome)
    return state.commit(9.0), state


def test_the_same_results_landing_in_other_orders_give_the_same_update_bytes():
    ev, state = one_update([0, 1, 2, 3])
    for landing in ([3, 1, 0, 2], [2, 3, 1, 0]):
        other, _ = one_update(landing)
        assert json.dumps(other["record"]) == json.dumps(ev["record"])
        assert other["jobs"] == [0, 1, 2, 3]
    # the order does reach the bytes: the record made in a landing order differs
    jobs = state.rec.jobs
    results = [Result(jobs["seed"][j], REWARDS[j], 0, 1) for j in (3, 1, 0, 2)]
    landed = state.rule.make(results, 0).to_dict()
    assert json.dumps(landed) != json.dumps(ev["record"])
    assert sorted(landed["entries"]) == sorted(ev["record"]["entries"])


def test_a_journal_written_in_landing_order_still_replays():
    # Written by RunState before cohorts came in dispatch order (commit b6d9230): its
    # commits list members as they landed, and its records were made in that order.
    lines = (DATA / "journal_landing_order.jsonl").read_text().splitlines()
    cfg = validate_run(json.loads(lines[0])["config"])
    events = [json.loads(line) for line in lines[1:]]
    commits = [e for e in events if e["e"] == "commit"]
    assert any(c["jobs"] != sorted(c["jobs"]) for c in commits)
    state = RunState(cfg, cfg.es.update_rule())
    for ev in events:
        state.replay(ev)
    assert state.finished and [r.to_dict() for r in state.log] == [c["record"] for c in commits]


# -- the update's own decisions in the trace --------------------------------------------
def test_results_the_update_drops_are_recorded_dropped_and_summarize_counts_them():
    # bounded max_lag 1 lets results one update old into a cohort; es.staleness
    # drop_over:0 then leaves exactly those out of the update.
    cfg = config(policy={"kind": "bounded", "max_lag": 1}, workers=6,
                 es={"staleness": "drop_over:0"})  # fmt: skip
    state, _ = fake_run(cfg)
    jobs = state.trace({}).jobs.set_index("job_id")
    used = sum(r.n_accepted for r in state.log)
    left_out = {(d["seed"], d["sign"]) for r in state.log for d in r.dropped}
    assert left_out and used == sum(len(r.lags) for r in state.log)
    dropped = jobs[jobs.verdict == "dropped"]
    assert set(zip(dropped.seed, dropped.sign, strict=True)) == left_out
    assert (dropped.lag == 1).all()
    assert (dropped.reason == "lag 1 > max_lag 0 (es.staleness: drop_over:0)").all()
    s = summarize(state.trace({}))
    assert s["results_accepted"] == used and s["results_dropped"] == len(left_out)
    assert s["lag_hist"] == {0: used} and s["max_lag"] == 0
    assert s["data_utilization"] == used / (used + len(left_out) + s["results_discarded"])


def test_a_missing_antithetic_partner_is_dropped_with_its_setting():
    cfg = config(policy={"kind": "unbounded"}, workers=5, es={"antithetic": True})
    state, _ = fake_run(cfg)
    jobs = state.trace({}).jobs
    dropped = jobs[jobs.verdict == "dropped"]
    assert len(dropped) == sum(len(r.dropped) for r in state.log) > 0
    assert (dropped.reason == "antithetic partner missing (es.antithetic: true)").all()
    accepted = jobs[jobs.verdict == "accepted"]
    assert len(accepted) == sum(r.n_accepted for r in state.log)
    assert accepted.groupby("seed").size().eq(2).all()  # every seed used with both signs


def test_lag_weighted_results_carry_their_weight():
    cfg = config(policy={"kind": "unbounded"}, workers=6, es={"staleness": "lag_weighted:0.5"})
    state, _ = fake_run(cfg)
    jobs = state.trace({}).jobs
    accepted = jobs[jobs.verdict == "accepted"]
    assert (accepted.lag > 0).any()
    assert accepted.weight.tolist() == [0.5 ** int(lag) for lag in accepted.lag]
    assert jobs.loc[jobs.verdict != "accepted", "weight"].isna().all()


def test_each_segment_keeps_the_machine_it_ran_on_through_a_replay():
    cfg = config(policy={"kind": "sync"})
    state, events = RunState(cfg, cfg.es.update_rule()), []
    laptop, server = {"cpu": "laptop", "cpus": 2}, {"cpu": "server", "cpus": 64}
    for n, facts in ((1, laptop), (2, server)):
        events.append(state.segment(n, 100.0 * n, 0.0, "started", facts))
    events.append(state.segment(3, 300.0, 0.0, "an old journal: no machine"))
    again = RunState(cfg, cfg.es.update_rule())
    for ev in json.loads(json.dumps(events)):
        again.replay(ev)
    assert [s.get("machine") for s in again.segments] == [laptop, server, None]
    assert again.segments == state.segments


def test_how_busy_the_machine_was_comes_back_with_its_segment_through_a_replay():
    cfg = config(policy={"kind": "sync"})
    state = RunState(cfg, cfg.es.update_rule())
    use = {"machine_busy_cores": 1.62, "process_busy_cores": 1.1}
    events = [state.segment(1, 100.0, 0.0, "started"), state.end(5.0, "interrupted", use)]
    events += [state.segment(2, 200.0, 5.0, "resumed"), state.end(9.0, "killed")]
    again = RunState(cfg, cfg.es.update_rule())
    for ev in json.loads(json.dumps(events)):
        again.replay(ev)
    assert [s.get("machine_busy_cores") for s in again.segments] == [1.62, None]
    assert [s.get("process_busy_cores") for s in again.segments] == [1.1, None]
    assert again.segments == state.segments
