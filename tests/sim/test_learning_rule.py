"""The success model's update is the runner's ES rule: the same coefficients from the same
rewards, seeds, signs and shaping (``runner.es`` is torch-free; a test may import both)."""

import numpy as np
import pytest

from runner.es.update_rule import UpdateRule
from staleness_sim.cohort.config import validate_cohort
from staleness_sim.cohort.engine import simulate
from staleness_sim.learning.model import learn, perturbations
from staleness_sim.learning.schedule import schedule_from_trace
from staleness_sim.learning.shaping import coefficients


@pytest.mark.parametrize("shaping", ["zscore", "centered_rank", "raw"])
@pytest.mark.parametrize("antithetic", [False, True])
def test_coefficients_equal_the_runners_rule(shaping, antithetic):
    rng = np.random.default_rng(7)
    for trial in range(20):
        n = 2 * int(rng.integers(1, 9))
        rewards = rng.integers(0, 5, n) / 4.0  # few distinct values: ties for the ranks
        seeds = np.arange(n) // 2 if antithetic else np.arange(n)
        signs = np.where(np.arange(n) % 2 == 1, -1, 1) if antithetic else np.ones(n, int)
        rule = UpdateRule(sigma=0.01, alpha=0.3, shaping=shaping, antithetic=antithetic)
        record = rule.make(
            [(int(s), float(r), 0, int(g)) for s, r, g in zip(seeds, rewards, signs, strict=True)],
            version=0,
        )
        mine = coefficients(rewards, signs, np.ones(n), 0.3, shaping)
        per_seed = {}
        for s, c in zip(seeds, mine, strict=True):
            per_seed[int(s)] = per_seed.get(int(s), 0.0) + c
        assert dict(record.entries).keys() == per_seed.keys()
        for s, c in record.entries:
            assert per_seed[s] == pytest.approx(c, rel=1e-12, abs=1e-15), (trial, s)


@pytest.mark.parametrize("shaping, antithetic", [("zscore", False), ("centered_rank", True)])
def test_one_worker_without_staleness_moves_as_the_runner_would(shaping, antithetic):
    """G = 1, sync: every update of the model equals sum(coefficient * eps) with the
    runner's coefficients for the model's own rewards."""
    scenario = validate_cohort(
        {
            "workers": 1,
            "cohort": 6,
            "updates": 5,
            "policy": {"kind": "sync"},
            "job": {"duration": {"dist": "exponential", "mean": 10}},
            "learning": {
                "episodes": 32,
                "effect": 300.0,
                "sigma": 0.01,
                "alpha": 0.02,
                "shaping": shaping,
                "antithetic": antithetic,
                "dimension": 16,
            },
        }  # fmt: skip
    )
    spec = scenario.learning
    trace = simulate(scenario)
    schedule = schedule_from_trace(trace, 32, antithetic)
    result = learn(schedule, spec, seed=5)
    eps = perturbations(schedule, spec, seed=5)
    jobs = trace.jobs[trace.jobs["verdict"] == "accepted"].sort_values("job_id")
    assert (jobs["lag"] == 0).all() and len(jobs) == 30
    rule = UpdateRule(sigma=spec.sigma, alpha=spec.alpha, shaping=shaping, antithetic=antithetic)
    moved = 0
    for u in range(5):
        rows = np.flatnonzero(schedule.update == u)
        assert len(rows) == 6
        results = [
            (int(schedule.perturbation[i]), float(result.rewards[i]), u, int(schedule.sign[i]))
            for i in rows
        ]
        record = rule.make(results, version=u)
        step = sum(c * eps[s] for s, c in record.entries)
        np.testing.assert_allclose(result.thetas[u + 1] - result.thetas[u], step, atol=1e-15)
        moved += bool(np.any(step))
    assert moved >= 3  # the rewards differ, so the rule moves the parameters
