"""Duration models: vectorised samplers built from specs (``make_duration``).

A model samples from a ``numpy.random.Generator`` and knows its exact mean and CDF,
including the effect of an optional ``cap``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from scipy import special, stats

from staleness_sim.durations.specs import (
    _SPEC_ADAPTER,
    ConstantSpec,
    EmpiricalSpec,
    ExponentialSpec,
    GammaSpec,
    LognormalSpec,
    LomaxSpec,
    MixtureSpec,
    WeibullSpec,
    _Spec,
)


class DurationModel(ABC):
    """A duration distribution with an optional cap; subclasses implement the raw law."""

    def __init__(self, cap: float | None = None) -> None:
        self.cap = cap

    @abstractmethod
    def _sample_raw(self, rng: np.random.Generator, size: int) -> np.ndarray: ...

    @abstractmethod
    def _cdf_raw(self, x: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _limited_mean_raw(self, c: float) -> float:
        """E[min(X, c)] of the uncapped law; c may be +inf (then the plain mean)."""

    @abstractmethod
    def _describe_raw(self) -> str: ...

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        x = np.asarray(self._sample_raw(rng, int(size)), dtype=np.float64)
        if self.cap is not None:
            np.minimum(x, self.cap, out=x)
        return x

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        out = np.asarray(self._cdf_raw(x), dtype=np.float64)
        if self.cap is not None:
            out = np.where(x >= self.cap, 1.0, out)
        return out

    def limited_mean(self, c: float) -> float:
        """E[min(Y, c)] where Y is this (capped) duration: the cap composes as a minimum."""
        return self._limited_mean_raw(min(c, math.inf if self.cap is None else self.cap))

    def mean(self) -> float:
        return self.limited_mean(math.inf)

    def describe(self) -> str:
        s = self._describe_raw()
        return s if self.cap is None else f"{s} capped at {self.cap:g}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.describe()}>"


class Exponential(DurationModel):
    def __init__(self, mean: float, cap: float | None = None) -> None:
        super().__init__(cap)
        self.m = mean

    def _sample_raw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.exponential(self.m, size)

    def _cdf_raw(self, x: np.ndarray) -> np.ndarray:
        return -np.expm1(-np.maximum(x, 0.0) / self.m)

    def _limited_mean_raw(self, c: float) -> float:
        return self.m * -math.expm1(-c / self.m)

    def _describe_raw(self) -> str:
        return f"exponential(mean={self.m:g})"


class Lognormal(DurationModel):
    def __init__(self, mu: float, sigma: float, cap: float | None = None) -> None:
        super().__init__(cap)
        self.mu, self.sigma = mu, sigma

    def _sample_raw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        # standard_normal + in-place exp is faster than rng.lognormal for large draws.
        x = rng.standard_normal(size)
        x *= self.sigma
        x += self.mu
        return np.exp(x, out=x)

    def _cdf_raw(self, x: np.ndarray) -> np.ndarray:
        return stats.lognorm.cdf(x, self.sigma, scale=math.exp(self.mu))

    def _limited_mean_raw(self, c: float) -> float:
        mean = math.exp(self.mu + self.sigma**2 / 2)
        if math.isinf(c):
            return mean
        z = (math.log(c) - self.mu) / self.sigma  # partial expectation of a lognormal
        return mean * stats.norm.cdf(z - self.sigma) + c * stats.norm.sf(z)

    def _describe_raw(self) -> str:
        mean = math.exp(self.mu + self.sigma**2 / 2)
        return f"lognormal(median={math.exp(self.mu):g}, sigma={self.sigma:g}; mean={mean:g})"


class Gamma(DurationModel):
    def __init__(self, shape: float, scale: float, cap: float | None = None) -> None:
        super().__init__(cap)
        self.k, self.theta = shape, scale

    def _sample_raw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.gamma(self.k, self.theta, size)

    def _cdf_raw(self, x: np.ndarray) -> np.ndarray:
        return special.gammainc(self.k, np.maximum(x, 0.0) / self.theta)

    def _limited_mean_raw(self, c: float) -> float:
        if math.isinf(c):
            return self.k * self.theta
        z = c / self.theta
        return self.k * self.theta * special.gammainc(self.k + 1, z) + c * special.gammaincc(
            self.k, z
        )

    def _describe_raw(self) -> str:
        return f"gamma(mean={self.k * self.theta:g}, cv={1 / math.sqrt(self.k):g})"


class Weibull(DurationModel):
    def __init__(self, shape: float, scale: float, cap: float | None = None) -> None:
        super().__init__(cap)
        self.k, self.lam = shape, scale

    def _sample_raw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self.lam * rng.weibull(self.k, size)

    def _cdf_raw(self, x: np.ndarray) -> np.ndarray:
        return -np.expm1(-((np.maximum(x, 0.0) / self.lam) ** self.k))

    def _limited_mean_raw(self, c: float) -> float:
        # integral_0^c exp(-(x/lam)^k) dx = lam * Gamma(1 + 1/k) * P(1/k, (c/lam)^k)
        full = self.lam * math.gamma(1 + 1 / self.k)
        return (
            full if math.isinf(c) else full * special.gammainc(1 / self.k, (c / self.lam) ** self.k)
        )

    def _describe_raw(self) -> str:
        return f"weibull(shape={self.k:g}, scale={self.lam:g})"


class Lomax(DurationModel):
    def __init__(self, shape: float, scale: float, cap: float | None = None) -> None:
        super().__init__(cap)
        self.a, self.lam = shape, scale

    def _sample_raw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self.lam * rng.pareto(self.a, size)  # numpy's pareto is Lomax with scale 1

    def _cdf_raw(self, x: np.ndarray) -> np.ndarray:
        return -np.expm1(-self.a * np.log1p(np.maximum(x, 0.0) / self.lam))

    def _limited_mean_raw(self, c: float) -> float:
        if math.isinf(c):
            return self.lam / (self.a - 1) if self.a > 1 else math.inf
        # integral_0^c (1 + x/lam)^-a dx, written with expm1 to stay accurate near a = 1
        log_term = math.log1p(c / self.lam)
        if self.a == 1:
            return self.lam * log_term
        return self.lam * math.expm1((1 - self.a) * log_term) / (1 - self.a)

    def _describe_raw(self) -> str:
        return f"lomax(shape={self.a:g}, scale={self.lam:g})"


class Constant(DurationModel):
    def __init__(self, value: float, cap: float | None = None) -> None:
        super().__init__(cap)
        self.value = value

    def _sample_raw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.full(size, self.value)  # draws nothing: a constant consumes no randomness

    def _cdf_raw(self, x: np.ndarray) -> np.ndarray:
        return (x >= self.value).astype(np.float64)

    def _limited_mean_raw(self, c: float) -> float:
        return min(self.value, c)

    def _describe_raw(self) -> str:
        return f"constant({self.value:g})"


class Empirical(DurationModel):
    def __init__(self, values: np.ndarray, cap: float | None = None) -> None:
        super().__init__(cap)
        self.values = np.sort(np.asarray(values, dtype=np.float64))

    def _sample_raw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self.values[rng.integers(0, self.values.size, size)]

    def _cdf_raw(self, x: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.values, x, side="right") / self.values.size

    def _limited_mean_raw(self, c: float) -> float:
        return float(np.minimum(self.values, c).mean())

    def _describe_raw(self) -> str:
        return f"empirical(n={self.values.size}, mean={self.values.mean():g})"


class Mixture(DurationModel):
    def __init__(
        self, components: list[DurationModel], weights: np.ndarray, cap: float | None = None
    ) -> None:
        super().__init__(cap)
        self.components = components
        self.weights = np.asarray(weights, dtype=np.float64) / np.sum(weights)

    def _sample_raw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        which = np.searchsorted(np.cumsum(self.weights)[:-1], rng.random(size), side="right")
        out = np.empty(size)
        for i, comp in enumerate(self.components):
            mask = which == i
            out[mask] = comp.sample(rng, int(mask.sum()))
        return out

    def _cdf_raw(self, x: np.ndarray) -> np.ndarray:
        return sum(w * c.cdf(x) for w, c in zip(self.weights, self.components, strict=True))

    def _limited_mean_raw(self, c: float) -> float:
        pairs = zip(self.weights, self.components, strict=True)
        return float(sum(w * comp.limited_mean(c) for w, comp in pairs))

    def _describe_raw(self) -> str:
        parts = (
            f"{w:.3g}*{c.describe()}" for w, c in zip(self.weights, self.components, strict=True)
        )
        return f"mixture({' + '.join(parts)})"


def make_duration(spec: Any) -> DurationModel:
    """Build a sampler from a spec (a spec model or a plain dict, validated here)."""
    if isinstance(spec, DurationModel):
        return spec
    if spec is None:  # e.g. a turn-model job (job.turns) asked for one duration law
        raise ValueError("no duration law here: a turn-model job (job.turns) has none")
    if not isinstance(spec, _Spec):
        spec = _SPEC_ADAPTER.validate_python(spec)
    cap = spec.cap
    match spec:
        case ExponentialSpec():
            return Exponential(spec.mean, cap)
        case LognormalSpec():
            return Lognormal(*spec.mu_sigma(), cap=cap)
        case GammaSpec():
            return Gamma(*spec.shape_scale(), cap=cap)
        case WeibullSpec():
            return Weibull(spec.shape, spec.scale, cap)
        case LomaxSpec():
            return Lomax(spec.shape, spec.scale, cap)
        case ConstantSpec():
            return Constant(spec.value, cap)
        case EmpiricalSpec():
            return Empirical(spec.data, cap)
        case MixtureSpec():
            comps = [make_duration(c) for c in spec.components]
            return Mixture(comps, np.array([c.weight for c in spec.components]), cap)
    raise TypeError(f"not a duration spec: {spec!r}")
