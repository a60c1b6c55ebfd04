"""The update rule: a cohort of results -> one :class:`UpdateRecord`, with no weights needed.

Kept apart from the optimizer so that a coordinator that holds no model (the runner's
orchestrator) builds exactly the records that :meth:`ESOptimizer.step` would commit:
staleness rule first (lag = version - dispatch_version), antithetic pairing, shaping over
the accepted results, coefficient ``alpha/N * weight * sign * Z_i`` with N accepted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from runner.es.records import Result, UpdateRecord
from runner.es.schemes import check_scheme
from runner.es.shaping import get_shaping
from runner.es.staleness import DropOver, StalenessRule, parse_staleness

_ANTITHETIC = "es.antithetic: true"


class Fate(NamedTuple):
    """What one update does with one result (:meth:`UpdateRule.judge`)."""

    weight: float | None  # None: dropped
    lag: int
    reason: str = ""  # why it is dropped
    key: str = ""  # the setting that drops it


def _finite(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


class UpdateRule:
    """Hyper-parameters of the update, validated once; ``make`` builds a record."""

    def __init__(
        self,
        sigma: float = 0.0015,
        alpha: float = 0.00075,
        shaping: str = "zscore",
        antithetic: bool = False,
        staleness: str | StalenessRule | None = "none",
        noise: str | None = None,
    ) -> None:
        self.sigma = _finite("sigma", sigma)
        if self.sigma <= 0:
            raise ValueError(f"sigma must be > 0, got {sigma!r}")
        self.alpha = _finite("alpha", alpha)
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha!r}")
        self.shaping = shaping
        self._shape_fn = get_shaping(shaping)
        self.antithetic = bool(antithetic)
        self.staleness = parse_staleness(staleness)
        # the workers' noise scheme, stamped on each record so a replay with another
        # scheme is refused (None: not recorded)
        self.noise = None if noise is None else check_scheme(noise)

    def judge(self, results: Iterable[Result | tuple], version: int) -> list[Fate]:
        """Each result's fate in the update that takes ``version`` to ``version + 1``: the
        weight it is used with, or ``None`` with the reason and the setting that drops it.
        :meth:`make` uses exactly these, so a trace can record what the update did."""
        items = [Result.coerce(r) for r in results]
        seen: set[tuple[int, int]] = set()
        fates: list[Fate] = []
        for r in items:
            if (r.seed, r.sign) in seen:
                raise ValueError(f"seed {r.seed} with sign {r.sign:+d} appears twice in one cohort")
            seen.add((r.seed, r.sign))
            lag = version - r.dispatch_version
            if lag < 0:
                raise ValueError(
                    f"result of seed {r.seed} has dispatch_version {r.dispatch_version} "
                    f"beyond the current version {version}"
                )
            weight = self.staleness.weight(lag)
            if weight is None:
                assert isinstance(self.staleness, DropOver)
                reason = f"lag {lag} > max_lag {self.staleness.max_lag}"
                fates.append(Fate(None, lag, reason, f"es.staleness: {self.staleness.spec()}"))
            else:
                fates.append(Fate(weight, lag))
        if self.antithetic:
            signs: dict[int, set[int]] = {}
            for r, f in zip(items, fates, strict=True):
                if f.weight is not None:
                    signs.setdefault(r.seed, set()).add(r.sign)
            fates = [
                f if f.weight is None or len(signs[r.seed]) == 2
                else Fate(None, f.lag, "antithetic partner missing", _ANTITHETIC)
                for r, f in zip(items, fates, strict=True)
            ]  # fmt: skip
        return fates

    def make(self, results: Iterable[Result | tuple], version: int) -> UpdateRecord:
        """The record that takes ``version`` to ``version + 1`` from ``results``."""
        items = [Result.coerce(r) for r in results]
        if not items:
            raise ValueError("step needs at least one result")
        fates = self.judge(items, version)
        pairs = list(zip(items, fates, strict=True))
        accepted = [(r, f.lag, f.weight) for r, f in pairs if f.weight is not None]
        gone = [(r, f) for r, f in pairs if f.weight is None]
        gone.sort(key=lambda rf: rf[1].key == _ANTITHETIC)  # staleness drops first, as ever
        dropped = [{"seed": r.seed, "sign": r.sign, "lag": f.lag, "reason": f.reason}
                   for r, f in gone]  # fmt: skip
        entries: dict[int, float] = {}
        if accepted:
            z = self._shape_fn([r.reward for r, _, _ in accepted])
            n = len(accepted)
            for (r, _, weight), zi in zip(accepted, z, strict=True):
                coef = self.alpha / n * weight * r.sign * float(zi)
                entries[r.seed] = entries.get(r.seed, 0.0) + coef
        return UpdateRecord(
            version=version + 1,
            entries=tuple(entries.items()),
            sigma=self.sigma,
            alpha=self.alpha,
            shaping=self.shaping,
            staleness=self.staleness.spec(),
            n_accepted=len(accepted),
            lags=tuple(lag for _, lag, _ in accepted),
            dropped=tuple(dropped),
            noise=self.noise,
        )

    def config(self) -> dict[str, Any]:
        return {
            "sigma": self.sigma,
            "alpha": self.alpha,
            "shaping": self.shaping,
            "antithetic": self.antithetic,
            "staleness": self.staleness.spec(),
        }
