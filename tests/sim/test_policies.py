"""The policy state machines on their own: no engine, events fed by hand."""

import pytest

from staleness_sim.core.policies import (
    Accept,
    BoundedStaleness,
    ControlledDelay,
    Defer,
    Discard,
    Draining,
    Start,
    Synchronous,
    Unbounded,
    Wait,
    make_policy,
)


def start(policy, worker=0):
    decision = policy.on_idle(worker)
    assert isinstance(decision, Start), decision
    return decision


def test_sync_barrier_dispatches_exactly_n_then_waits():
    p = Synchronous(cohort=3)
    jobs = [start(p, w).job_id for w in range(3)]
    assert isinstance(p.on_idle(3), Wait)
    for j in jobs:
        assert p.on_result(j) == Accept(0, "fresh")
    assert p.ready()
    cohort = p.commit()
    assert (cohort.version, cohort.job_ids, cohort.lags) == (1, tuple(jobs), (0, 0, 0))
    assert start(p).version == 1


def test_commit_of_incomplete_cohort_is_refused():
    p = Unbounded(cohort=2)
    p.on_result(start(p).job_id)
    assert not p.ready()
    with pytest.raises(RuntimeError, match="1 of 2"):
        p.commit()


def test_unknown_job_result_is_an_error():
    with pytest.raises(KeyError, match="not in flight"):
        Unbounded(cohort=1).on_result(7)


def test_bounded_drop_discards_only_above_the_bound():
    p = BoundedStaleness(cohort=1, max_lag=1, on_stale="drop")
    old = start(p).job_id  # dispatched at version 0
    mid = []
    for _ in range(2):  # two commits while `old` is in flight
        j = start(p).job_id
        mid.append(j)
        p.on_result(j)
        p.commit()
    verdict = p.on_result(old)
    assert isinstance(verdict, Discard) and verdict.lag == 2
    j = start(p).job_id
    p.commit() if p.ready() else None
    assert isinstance(p.on_result(j), Accept)


def test_bounded_cancel_names_doomed_jobs_at_commit():
    p = BoundedStaleness(cohort=1, max_lag=0, on_stale="cancel")
    slow = start(p).job_id
    fast = start(p).job_id
    p.on_result(fast)
    cohort = p.commit()
    assert cohort.cancel == (slow,)
    p.on_cancel(slow)
    assert p.in_flight == 0


def test_pace_admission_never_lets_a_job_exceed_the_bound():
    # N = 2, max_lag = 1: the oldest job (version 0) must land before version 2 commits,
    # which needs 2 * 2 = 4 results; so at most 4 jobs may be in flight at version 0.
    p = BoundedStaleness(cohort=2, max_lag=1, on_stale="pace")
    jobs = [start(p, w).job_id for w in range(4)]
    assert isinstance(p.on_idle(4), Wait)
    # Results of jobs 1 and 2 land, version 1 commits: the oldest (job 0) still needs to
    # land before version 2, which now needs 2 more results; jobs 0 and 3 are in flight.
    p.on_result(jobs[1])
    p.on_result(jobs[2])
    p.commit()
    assert isinstance(p.on_idle(0), Wait)
    assert isinstance(p.on_result(jobs[0]), Accept)  # lag 1: allowed
    # job 3 (version 0) is now the oldest and version 2 needs one more result: if a new
    # job could land first, job 3 would end with lag 2, so the gate stays shut
    assert isinstance(p.on_idle(0), Wait)
    assert p.on_result(jobs[3]).lag == 1
    p.commit()
    assert isinstance(p.on_idle(0), Start)


def test_pace_with_zero_bound_behaves_like_a_barrier():
    p = BoundedStaleness(cohort=3, max_lag=0, on_stale="pace")
    jobs = [start(p, w).job_id for w in range(3)]
    assert isinstance(p.on_idle(3), Wait)
    for j in jobs:
        assert p.on_result(j).lag == 0


def test_controlled_delay_composition():
    n, delay = 10, 2
    p = ControlledDelay(cohort=n, fraction=0.2, delay=delay)
    assert p.n_delayed == 2
    lags_per_cohort = []
    for version in range(6):
        verdicts = []
        while not p.ready():
            d = p.on_idle(0)
            assert isinstance(d, Start), f"barrier closed early at version {version}"
            verdicts.append(p.on_result(d.job_id))
        # the first n_delayed results of each version are held back exactly `delay` updates
        assert all(
            isinstance(v, Defer) and v.until_version == version + delay for v in verdicts[:2]
        )
        assert all(isinstance(v, Accept) for v in verdicts[2:])
        assert isinstance(p.on_idle(0), Wait)  # nothing beyond the quota
        lags_per_cohort.append(sorted(p.commit().lags))
    for version, lags in enumerate(lags_per_cohort):
        expected = [0] * n if version < delay else [0] * 8 + [delay] * 2
        assert lags == expected, version


def test_controlled_delay_rejects_degenerate_fractions():
    with pytest.raises(ValueError, match="no fresh result"):
        ControlledDelay(cohort=1, fraction=0.6, delay=2)


def test_draining_quiesces_before_the_checkpoint_commit():
    p = Draining(Unbounded(cohort=2), every=1)
    a, b = start(p, 0).job_id, start(p, 1).job_id
    assert isinstance(p.on_idle(2), Wait)  # two in flight can complete the cohort
    p.on_result(a)
    assert isinstance(p.on_idle(2), Wait)  # b still completes it
    p.on_result(b)
    cohort = p.commit()
    assert cohort.lags == (0, 0) and p.in_flight == 0


def test_draining_reopens_when_a_result_is_discarded():
    p = Draining(BoundedStaleness(cohort=1, max_lag=0), every=2)
    stale = start(p, 0).job_id  # version 0
    fresh = start(p, 1).job_id
    p.on_result(fresh)
    p.commit()  # version 1; the next commit is a checkpoint
    assert isinstance(p.on_idle(2), Wait)  # `stale` could complete it...
    assert isinstance(p.on_result(stale), Discard)  # ...but it is discarded
    assert isinstance(p.on_idle(2), Start)


@pytest.mark.parametrize(
    "spec, error",
    [
        ({"kind": "nope"}, "policy.kind must be one of"),
        ({"kind": "bounded", "max_lag": -1}, "max_lag must be >= 0"),
        ({"kind": "bounded", "max_lag": 1, "on_stale": "maybe"}, "on_stale must be one of"),
        ({"kind": "controlled_delay", "fraction": 1.0, "delay": 2}, "fraction must be in"),
        ({"kind": "controlled_delay", "fraction": 0.1, "delay": 0}, "delay must be >= 1"),
    ],
)
def test_make_policy_rejects_bad_specs(spec, error):
    with pytest.raises(ValueError, match=error):
        make_policy(spec, cohort=10)


def test_make_policy_builds_each_kind():
    assert make_policy({"kind": "sync"}, 4).kind == "sync"
    assert make_policy({"kind": "unbounded"}, 4).kind == "unbounded"
    p = make_policy({"kind": "bounded", "max_lag": 2, "on_stale": "pace"}, 4, drain_every=5)
    assert isinstance(p, Draining) and p.max_lag == 2 and p.on_stale == "pace"
    assert make_policy({"kind": "controlled_delay", "fraction": 0.1, "delay": 4}, 30).n_delayed == 3


def test_sync_cancelled_job_frees_its_place_behind_the_barrier():
    # A worker that crashes mid-job under sync: without a replacement the cohort of 2
    # could never fill.
    p = Synchronous(cohort=2)
    a, b = p.on_idle(0), p.on_idle(1)
    assert isinstance(p.on_idle(2), Wait)
    p.on_cancel(b.job_id)
    c = p.on_idle(2)
    assert isinstance(c, Start) and c.version == 0
    p.on_result(a.job_id)
    p.on_result(c.job_id)
    assert p.ready() and p.commit().job_ids == (a.job_id, c.job_id)
