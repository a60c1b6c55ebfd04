"""The queue pipeline against theory: M_tail for duration models, the published queue-drop
closed form (and the one correction we derived for it), and queue-max's length bias.

Expected numbers come from closed forms or from direct numpy draws, never from the engine."""

import math

import numpy as np
import pytest

from staleness_sim.config import validate
from staleness_sim.core import analytic
from staleness_sim.core.analytic import queue_drop_mean_staleness
from staleness_sim.durations import make_duration
from staleness_sim.summary import run_summary

LIGHT = {"dist": "lognormal", "mean": 1.0, "cv": 0.27}
HEAVY = {"dist": "lognormal", "mean": 1.0, "cv": 1.5}


def scenario(sample, rho, q=2, S=8, C=128, B=128, updates=600, seed=0, **queue):
    # mean length 1, so rho = C * step / (B * 1)
    queue = queue or {"capacity": q, "rule": "drop_oldest"}
    return validate(
        {
            "pipeline": "queue",
            "seed": seed,
            "updates": updates,
            "rollout": {"concurrency": C, "group_size": S, "sample": sample},
            "trainer": {"batch": B, "step": {"dist": "constant", "value": rho * B / C}},
            "queue": queue,
        }
    )


# -- M_tail ---------------------------------------------------------------------------------


@pytest.mark.parametrize("s", [1, 2, 8, 16])
def test_m_tail_of_exponential_lengths_is_the_harmonic_number(s):
    model = make_duration({"dist": "exponential", "mean": 3.0})
    assert analytic.m_tail(model, s) == pytest.approx(sum(1 / k for k in range(1, s + 1)), 1e-6)


@pytest.mark.parametrize("s", [1, 2, 5])
def test_m_tail_of_a_two_point_law(s):
    # lengths 1 or 3 with probability 1/2: max of s is 1 only if all are 1
    model = make_duration({"dist": "empirical", "values": [1.0, 3.0]})
    assert analytic.m_tail(model, s) == pytest.approx((3 - 2 * 0.5**s) / 2, 1e-6)


def test_m_tail_of_constant_lengths_is_one():
    assert analytic.m_tail(make_duration({"dist": "constant", "value": 2.0}), 8) == pytest.approx(
        1.0
    )


def test_m_tail_of_a_lognormal_matches_direct_draws():
    rng = np.random.default_rng(7)
    sigma = math.sqrt(math.log1p(1.5**2))
    x = rng.lognormal(-(sigma**2) / 2, sigma, size=(200_000, 8))
    direct = x.max(axis=1).mean() / x.mean()
    assert analytic.m_tail(make_duration(HEAVY), 8) == pytest.approx(direct, rel=0.01)


# -- the closed form itself ------------------------------------------------------------------


def test_closed_form_by_hand():
    assert queue_drop_mean_staleness(0.5, 128, 128, 1.5, 2) == pytest.approx(2.0)
    assert queue_drop_mean_staleness(2.0, 128, 128, 1.5, 2) == pytest.approx(0.75 + 1.25)
    assert queue_drop_mean_staleness(2.0, 256, 128, 1.0, 1) == pytest.approx(1.0 + 0.5 + 0.25)
    assert queue_drop_mean_staleness(1.5, 128, 128, 1.5, None) == math.inf
    assert analytic.queue_rho(128, 128, 1.0, 2.0) == 2.0


# -- simulation against the closed form ----------------------------------------------------------


@pytest.mark.parametrize("S", [8, 16])
@pytest.mark.parametrize("rho", [0.5, 0.75])
def test_rollout_bound_staleness_is_the_closed_form_less_half_a_group(S, rho):
    # Rollout-bound, batches are cut at group arrivals: a sample's own group arrives at one of
    # B/S positions in its batch, uniformly, so the takes strictly before it number
    # C M_tail / B - S / (2B) on average, not C M_tail / B (our correction; see docs/queue.md)
    s = run_summary(scenario(LIGHT, rho, S=S))
    m = analytic.m_tail(make_duration(LIGHT), S)
    expected = queue_drop_mean_staleness(rho, 128, 128, m, 2) - S / (2 * 128)
    assert s["mean_staleness"] == pytest.approx(expected, abs=0.012)
    assert s["rho"] == pytest.approx(rho, rel=0.01)
    assert s["m_tail"] == pytest.approx(m, rel=0.01)
    assert s["trainer_idle_fraction"] == pytest.approx(1 - rho, abs=0.01)
    assert s["rollout_idle_fraction"] == 0.0 and s["samples_dropped"] == 0


@pytest.mark.parametrize("q", [1, 2, 4])
def test_trainer_bound_heavy_tail_staleness_is_the_closed_form(q):
    # trainer-bound, far from rho = 1, a heavy tail (so sample starts are spread uniformly
    # over the step phase): within 3 %
    s = run_summary(scenario(HEAVY, 2.0, q=q, updates=500))
    m = analytic.m_tail(make_duration(HEAVY), 8)
    expected = queue_drop_mean_staleness(2.0, 128, 128, m, q)
    assert s["mean_staleness"] == pytest.approx(expected, rel=0.03)
    assert s["trainer_idle_fraction"] < 0.01 and s["rollout_idle_fraction"] == 0.0
    # about half of what is generated is dropped at rho = 2
    assert s["samples_dropped"] / s["samples_generated"] == pytest.approx(0.5, abs=0.02)


# -- queue-max against queue-drop: which lengths the trainer sees ---------------------------------


def test_queue_max_biases_the_used_samples_towards_short_ones_queue_drop_does_not():
    drop = run_summary(scenario(HEAVY, 1.5, q=2, updates=400))
    qmax = run_summary(
        scenario(HEAVY, 1.5, updates=400, capacity=None, rule="max_staleness", max_staleness=2)
    )
    for s in (drop, qmax):  # generated lengths are the model's: mean 1
        assert s["mean_generated_duration"] == pytest.approx(1.0, rel=0.03)
    assert drop["mean_consumed_duration"] / drop["mean_generated_duration"] == pytest.approx(
        1.0, abs=0.02
    )
    assert qmax["mean_consumed_duration"] / qmax["mean_generated_duration"] < 0.85
    assert qmax["max_lag"] <= 2 < drop["max_lag"]
