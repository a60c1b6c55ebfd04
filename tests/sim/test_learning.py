"""The success model along a schedule: what must hold whatever its parameters."""

import numpy as np
import pytest

from staleness_sim.cohort.config import validate_cohort
from staleness_sim.cohort.engine import simulate
from staleness_sim.learning.model import learn_trace
from staleness_sim.learning.spec import LearningSpec
from staleness_sim.learning.tasks import TaskPopulation, mean_sigmoid


def scenario(policy, workers=1, learning=None, **extra):
    return validate_cohort(
        {
            "workers": workers,
            "cohort": 8,
            "updates": 12,
            "policy": policy,
            "job": {
                "episodes": 24,
                "concurrency": 4,
                "episode": {"dist": "lognormal", "median": 20, "sigma": 1.0},
            },
            "learning": {
                "effect": 200.0,
                "sigma": 0.01,
                "alpha": 0.01,
                "dimension": 32,
                **(learning or {}),
            },
            **extra,
        }  # fmt: skip
    )


def run(sc, seed=0):
    return learn_trace(simulate(sc), sc.learning, seed, sc.learning_episodes())


def test_starts_at_the_base_rate_and_learns():
    sc = scenario({"kind": "sync"}, workers=2)
    r = run(sc)
    assert r.success[0] == pytest.approx(sc.learning.base_rate, abs=1e-9)
    assert r.success[-1] > r.success[0] + 0.02  # a strong shared effect is learned


@pytest.mark.parametrize("shaping", ["zscore", "centered_rank"])
def test_a_perturbation_too_small_to_matter_moves_nothing(shaping):
    sc = scenario({"kind": "sync"}, workers=2, learning={"sigma": 1e-12, "shaping": shaping})
    trace = simulate(sc)
    r = learn_trace(trace, sc.learning, 0, sc.learning_episodes())
    used = trace.jobs[trace.jobs["verdict"] == "accepted"].sort_values("job_id")
    # every member of a version scores the same (common random numbers) ...
    per_version = {v: set(r.rewards[(used["dispatch_version"] == v).to_numpy()]) for v in range(12)}
    assert all(len(s) == 1 for s in per_version.values())
    # ... so no update moves the parameters, and success stays at the base rate
    assert np.abs(r.thetas).max() < 1e-12
    np.testing.assert_allclose(r.success, sc.learning.base_rate, atol=1e-12)


def test_a_fresh_schedule_gives_one_curve_whatever_the_policy():
    policies = [{"kind": "sync"}, {"kind": "unbounded"}, {"kind": "bounded", "max_lag": 1}]
    curves = []
    for p in policies:
        sc = scenario(p, workers=1)
        trace = simulate(sc)
        assert (trace.jobs["lag"] == 0).all()  # one worker: every result is fresh
        curves.append(learn_trace(trace, sc.learning, 3, sc.learning_episodes()).success)
    for c in curves[1:]:
        np.testing.assert_array_equal(c, curves[0])


def test_deterministic_per_seed():
    sc = scenario({"kind": "controlled_delay", "fraction": 0.25, "delay": 2}, workers=3)
    trace = simulate(sc)
    a, b, c = (learn_trace(trace, sc.learning, s, 24) for s in (1, 1, 2))
    np.testing.assert_array_equal(a.success, b.success)
    np.testing.assert_array_equal(a.rewards, b.rewards)
    assert not np.array_equal(a.success, c.success)


def test_hours_to_success_is_the_first_version_at_the_target():
    sc = scenario({"kind": "sync"}, workers=2, learning={"target": 0.12})
    trace = simulate(sc)
    r = learn_trace(trace, sc.learning, 0, 24)
    out = r.outputs()
    first = next(v for v, s in out["success_curve"] if s >= 0.12)
    assert first > 0
    assert out["hours_to_success"] == trace.updates["time"].iloc[first - 1] / 3600
    never = sc.learning.model_copy(update={"target": 1.0})
    assert learn_trace(trace, never, 0, 24).outputs()["hours_to_success"] is None


def test_heldout_success_matches_sampled_tasks():
    """The closed form (Gauss-Hermite over the task population) against tasks drawn."""
    spec = LearningSpec(dimension=50, base_rate=0.2, shared=0.3, effect=5.0, spread=1.2)
    pop = TaskPopulation(spec)
    rng = np.random.default_rng(0)
    theta = rng.standard_normal(50) * 0.2
    n = 400_000
    base = pop.mu + spec.spread * rng.standard_normal(n)
    own = rng.standard_normal(n) * np.linalg.norm(theta) / np.sqrt(50)  # v . theta
    logits = base + 5.0 * (np.sqrt(0.3) * theta[0] + np.sqrt(0.7) * own)
    sampled = np.mean(1 / (1 + np.exp(-logits)))
    assert pop.heldout_success(theta) == pytest.approx(sampled, abs=3e-3)
    assert mean_sigmoid(0.0, 0.0) == 0.5


def test_antithetic_pairs_split_over_updates_are_left_out():
    sc = scenario({"kind": "unbounded"}, workers=3, learning={"antithetic": True})
    trace = simulate(sc)
    r = learn_trace(trace, sc.learning, 0, 24)
    assert np.isfinite(r.success).all()
    from staleness_sim.learning.schedule import schedule_from_trace

    s = schedule_from_trace(trace, 24, True)
    for p in np.unique(s.perturbation):  # every pair kept whole, in one update
        rows = s.perturbation == p
        if rows.any():
            assert rows.sum() == 2 and len(set(s.update[rows])) == 1
            assert sorted(s.sign[rows]) == [-1, 1]


def test_uncoupled_members_draw_their_own_episodes():
    """coupling 0: even with nothing to learn, members of a version score differently
    (each draws its own episodes); the shared draw is what made them equal above."""
    sc = scenario({"kind": "sync"}, workers=2, learning={"sigma": 1e-12, "coupling": 0.0})
    trace = simulate(sc)
    r = learn_trace(trace, sc.learning, 0, sc.learning_episodes())
    used = trace.jobs[trace.jobs["verdict"] == "accepted"].sort_values("job_id")
    first = r.rewards[(used["dispatch_version"] == 0).to_numpy()]
    assert len(set(first)) > 1
    # independent Binomial(24, p) / 24 across members: the spread is about sqrt(p(1-p)/24)
    p = first.mean()
    assert 0.3 * np.sqrt(p * (1 - p) / 24) < first.std() < 2.5 * np.sqrt(p * (1 - p) / 24)
