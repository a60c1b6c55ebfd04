"""The simulator against closed forms. Expected values are computed here from theory."""

import math

import pytest
from scipy import integrate, stats

from staleness_sim import simulate, summarize
from staleness_sim.core.analytic import async_mean_lag, expected_max, harmonic
from staleness_sim.durations import make_duration


def results_per_second(trace):
    s = summarize(trace)
    return s["results_per_hour"] / 3600


def test_harmonic_and_expected_max_against_independent_values():
    assert harmonic(4) == pytest.approx(1 + 1 / 2 + 1 / 3 + 1 / 4)
    # exponential: E[max of n] = mean * H_n
    assert expected_max(make_duration({"dist": "exponential", "mean": 2.0}), 30) == pytest.approx(
        2.0 * sum(1 / k for k in range(1, 31)), rel=1e-8
    )
    # uniform-like check through scipy on a gamma: integral of 1 - F^n
    g = stats.gamma(a=4.0, scale=0.5)
    ref, _ = integrate.quad(lambda x: 1 - g.cdf(x) ** 10, 0, math.inf)
    model = make_duration({"dist": "gamma", "mean": 2.0, "cv": 0.5})
    assert expected_max(model, 10) == pytest.approx(ref, rel=1e-6)


def test_sync_throughput_matches_the_harmonic_closed_form(make_scenario):
    # G = N = 30, exponential jobs of mean 1, update 0.2 s: N / (H_N + u) results per second
    n, u = 30, 0.2
    trace = simulate(
        make_scenario(workers=n, cohort=n, updates=3000, update_seconds=u, policy={"kind": "sync"})
    )
    expected = n / (sum(1 / k for k in range(1, n + 1)) + u)
    assert results_per_second(trace) == pytest.approx(expected, rel=0.02)


def test_sync_throughput_for_a_lognormal_uses_the_numerical_integral(make_scenario):
    n = 10
    spec = {"dist": "lognormal", "median": 1.0, "sigma": 0.8}
    trace = simulate(
        make_scenario(
            workers=n, cohort=n, updates=3000, policy={"kind": "sync"}, **{"job.duration": spec}
        )
    )
    ln = stats.lognorm(s=0.8, scale=1.0)
    e_max, _ = integrate.quad(lambda x: 1 - ln.cdf(x) ** n, 0, math.inf)
    assert results_per_second(trace) == pytest.approx(n / e_max, rel=0.02)


@pytest.mark.parametrize(
    "spec, mean",
    [
        ({"dist": "exponential", "mean": 1.0}, 1.0),
        ({"dist": "gamma", "mean": 3.0, "cv": 2.0}, 3.0),
    ],
)
def test_async_throughput_is_workers_over_mean_duration(make_scenario, spec, mean):
    g = 4
    trace = simulate(make_scenario(workers=g, cohort=30, updates=4000, **{"job.duration": spec}))
    assert results_per_second(trace) == pytest.approx(g / mean, rel=0.01)


@pytest.mark.parametrize("g, n", [(8, 4), (16, 8), (4, 30)])
def test_mean_lag_of_uncapped_asynchrony_is_g_minus_one_over_n(make_scenario, g, n):
    spec = {"dist": "lomax", "shape": 2.5, "scale": 1.5}  # any distribution will do
    trace = simulate(make_scenario(workers=g, cohort=n, updates=4000, **{"job.duration": spec}))
    assert summarize(trace)["mean_lag"] == pytest.approx((g - 1) / n, rel=0.02)
    assert async_mean_lag(g, n) == (g - 1) / n
