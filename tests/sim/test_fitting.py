"""Maximum-likelihood fitting: parameter recovery, ranking, figure, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import TypeAdapter

from staleness_sim.durations import DurationSpec, make_duration
from staleness_sim.validation.fitting import fit_durations

COLUMNS = ["family", "params", "loglik", "aic", "bic", "ks_stat", "ks_pvalue"]


@pytest.fixture(scope="module")
def gamma_draws() -> np.ndarray:
    # gamma with mean 40 and cv 0.5: shape 1/cv^2 = 4, scale mean*cv^2 = 10
    return np.random.default_rng(21).gamma(4.0, 10.0, 20_000)


def test_recovers_gamma(gamma_draws: np.ndarray) -> None:
    result = fit_durations(gamma_draws)
    assert result.best.dist == "gamma"
    assert result.best.mean == pytest.approx(40.0, rel=0.02)
    assert result.best.cv == pytest.approx(0.5, rel=0.03)
    assert list(result.table.columns) == COLUMNS
    assert result.table["aic"].is_monotonic_increasing
    assert set(result.table["family"]) == {"exponential", "lognormal", "gamma", "weibull", "lomax"}


def test_recovers_lognormal() -> None:
    x = np.random.default_rng(22).lognormal(math.log(40.0), 1.0, 20_000)
    result = fit_durations(x, criterion="bic")
    assert result.best.dist == "lognormal"
    assert result.best.median == pytest.approx(40.0, rel=0.03)
    assert result.best.sigma == pytest.approx(1.0, rel=0.02)
    assert result.table["bic"].is_monotonic_increasing


def test_recovers_lomax_and_weibull() -> None:
    r = np.random.default_rng(23)
    lomax = fit_durations(5.0 * r.pareto(2.5, 20_000))
    assert lomax.best.dist == "lomax"
    assert lomax.best.shape == pytest.approx(2.5, rel=0.1)
    weibull = fit_durations(10.0 * r.weibull(0.7, 20_000))
    assert weibull.best.dist == "weibull"
    assert weibull.best.shape == pytest.approx(0.7, rel=0.03)
    assert weibull.best.scale == pytest.approx(10.0, rel=0.03)


def test_information_criteria_from_loglik(gamma_draws: np.ndarray) -> None:
    table = fit_durations(gamma_draws).table.set_index("family")
    n = gamma_draws.size
    for family, k in [("exponential", 1), ("gamma", 2)]:
        row = table.loc[family]
        assert row["aic"] == pytest.approx(2 * k - 2 * row["loglik"])
        assert row["bic"] == pytest.approx(k * math.log(n) - 2 * row["loglik"])
    # exponential MLE is the sample mean; its loglik is -n (log mean + 1)
    mean = gamma_draws.mean()
    assert table.loc["exponential", "loglik"] == pytest.approx(-n * (math.log(mean) + 1))


def test_best_spec_drops_into_config(gamma_draws: np.ndarray) -> None:
    result = fit_durations(gamma_draws, families=("exponential", "gamma"))
    spec = TypeAdapter(DurationSpec).validate_python(result.best.model_dump(exclude_none=True))
    x = make_duration(spec).sample(np.random.default_rng(0), 50_000)
    assert x.mean() == pytest.approx(gamma_draws.mean(), rel=0.02)
    assert len(result.table) == 2


def test_plot_writes_png(tmp_path, gamma_draws: np.ndarray) -> None:
    path = tmp_path / "fit.png"
    fit_durations(gamma_draws[:2000]).plot(path)
    data = path.read_bytes()
    assert len(data) > 10_000 and data[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("values", "kwargs", "match"),
    [
        ([1.0], {}, "at least 2"),
        ([], {}, "at least 2"),
        ([1.0, -2.0, 3.0], {}, "> 0"),
        ([1.0, 0.0, 3.0], {}, "> 0"),
        ([1.0, float("nan")], {}, "finite"),
        ([1.0, float("inf")], {}, "finite"),
        (["a", "b"], {}, "numbers"),
        ([2.0, 2.0, 2.0], {}, "constant"),
        ([1.0, 2.0], {"families": ("gamma", "cauchy")}, r"cauchy.*allowed"),
        ([1.0, 2.0], {"families": ()}, "allowed"),
        ([1.0, 2.0], {"criterion": "mle"}, r"criterion.*aic, bic"),
    ],
)
def test_bad_input_raises(values: list, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit_durations(values, **kwargs)


def test_censored_values_are_lower_bounds_not_durations() -> None:
    # lognormal(median 40, sigma 1) cut at a 60 s timeout: about 34 % of the draws are cut.
    # Treated as durations they drag the fit to the cap; as right-censored values the
    # maximum-likelihood fit recovers the generating law (consistent estimator).
    x = np.random.default_rng(24).lognormal(math.log(40.0), 1.0, 20_000)
    cut = x >= 60.0
    assert 0.30 < cut.mean() < 0.38  # P(X > 60) = 1 - Phi(log 1.5) = 0.343
    capped = np.minimum(x, 60.0)
    naive = fit_durations(capped, families=["lognormal"]).best
    censored = fit_durations(capped, families=["lognormal"], censored=cut)
    assert censored.n_censored == int(cut.sum())
    assert censored.best.median == pytest.approx(40.0, rel=0.03)
    assert censored.best.sigma == pytest.approx(1.0, rel=0.03)
    assert naive.sigma < 0.8  # the naive fit understates the spread
    # the exponential's censored MLE: total time over observed events
    expo = fit_durations(capped, families=["exponential"], censored=cut).best
    assert expo.mean == pytest.approx(capped.sum() / (~cut).sum(), rel=1e-9)
