"""Duration specs: what a config file holds, validated (pydantic, discriminated by ``dist``).

Every spec may carry a ``cap`` (a timeout: samples are ``min(x, cap)``). An empirical spec
reads its values inline or from a CSV / Parquet column.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, model_validator

Positive = Annotated[float, Field(gt=0)]


class _Spec(BaseModel):
    # inf/nan are never meaningful parameters; reject them at validation time.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    cap: Positive | None = Field(None, description="timeout: samples are min(x, cap)")


class ExponentialSpec(_Spec):
    dist: Literal["exponential"] = "exponential"
    mean: Positive


class LognormalSpec(_Spec):
    """Either ``median`` + ``sigma`` (of log x) or ``mean`` + ``cv``, exactly one pair."""

    dist: Literal["lognormal"] = "lognormal"
    median: Positive | None = None
    sigma: Positive | None = None
    mean: Positive | None = None
    cv: Positive | None = None

    @model_validator(mode="after")
    def _one_pair(self) -> LognormalSpec:
        given = {k for k in ("median", "sigma", "mean", "cv") if getattr(self, k) is not None}
        if given not in ({"median", "sigma"}, {"mean", "cv"}):
            raise ValueError(
                "lognormal takes exactly one parameter pair: (median, sigma) or (mean, cv); "
                f"got {sorted(given) or 'none'}"
            )
        return self

    def mu_sigma(self) -> tuple[float, float]:
        """Parameters of the underlying normal (mean and sd of log x)."""
        if self.median is not None and self.sigma is not None:
            return math.log(self.median), self.sigma
        assert self.mean is not None and self.cv is not None
        s2 = math.log1p(self.cv**2)  # cv^2 = exp(sigma^2) - 1
        return math.log(self.mean) - s2 / 2, math.sqrt(s2)


class GammaSpec(_Spec):
    dist: Literal["gamma"] = "gamma"
    mean: Positive
    cv: Positive

    def shape_scale(self) -> tuple[float, float]:
        return 1.0 / self.cv**2, self.mean * self.cv**2


class WeibullSpec(_Spec):
    dist: Literal["weibull"] = "weibull"
    shape: Positive
    scale: Positive


class LomaxSpec(_Spec):
    """Pareto type II (scipy's ``lomax``): survival (1 + x/scale)^-shape."""

    dist: Literal["lomax"] = "lomax"
    shape: Positive
    scale: Positive


class ConstantSpec(_Spec):
    dist: Literal["constant"] = "constant"
    value: float = Field(ge=0)


class EmpiricalSpec(_Spec):
    """Resample measured durations with replacement, from ``values`` or a CSV/Parquet ``path``.

    With a path, ``column`` defaults to the file's only numeric column. Missing values
    (NaN/null, e.g. unfinished jobs in a trace) are dropped; the rest must be finite and >= 0.
    The file is read once, at validation time, so a bad path is a validation error.
    """

    dist: Literal["empirical"] = "empirical"
    values: list[float] | None = None
    path: Path | None = None
    column: str | None = None
    _data: np.ndarray = PrivateAttr(default_factory=lambda: np.empty(0))

    @model_validator(mode="after")
    def _load(self) -> EmpiricalSpec:
        if (self.values is None) == (self.path is None):
            raise ValueError("empirical takes exactly one of 'values' or 'path'")
        if self.values is not None:
            if self.column is not None:
                raise ValueError("'column' only applies together with 'path'")
            data = np.asarray(self.values, dtype=float)
        else:
            assert self.path is not None
            data = read_column(self.path, self.column)
        data = data[~np.isnan(data)]
        if data.size == 0:
            raise ValueError("empirical needs at least one value")
        if not np.all(np.isfinite(data)) or np.any(data < 0):
            raise ValueError("empirical values must be finite and >= 0")
        self._data = data
        return self

    @property
    def data(self) -> np.ndarray:
        return self._data


def read_column(path: Path, column: str | None) -> np.ndarray:
    import pandas as pd  # only needed for file-backed empirical specs

    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        frame = pd.read_csv(path)
    elif suffix in (".parquet", ".pq"):
        frame = pd.read_parquet(path)
    else:
        raise ValueError(f"unsupported file type {suffix!r}: use .csv, .parquet or .pq")
    if column is None:
        numeric = list(frame.select_dtypes("number").columns)
        if len(numeric) != 1:
            raise ValueError(
                f"{path.name} has {len(numeric)} numeric columns {numeric}; set 'column' "
                f"to one of {list(frame.columns)}"
            )
        column = numeric[0]
    if column not in frame.columns:
        raise ValueError(f"column {column!r} not in {path.name}; columns: {list(frame.columns)}")
    try:
        return frame[column].to_numpy(dtype=float, na_value=np.nan)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"column {column!r} of {path.name} is not numeric") from exc


class MixtureSpec(_Spec):
    """Weighted mixture; each component is any spec plus ``weight`` (normalised to sum 1)."""

    dist: Literal["mixture"] = "mixture"
    components: list[MixtureComponent] = Field(min_length=1)


class _Weight(BaseModel):
    weight: Positive


# A component is a spec of any family with an extra `weight` field.
class WeightedExponential(ExponentialSpec, _Weight): ...


class WeightedLognormal(LognormalSpec, _Weight): ...


class WeightedGamma(GammaSpec, _Weight): ...


class WeightedWeibull(WeibullSpec, _Weight): ...


class WeightedLomax(LomaxSpec, _Weight): ...


class WeightedConstant(ConstantSpec, _Weight): ...


class WeightedEmpirical(EmpiricalSpec, _Weight): ...


class WeightedMixture(MixtureSpec, _Weight): ...


MixtureComponent = Annotated[
    WeightedExponential
    | WeightedLognormal
    | WeightedGamma
    | WeightedWeibull
    | WeightedLomax
    | WeightedConstant
    | WeightedEmpirical
    | WeightedMixture,
    Field(discriminator="dist"),
]
MixtureSpec.model_rebuild()
WeightedMixture.model_rebuild()

DurationSpec = Annotated[
    ExponentialSpec
    | LognormalSpec
    | GammaSpec
    | WeibullSpec
    | LomaxSpec
    | ConstantSpec
    | EmpiricalSpec
    | MixtureSpec,
    Field(discriminator="dist"),
]
_SPEC_ADAPTER: TypeAdapter[Any] = TypeAdapter(DurationSpec)
