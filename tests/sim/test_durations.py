"""Duration models: moments against closed forms, caps, determinism, makespans, specs."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pandas as pd
import pytest
from pydantic import TypeAdapter, ValidationError
from scipy import integrate, stats

from staleness_sim.durations import (
    DirectJob,
    DurationSpec,
    EpisodicJob,
    LognormalSpec,
    make_duration,
    makespan,
)

N = 200_000
ADAPTER = TypeAdapter(DurationSpec)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def assert_mean_close(x: np.ndarray, mean: float, sd: float, k: float = 5.0) -> None:
    """Sample mean within k standard errors of the theoretical mean."""
    se = sd / math.sqrt(x.size)
    assert abs(x.mean() - mean) < k * se, (x.mean(), mean, se)


# (spec, theoretical mean, theoretical sd), all from textbook formulas
G = math.gamma
MOMENTS = [
    ({"dist": "exponential", "mean": 3.0}, 3.0, 3.0),
    (
        {"dist": "lognormal", "median": 40.0, "sigma": 0.8},
        40 * math.exp(0.32),
        40 * math.exp(0.32) * math.sqrt(math.expm1(0.64)),
    ),
    ({"dist": "lognormal", "mean": 10.0, "cv": 0.5}, 10.0, 5.0),
    ({"dist": "gamma", "mean": 10.0, "cv": 0.7}, 10.0, 7.0),
    (
        {"dist": "weibull", "shape": 1.5, "scale": 10.0},
        10 * G(1 + 1 / 1.5),
        10 * math.sqrt(G(1 + 2 / 1.5) - G(1 + 1 / 1.5) ** 2),
    ),
    (
        {"dist": "lomax", "shape": 4.5, "scale": 6.0},
        6.0 / 3.5,
        math.sqrt(36.0 * 4.5 / (3.5**2 * 2.5)),
    ),
]


@pytest.mark.parametrize(("spec", "mean", "sd"), MOMENTS, ids=lambda v: str(v)[:40])
def test_sample_mean_matches_closed_form(spec: dict, mean: float, sd: float) -> None:
    model = make_duration(spec)
    x = model.sample(rng(1), N)
    assert x.dtype == np.float64 and x.shape == (N,)
    assert np.all(x >= 0)
    assert_mean_close(x, mean, sd)
    assert model.mean() == pytest.approx(mean, rel=1e-12)


def test_lognormal_mean_cv_round_trips() -> None:
    x = make_duration({"dist": "lognormal", "mean": 10.0, "cv": 0.5}).sample(rng(2), N)
    assert x.std() / x.mean() == pytest.approx(0.5, rel=0.03)
    # median of that lognormal: mean / sqrt(1 + cv^2)
    assert np.median(x) == pytest.approx(10 / math.sqrt(1.25), rel=0.01)


def test_gamma_mean_cv_round_trips() -> None:
    x = make_duration({"dist": "gamma", "mean": 10.0, "cv": 0.7}).sample(rng(3), N)
    assert x.std() / x.mean() == pytest.approx(0.7, rel=0.02)


def test_constant() -> None:
    model = make_duration({"dist": "constant", "value": 7.0})
    assert np.all(model.sample(rng(), 10) == 7.0)
    assert model.mean() == 7.0
    np.testing.assert_array_equal(model.cdf(np.array([6.9, 7.0, 8.0])), [0.0, 1.0, 1.0])


# scipy.stats laws equal to the specs above, for independent CDFs and capped means
SCIPY_LAWS = [
    ({"dist": "exponential", "mean": 3.0}, stats.expon(scale=3.0)),
    ({"dist": "lognormal", "median": 40.0, "sigma": 0.8}, stats.lognorm(0.8, scale=40.0)),
    ({"dist": "gamma", "mean": 10.0, "cv": 0.5}, stats.gamma(4.0, scale=2.5)),
    ({"dist": "weibull", "shape": 0.7, "scale": 10.0}, stats.weibull_min(0.7, scale=10.0)),
    ({"dist": "lomax", "shape": 0.8, "scale": 5.0}, stats.lomax(0.8, scale=5.0)),
    ({"dist": "lomax", "shape": 1.0, "scale": 5.0}, stats.lomax(1.0, scale=5.0)),
    ({"dist": "lomax", "shape": 2.5, "scale": 5.0}, stats.lomax(2.5, scale=5.0)),
]


@pytest.mark.parametrize(("spec", "law"), SCIPY_LAWS, ids=lambda v: str(v)[:40])
def test_capped_mean_cdf_and_samples(spec: dict, law: stats.rv_continuous) -> None:
    cap = float(law.ppf(0.8))  # a cap that binds for a fifth of the draws
    model = make_duration({**spec, "cap": cap})
    expected, _ = integrate.quad(law.sf, 0, cap, limit=200)  # E[min(X,c)] = int_0^c sf
    assert model.mean() == pytest.approx(expected, rel=1e-7)

    x = model.sample(rng(4), N)
    assert x.max() <= cap
    assert np.mean(x == cap) == pytest.approx(0.2, abs=0.005)
    assert_mean_close(x, expected, x.std())

    grid = np.array([0.0, cap / 10, cap / 2, cap * 0.999, cap, cap * 2])
    want = np.where(grid >= cap, 1.0, law.cdf(grid))
    np.testing.assert_allclose(model.cdf(grid), want, rtol=1e-10, atol=1e-12)


def test_exponential_cap_closed_form() -> None:
    model = make_duration({"dist": "exponential", "mean": 2.0, "cap": 3.0})
    assert model.mean() == pytest.approx(2.0 * (1 - math.exp(-1.5)), rel=1e-14)
    x = model.sample(rng(5), N)
    assert x.max() == 3.0
    assert_mean_close(x, 2.0 * (1 - math.exp(-1.5)), x.std())


def test_heavy_lomax_uncapped_mean_is_infinite() -> None:
    assert make_duration({"dist": "lomax", "shape": 0.9, "scale": 1.0}).mean() == math.inf


ALL_SPECS = [s for s, _, _ in MOMENTS] + [
    {"dist": "constant", "value": 2.0},
    {"dist": "empirical", "values": [1.0, 2.0, 5.0]},
    {
        "dist": "mixture",
        "components": [
            {"weight": 1, "dist": "exponential", "mean": 1.0},
            {"weight": 2, "dist": "lognormal", "median": 3.0, "sigma": 1.0, "cap": 9.0},
        ],
    },
]


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s["dist"])
def test_same_seed_same_samples(spec: dict) -> None:
    model = make_duration(spec)
    a, b = model.sample(rng(11), 1000), model.sample(rng(11), 1000)
    np.testing.assert_array_equal(a, b)
    if spec["dist"] != "constant":
        assert not np.array_equal(a, model.sample(rng(12), 1000))
    assert isinstance(model.describe(), str) and spec["dist"] in model.describe()


def test_episodic_job_deterministic() -> None:
    job = EpisodicJob(make_duration({"dist": "exponential", "mean": 1.0}), 20, 4)
    np.testing.assert_array_equal(job.sample(rng(1), 50), job.sample(rng(1), 50))
    assert not np.array_equal(job.sample(rng(1), 50), job.sample(rng(2), 50))


# ------------------------------------------------------------------------- makespans


def heap_makespan(durations: np.ndarray, sessions: int) -> float:
    """Reference: one job simulated event by event with a heap of session free times."""
    free = [0.0] * sessions
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


@pytest.mark.parametrize(("episodes", "sessions"), [(256, 32), (37, 5), (10, 1), (8, 8), (3, 7)])
def test_makespan_equals_heap_simulation(episodes: int, sessions: int) -> None:
    r = rng(episodes * 100 + sessions)
    cont = r.lognormal(0.0, 1.0, (200, episodes))
    tied = r.integers(1, 4, (200, episodes)).astype(float)  # many simultaneous frees
    for d in (cont, tied):
        want = np.array([heap_makespan(row, sessions) for row in d])
        np.testing.assert_array_equal(makespan(d, sessions), want)
        for rows in (1, 3, 8, 9):  # small batches take a per-job path
            np.testing.assert_array_equal(makespan(d[:rows], sessions), want[:rows])


def test_makespan_of_many_jobs_spans_several_lockstep_slices() -> None:
    d = rng(11).lognormal(0.0, 1.0, (5000, 40))  # more jobs than one cache-sized slice
    got = makespan(d, 6)
    picks = [0, 2047, 2048, 4095, 4096, 4999]  # either side of each slice boundary
    np.testing.assert_array_equal(got[picks], [heap_makespan(d[i], 6) for i in picks])


def test_episodic_job_is_makespan_of_its_draws() -> None:
    episode = make_duration({"dist": "lognormal", "median": 40.0, "sigma": 1.0, "cap": 300.0})
    job = EpisodicJob(episode, episodes=64, concurrency=8)
    got = job.sample(rng(7), 100)
    # documented layout: episode j of job i is draw j * n_jobs + i
    draws = episode.sample(rng(7), 64 * 100).reshape(64, 100).T
    np.testing.assert_array_equal(got, [heap_makespan(row, 8) for row in draws])


@pytest.mark.parametrize(("episodes", "sessions"), [(256, 32), (250, 32), (33, 32), (5, 2)])
def test_constant_episodes_makespan(episodes: int, sessions: int) -> None:
    job = EpisodicJob(make_duration({"dist": "constant", "value": 2.5}), episodes, sessions)
    np.testing.assert_array_equal(job.sample(rng(), 10), math.ceil(episodes / sessions) * 2.5)


def test_more_sessions_than_episodes_is_max() -> None:
    d = rng(3).exponential(1.0, (50, 6))
    np.testing.assert_array_equal(makespan(d, 6), d.max(axis=1))
    np.testing.assert_array_equal(makespan(d, 100), d.max(axis=1))


def test_direct_job_and_describe() -> None:
    model = make_duration({"dist": "gamma", "mean": 5.0, "cv": 1.0})
    job = DirectJob(model)
    np.testing.assert_array_equal(job.sample(rng(1), 10), model.sample(rng(1), 10))
    assert "gamma" in job.describe()
    ep = EpisodicJob(model, 256, 32)
    assert "256" in ep.describe() and "32" in ep.describe() and "gamma" in ep.describe()


def test_episodic_job_rejects_bad_counts() -> None:
    model = make_duration({"dist": "constant", "value": 1.0})
    with pytest.raises(ValueError, match="episodes and concurrency"):
        EpisodicJob(model, 0, 4)
    with pytest.raises(ValueError, match="episodes and concurrency"):
        EpisodicJob(model, 4, 0)


# --------------------------------------------------------------------------- mixture


def test_mixture_weights_respected() -> None:
    spec = {
        "dist": "mixture",
        "components": [
            {"weight": 3.0, "dist": "constant", "value": 1.0},
            {"weight": 1.0, "dist": "constant", "value": 5.0},
        ],
    }
    model = make_duration(spec)
    x = model.sample(rng(8), N)
    assert set(np.unique(x)) == {1.0, 5.0}
    assert abs(np.mean(x == 1.0) - 0.75) < 5 * math.sqrt(0.75 * 0.25 / N)
    assert model.mean() == pytest.approx(0.75 * 1 + 0.25 * 5)
    np.testing.assert_allclose(model.cdf(np.array([0.5, 1.0, 4.9, 5.0])), [0, 0.75, 0.75, 1.0])


def test_mixture_caps_compose() -> None:
    spec = {
        "dist": "mixture",
        "cap": 4.0,
        "components": [
            {"weight": 1.0, "dist": "exponential", "mean": 2.0, "cap": 3.0},
            {"weight": 1.0, "dist": "exponential", "mean": 2.0},
        ],
    }
    model = make_duration(spec)
    # closed form: E[min(X, c)] = m (1 - exp(-c/m)) with c = 3 and c = 4
    want = 0.5 * 2 * (1 - math.exp(-1.5)) + 0.5 * 2 * (1 - math.exp(-2.0))
    assert model.mean() == pytest.approx(want, rel=1e-12)
    x = model.sample(rng(9), N)
    assert x.max() <= 4.0
    assert_mean_close(x, want, x.std())


# ------------------------------------------------------------------------- empirical


def test_empirical_from_values() -> None:
    values = [1.0, 2.0, 4.0, 8.0]
    model = make_duration({"dist": "empirical", "values": values})
    x = model.sample(rng(10), N)
    assert set(np.unique(x)) == set(values)
    assert_mean_close(x, np.mean(values), np.std(values))
    assert model.mean() == pytest.approx(3.75)
    np.testing.assert_allclose(model.cdf(np.array([0.5, 2.0, 3.0, 8.0])), [0, 0.5, 0.5, 1.0])
    capped = make_duration({"dist": "empirical", "values": values, "cap": 3.0})
    assert capped.mean() == pytest.approx((1 + 2 + 3 + 3) / 4)


def test_empirical_from_csv_and_parquet(tmp_path) -> None:
    frame = pd.DataFrame({"task": ["a", "b", "c"], "seconds": [10.0, 20.0, 60.0]})
    csv = tmp_path / "trace.csv"
    frame.to_csv(csv, index=False)
    model = make_duration({"dist": "empirical", "path": str(csv)})  # only numeric column
    assert model.mean() == pytest.approx(30.0)

    pq = tmp_path / "trace.parquet"
    frame.assign(other=[1.0, 2.0, None]).to_parquet(pq)
    model = make_duration({"dist": "empirical", "path": str(pq), "column": "other"})
    assert set(np.unique(model.sample(rng(), 100))) == {1.0, 2.0}  # null dropped
    with pytest.raises(ValidationError, match=r"seconds.*other|numeric columns"):
        ADAPTER.validate_python({"dist": "empirical", "path": str(pq)})


def test_empirical_file_errors(tmp_path) -> None:
    csv = tmp_path / "trace.csv"
    pd.DataFrame({"seconds": [1.0, 2.0]}).to_csv(csv, index=False)
    with pytest.raises(ValidationError, match="file not found"):
        ADAPTER.validate_python({"dist": "empirical", "path": str(tmp_path / "nope.csv")})
    with pytest.raises(ValidationError, match=r"column 'secs' not in.*seconds"):
        ADAPTER.validate_python({"dist": "empirical", "path": str(csv), "column": "secs"})
    txt = tmp_path / "trace.txt"
    txt.write_text("1\n2\n")
    with pytest.raises(ValidationError, match="unsupported file type"):
        ADAPTER.validate_python({"dist": "empirical", "path": str(txt)})


# ---------------------------------------------------------------------------- specs


BAD_SPECS = {
    "unknown dist": {"dist": "cauchy", "scale": 1.0},
    "missing dist": {"mean": 1.0},
    "missing parameter": {"dist": "exponential"},
    "negative mean": {"dist": "exponential", "mean": -1.0},
    "zero sigma": {"dist": "lognormal", "median": 1.0, "sigma": 0.0},
    "infinite mean": {"dist": "gamma", "mean": float("inf"), "cv": 1.0},
    "nan scale": {"dist": "weibull", "shape": 1.0, "scale": float("nan")},
    "both lognormal pairs": {"dist": "lognormal", "median": 1, "sigma": 1, "mean": 2, "cv": 1},
    "mixed lognormal pair": {"dist": "lognormal", "median": 1.0, "cv": 1.0},
    "half lognormal pair": {"dist": "lognormal", "median": 1.0},
    "extra key": {"dist": "gamma", "mean": 1.0, "cv": 1.0, "shape": 2.0},
    "negative cap": {"dist": "exponential", "mean": 1.0, "cap": -5.0},
    "lomax no scale": {"dist": "lomax", "shape": 2.0},
    "negative constant": {"dist": "constant", "value": -1.0},
    "empirical neither": {"dist": "empirical"},
    "empirical both": {"dist": "empirical", "values": [1.0], "path": "x.csv"},
    "empirical empty": {"dist": "empirical", "values": []},
    "empirical negative": {"dist": "empirical", "values": [1.0, -2.0]},
    "mixture no weight": {"dist": "mixture", "components": [{"dist": "constant", "value": 1}]},
    "mixture zero weight": {
        "dist": "mixture",
        "components": [{"dist": "constant", "value": 1, "weight": 0}],
    },
    "mixture empty": {"dist": "mixture", "components": []},
    "mixture bad component": {
        "dist": "mixture",
        "components": [{"dist": "exponential", "mean": -1, "weight": 1}],
    },
}


@pytest.mark.parametrize("spec", BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_bad_spec_raises_validation_error(spec: dict) -> None:
    with pytest.raises(ValidationError):
        ADAPTER.validate_python(spec)
    with pytest.raises(ValidationError):
        make_duration(spec)


def test_error_messages_name_the_allowed_choices() -> None:
    with pytest.raises(ValidationError) as info:
        ADAPTER.validate_python({"dist": "cauchy"})
    for name in ("exponential", "lognormal", "gamma", "weibull", "lomax", "constant", "mixture"):
        assert name in str(info.value)
    with pytest.raises(ValidationError, match=r"\(median, sigma\) or \(mean, cv\)"):
        ADAPTER.validate_python({"dist": "lognormal", "median": 1, "sigma": 1, "mean": 2, "cv": 1})


def test_spec_models_usable_directly() -> None:
    spec = LognormalSpec(median=40.0, sigma=1.0, cap=300.0)
    assert ADAPTER.validate_python(spec.model_dump()) == spec
    assert make_duration(spec).mean() == pytest.approx(
        integrate.quad(stats.lognorm(1.0, scale=40.0).sf, 0, 300.0)[0], rel=1e-7
    )
