"""The policy driver: the rows and tallies every clock shares, worked out by hand."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from staleness_sim.core import driver as driver_module
from staleness_sim.core.driver import PolicyDriver, cancel_reason
from staleness_sim.core.policies import Start, Wait, make_policy
from staleness_sim.core.trace import TraceRecorder


def drive(policy_spec: dict, cohort: int, **kwargs) -> PolicyDriver:
    return PolicyDriver(make_policy(policy_spec, cohort), TraceRecorder(), **kwargs)


def start(d: PolicyDriver, worker: int, t: float) -> int:
    decision = d.idle(worker, t)
    assert isinstance(decision, Start)
    return decision.job_id


def test_a_discarded_result_and_a_commit_give_their_rows():
    # bounded max_lag 0, cohorts of 2: jobs 0, 1, 2 start at version 0; 0 and 1 land and
    # commit version 1; job 2 then lands one update old and is discarded.
    d = drive({"kind": "bounded", "max_lag": 0}, 2, seed_of=lambda j: 100 + j)
    for w in range(3):
        start(d, w, t=0.5 * w)
    d.land(1)
    d.land(0)
    assert d.ready()
    cohort = d.commit()
    d.record_commit(cohort, time=9.0, commit_time=8.0)
    d.land(2)
    jobs, updates = d.rec.jobs, d.rec.updates
    assert jobs["seed"] == [100, 101, 102] and jobs["dispatch_time"] == [0.0, 0.5, 1.0]
    assert jobs["verdict"] == ["accepted", "accepted", "discarded"]
    assert jobs["lag"] == [0, 0, 1] and jobs["completion_version"] == [0, 0, 1]
    assert jobs["reason"][2] == "lag 1 > max_lag 0"
    assert updates == {"version": [1], "time": [9.0], "commit_time": [8.0], "cohort_size": [2],
                       "mean_lag": [0.0], "max_lag": [0]}  # fmt: skip
    assert d.counts == {"accepted": 2, "discarded": 1, "deferred": 0, "dropped": 0, "commits": 1}


def test_deferred_results_are_tallied_until_their_cohort_uses_them():
    # controlled_delay, cohort 2, fraction 0.5, delay 1: of version 0's three jobs the
    # first landing result is held back one update and joins version 2's cohort at lag 1.
    d = drive({"kind": "controlled_delay", "fraction": 0.5, "delay": 1}, 2)
    for w in range(3):
        start(d, w, 0.0)
    assert isinstance(d.idle(3, 0.0), Wait)
    for job in (2, 0, 1):
        d.land(job)
    assert d.counts["deferred"] == 1 and d.rec.jobs["verdict"][2] == "deferred"
    d.record_commit(d.commit(), time=1.0, commit_time=1.0)
    # version 1 needs one fresh result (job 2 has matured) plus one to hold back: two jobs
    for w in range(2):
        start(d, w, 1.0)
    d.land(3)  # held back for version 2
    d.land(4)
    cohort = d.commit()
    assert dict(zip(cohort.job_ids, cohort.lags, strict=True)) == {2: 1, 4: 0}
    d.record_commit(cohort, time=2.0, commit_time=2.0, job_row={"reward": 0.5})
    assert d.rec.jobs["verdict"][2] == "accepted" and d.rec.jobs["lag"][2] == 1
    assert d.rec.jobs["reward"][2] == 0.5 and d.rec.updates["mean_lag"] == [0.0, 0.5]
    assert d.counts == {"accepted": 4, "discarded": 0, "deferred": 1, "dropped": 0, "commits": 2}


def test_a_cancel_frees_the_policy_and_records_the_one_reason():
    # sync, cohort 2: the barrier admits two jobs; cancelling one frees its place.
    d = drive({"kind": "sync"}, 2)
    start(d, 0, 0.0)
    start(d, 1, 0.0)
    assert isinstance(d.idle(2, 0.0), Wait)
    d.cancel(1, "worker 1 crashed", end_time=3.0)
    assert d.rec.jobs["verdict"][1] == "cancelled" and d.rec.jobs["end_time"][1] == 3.0
    assert d.rec.jobs["reason"][1] == "worker 1 crashed"
    assert start(d, 2, 3.0) == 2
    assert cancel_reason(7) == "cancelled at version 7: would exceed the bound"


def test_without_a_recorder_only_decisions_and_tallies_are_kept():
    d = PolicyDriver(make_policy({"kind": "unbounded"}, 1))
    start(d, 0, 0.0)
    d.land(0)
    d.record_commit(d.commit(), time=1.0, commit_time=1.0)
    assert d.version == 1 and d.counts["accepted"] == 1


def test_the_driver_imports_only_the_standard_library_and_the_policies():
    path = Path(driver_module.__file__)
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    outside = {n for n in names if n.split(".")[0] not in sys.stdlib_module_names}
    assert outside == {"staleness_sim.core.policies"}


def test_a_cohort_comes_in_dispatch_order_whatever_the_order_results_landed_in():
    d = drive({"kind": "bounded", "max_lag": 2}, 3)
    for w in range(5):
        start(d, w, 0.0)
    for job in (4, 0, 2):  # lands out of order; the policy lists them so
        d.land(job)
    assert d.policy._members == [(4, 0), (0, 0), (2, 0)]
    first = d.commit()
    assert first.job_ids == (0, 2, 4) and first.lags == (0, 0, 0)
    start(d, 0, 1.0)  # job 5, dispatched at version 1
    for job in (5, 3, 1):
        d.land(job)
    second = d.commit()
    assert second.job_ids == (1, 3, 5) and second.lags == (1, 1, 0)


def test_members_the_update_left_out_are_dropped_not_accepted():
    # a recorder with the runner's weight column
    d = PolicyDriver(make_policy({"kind": "unbounded"}, 2), TraceRecorder(("weight",)))
    for w in range(2):
        start(d, w, 0.0)
    d.land(0)
    d.land(1)
    cohort = d.commit()
    d.record_commit(cohort, 1.0, 1.0, dropped={1: "lag 1 > max_lag 0 (es.staleness: x)"},
                    weights={0: 0.25})  # fmt: skip
    assert d.rec.jobs["verdict"] == ["accepted", "dropped"]
    assert d.rec.jobs["weight"] == [0.25, None]
    assert d.rec.jobs["reason"][1] == "lag 1 > max_lag 0 (es.staleness: x)"
    assert d.counts["accepted"] == 1 and d.counts["dropped"] == 1
    assert d.rec.updates["cohort_size"] == [2]  # the cohort the policy closed
