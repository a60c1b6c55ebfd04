"""Maximum-likelihood fitting of duration families to measured durations.

``fit_durations(values)`` fits every candidate family with the location fixed at 0,
ranks them by AIC (default) or BIC, and returns the winner as a spec of
``staleness_sim.durations`` that can be dropped into a config file unchanged.

``censored`` marks values that are lower bounds, not durations (an episode cut by its
timeout, a job holding such an episode): they enter the likelihood through the survival
function, log S(x), instead of the density, so a timeout does not pull the fitted law
towards the cap. Without censored values the fits are exactly the plain ones.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from staleness_sim.durations import (
    ExponentialSpec,
    GammaSpec,
    LognormalSpec,
    LomaxSpec,
    WeibullSpec,
)

__all__ = ["FAMILIES", "FitResult", "fit_durations", "kaplan_meier"]

FAMILIES = ("exponential", "lognormal", "gamma", "weibull", "lomax")
CRITERIA = ("aic", "bic")


@dataclass(frozen=True)
class _Fit:
    frozen: Any  # scipy frozen distribution, used for loglik, KS and plots
    spec: Any  # the family's spec in this project's parameterisation
    params: dict[str, float]


def _fit_exponential(x: np.ndarray) -> _Fit:
    mean = float(x.mean())  # closed-form MLE
    return _Fit(stats.expon(scale=mean), ExponentialSpec(mean=mean), {"mean": mean})


def _fit_lognormal(x: np.ndarray) -> _Fit:
    logs = np.log(x)
    mu, sigma = float(logs.mean()), float(logs.std())  # closed-form MLE (ddof=0)
    spec = LognormalSpec(median=math.exp(mu), sigma=sigma)
    return _Fit(
        stats.lognorm(sigma, scale=math.exp(mu)), spec, {"median": math.exp(mu), "sigma": sigma}
    )


def _fit_gamma(x: np.ndarray) -> _Fit:
    a, _, scale = stats.gamma.fit(x, floc=0)
    mean, cv = a * scale, 1 / math.sqrt(a)
    return _Fit(stats.gamma(a, scale=scale), GammaSpec(mean=mean, cv=cv), {"mean": mean, "cv": cv})


def _fit_weibull(x: np.ndarray) -> _Fit:
    k, _, scale = stats.weibull_min.fit(x, floc=0)
    spec = WeibullSpec(shape=k, scale=scale)
    return _Fit(stats.weibull_min(k, scale=scale), spec, {"shape": k, "scale": scale})


def _fit_lomax(x: np.ndarray) -> _Fit:
    # Start from the exponential limit's scale: a light-tailed sample pushes both
    # parameters to infinity (lomax -> exponential), which the optimiser handles from here.
    a, _, scale = stats.lomax.fit(x, 2.0, floc=0, scale=float(x.mean()))
    spec = LomaxSpec(shape=a, scale=scale)
    return _Fit(stats.lomax(a, scale=scale), spec, {"shape": a, "scale": scale})


def _censored_fit(family: str, x: np.ndarray, cens: np.ndarray) -> _Fit:
    """Maximum likelihood with right-censored values (scipy's CensoredData, loc fixed at 0)."""
    if family == "exponential":
        mean = float(x.sum() / (~cens).sum())  # closed form: total time / observed events
        return _Fit(stats.expon(scale=mean), ExponentialSpec(mean=mean), {"mean": mean})
    data = stats.CensoredData(uncensored=x[~cens], right=x[cens])
    if family == "lognormal":
        sigma, _, scale = stats.lognorm.fit(data, floc=0)
        spec = LognormalSpec(median=float(scale), sigma=float(sigma))
        return _Fit(
            stats.lognorm(sigma, scale=scale),
            spec,
            {"median": float(scale), "sigma": float(sigma)},
        )
    if family == "gamma":
        a, _, scale = stats.gamma.fit(data, floc=0)
        mean, cv = float(a * scale), float(1 / math.sqrt(a))
        return _Fit(
            stats.gamma(a, scale=scale), GammaSpec(mean=mean, cv=cv), {"mean": mean, "cv": cv}
        )
    if family == "weibull":
        k, _, scale = stats.weibull_min.fit(data, floc=0)
        spec = WeibullSpec(shape=float(k), scale=float(scale))
        return _Fit(
            stats.weibull_min(k, scale=scale), spec, {"shape": float(k), "scale": float(scale)}
        )
    a, _, scale = stats.lomax.fit(data, 2.0, floc=0, scale=float(x.mean()))
    spec = LomaxSpec(shape=float(a), scale=float(scale))
    return _Fit(stats.lomax(a, scale=scale), spec, {"shape": float(a), "scale": float(scale)})


def kaplan_meier(values: np.ndarray, censored: np.ndarray | None = None):
    """The Kaplan-Meier estimate of the CDF: (distinct observed durations, F at each).

    Without censored values it is the empirical CDF. Censored values (lower bounds) leave
    the risk set without a step, so F stays below 1 when the longest value is censored.
    """
    x = np.asarray(values, dtype=np.float64)
    cens = np.zeros(x.size, bool) if censored is None else np.asarray(censored, bool)
    times = np.unique(x[~cens])
    at_risk = np.array([(x >= t).sum() for t in times], dtype=np.float64)
    events = np.array([((x == t) & ~cens).sum() for t in times], dtype=np.float64)
    survival = np.cumprod(1.0 - events / at_risk)
    return times, 1.0 - survival


_FITTERS: dict[str, Callable[[np.ndarray], _Fit]] = {
    "exponential": _fit_exponential,
    "lognormal": _fit_lognormal,
    "gamma": _fit_gamma,
    "weibull": _fit_weibull,
    "lomax": _fit_lomax,
}
_COLUMNS = ["family", "params", "loglik", "aic", "bic", "ks_stat", "ks_pvalue"]
_N_PARAMS = {"exponential": 1, "lognormal": 2, "gamma": 2, "weibull": 2, "lomax": 2}


@dataclass
class FitResult:
    """Fits of every family; ``best`` is the winner's spec, ``table`` ranks them all.

    ``ks_pvalue`` uses parameters estimated from the same data, so it is optimistic
    (too large); read it as a ranking aid, not as a calibrated test. With censored values
    ``ks_stat`` is the largest distance to the Kaplan-Meier curve and ``ks_pvalue`` is NaN.
    """

    best: Any
    table: pd.DataFrame
    criterion: str
    values: np.ndarray = field(repr=False)
    fits: dict[str, _Fit] = field(repr=False)
    censored: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_censored(self) -> int:
        return 0 if self.censored is None else int(self.censored.sum())

    @property
    def best_family(self) -> str:
        return str(self.table["family"].iloc[0])

    def plot(self, path: str | Path) -> Path:
        """Write a goodness-of-fit figure: ECDF vs fitted CDFs, and a QQ panel of the best."""
        from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas

        path = Path(path)
        x = np.sort(self.values)
        n = x.size
        fig = Figure(figsize=(11, 4.5))
        ax_cdf, ax_qq = fig.subplots(1, 2)
        if self.n_censored:
            times, km = kaplan_meier(self.values, self.censored)
            label = f"data (Kaplan-Meier, {self.n_censored} censored)"
            ax_cdf.step(times, km, where="post", color="black", lw=1.5, label=label)
        else:
            ax_cdf.step(
                x, np.arange(1, n + 1) / n, where="post", color="black", lw=1.5, label="data"
            )
        grid = np.geomspace(x[0], x[-1], 400) if x[0] > 0 else np.linspace(x[0], x[-1], 400)
        for family in (f for f in self.table["family"] if f in self.fits):
            lw = 2.2 if family == self.best_family else 1.0
            ax_cdf.plot(grid, self.fits[family].frozen.cdf(grid), lw=lw, label=family)
        ax_cdf.set_xscale("log")
        ax_cdf.set(xlabel="duration", ylabel="CDF", title=f"ECDF vs fits (n={n})")
        ax_cdf.legend(fontsize=8)

        if self.n_censored:  # quantiles of the observed (uncensored) durations, at KM levels
            x, levels = kaplan_meier(self.values, self.censored)
            levels = np.clip(levels - 0.5 / n, 0.5 / n, 1 - 0.5 / n)
        else:
            levels = (np.arange(1, n + 1) - 0.5) / n
        q = self.fits[self.best_family].frozen.ppf(levels)
        ax_qq.scatter(q, x, s=6, alpha=0.6)
        lo, hi = min(q[0], x[0]), max(q[-1], x[-1])
        ax_qq.plot([lo, hi], [lo, hi], color="grey", ls="--", lw=1)
        ax_qq.set_xscale("log")
        ax_qq.set_yscale("log")
        ax_qq.set(
            xlabel=f"{self.best_family} quantile",
            ylabel="data quantile",
            title=f"QQ, best by {self.criterion.upper()}: {self.best_family}",
        )
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        return path


def _validated_censored(censored: Any, x: np.ndarray) -> np.ndarray | None:
    if censored is None:
        return None
    cens = np.asarray(censored).ravel()
    if cens.size != x.size:
        raise ValueError(f"censored has {cens.size} flags for {x.size} durations")
    cens = cens.astype(bool)
    if cens.all():
        raise ValueError("every duration is censored (a lower bound): nothing to fit")
    if (~cens).sum() < 2:
        raise ValueError("need at least 2 uncensored durations to fit")
    return cens if cens.any() else None


def _validated(values: Sequence[float] | np.ndarray) -> np.ndarray:
    try:
        x = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"durations must be numbers: {exc}") from exc
    if x.size < 2:
        raise ValueError(f"need at least 2 durations to fit, got {x.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError("durations must be finite (found NaN or inf)")
    if np.any(x <= 0):
        raise ValueError(f"durations must be > 0 for these families (min is {x.min():g})")
    if np.all(x == x[0]):
        raise ValueError("all durations are equal: use a constant duration instead of a fit")
    return x


def fit_durations(
    values: Sequence[float] | np.ndarray,
    families: Sequence[str] = FAMILIES,
    criterion: str = "aic",
    censored: Sequence[bool] | np.ndarray | None = None,
) -> FitResult:
    """Fit each family by maximum likelihood (loc fixed at 0) and rank by ``criterion``.

    AIC is the default because the fitted law is used to *predict* durations in
    simulation: AIC estimates the out-of-sample (Kullback-Leibler) loss, whereas BIC aims
    at identifying a "true" family, which none of these is for real traces. BIC's heavier
    penalty also tends to pick the one-parameter exponential on small samples, which
    understates the tail that drives makespans and staleness. With one- and two-parameter
    families only, the two criteria differ only when the exponential is a contender.
    """
    x = _validated(values)
    cens = _validated_censored(censored, x)
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}; allowed: {', '.join(CRITERIA)}")
    families = list(dict.fromkeys(families))  # drop duplicates, keep order
    unknown = [f for f in families if f not in _FITTERS]
    if unknown or not families:
        raise ValueError(f"unknown families {unknown}; allowed: {', '.join(FAMILIES)}")

    n = x.size
    fits: dict[str, _Fit] = {}
    rows = []
    for family in families:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # optimiser probing bad regions
                if cens is None:
                    fit = _FITTERS[family](x)
                    loglik = float(np.sum(fit.frozen.logpdf(x)))
                else:  # censored values contribute log S(x), observed ones log f(x)
                    fit = _censored_fit(family, x, cens)
                    loglik = float(
                        np.sum(fit.frozen.logpdf(x[~cens])) + np.sum(fit.frozen.logsf(x[cens]))
                    )
            if not math.isfinite(loglik):
                raise ValueError("non-finite log-likelihood")
        except (ValueError, RuntimeError, FloatingPointError) as exc:
            # A family the optimiser cannot fit stays in the table, ranked last.
            rows.append({"family": family, "params": {"error": str(exc).splitlines()[0]}})
            continue
        k = _N_PARAMS[family]
        if cens is None:
            ks = stats.kstest(x, fit.frozen.cdf)
            ks_stat, ks_p = float(ks.statistic), float(ks.pvalue)
        else:
            times, km = kaplan_meier(x, cens)
            ks_stat, ks_p = float(np.max(np.abs(km - fit.frozen.cdf(times)))), math.nan
        fits[family] = fit
        rows.append(
            {
                "family": family,
                "params": fit.params,
                "loglik": loglik,
                "aic": 2 * k - 2 * loglik,
                "bic": k * math.log(n) - 2 * loglik,
                "ks_stat": ks_stat,
                "ks_pvalue": ks_p,
            }
        )
    if not fits:
        raise ValueError(f"no family could be fitted: {[r['params'] for r in rows]}")
    table = pd.DataFrame(rows, columns=_COLUMNS)
    table = table.sort_values(criterion, kind="stable", na_position="last").reset_index(drop=True)
    best = fits[table["family"].iloc[0]].spec
    return FitResult(
        best=best, table=table, criterion=criterion, values=x, fits=fits, censored=cens
    )
