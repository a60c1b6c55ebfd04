"""What an update does with results whose lag (version - dispatch_version) is above zero.

Given as an object or a string: ``"none"``, ``"drop_over:K"`` (drop results with lag > K),
``"lag_weighted:GAMMA"`` (keep every result, weight its coefficient by GAMMA**lag).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NoStaleness:
    """Use every result with weight 1, whatever its lag (as published for sync and Async-k)."""

    def weight(self, lag: int) -> float | None:
        return 1.0

    def spec(self) -> str:
        return "none"


@dataclass(frozen=True)
class DropOver:
    """Discard results whose lag exceeds ``max_lag`` ("Natural Async-1" is ``DropOver(1)``)."""

    max_lag: int

    def __post_init__(self) -> None:
        if isinstance(self.max_lag, bool) or not isinstance(self.max_lag, int) or self.max_lag < 0:
            raise ValueError(
                f"staleness drop_over: max_lag must be an integer >= 0, got {self.max_lag!r}"
            )

    def weight(self, lag: int) -> float | None:
        return None if lag > self.max_lag else 1.0

    def spec(self) -> str:
        return f"drop_over:{self.max_lag}"


@dataclass(frozen=True)
class LagWeighted:
    """Keep every result and scale its coefficient by ``gamma ** lag``."""

    gamma: float

    def __post_init__(self) -> None:
        g = self.gamma
        if isinstance(g, bool) or not isinstance(g, int | float) or not 0.0 <= g <= 1.0:
            raise ValueError(f"staleness lag_weighted: gamma must be a number in [0, 1], got {g!r}")

    def weight(self, lag: int) -> float | None:
        return float(self.gamma) ** lag

    def spec(self) -> str:
        return f"lag_weighted:{self.gamma!r}"


StalenessRule = NoStaleness | DropOver | LagWeighted
_FORMS = "'none', 'drop_over:K' (K >= 0 integer) or 'lag_weighted:GAMMA' (0 <= GAMMA <= 1)"


def parse_staleness(spec: str | StalenessRule | None) -> StalenessRule:
    """Turn a string or rule object into a rule; a bad spec raises ValueError naming the forms."""
    if spec is None:
        return NoStaleness()
    if isinstance(spec, NoStaleness | DropOver | LagWeighted):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"staleness must be {_FORMS}, got {spec!r}")
    kind, _, arg = spec.strip().partition(":")
    try:
        if kind == "none" and not arg:
            return NoStaleness()
        if kind == "drop_over":
            return DropOver(int(arg))
        if kind == "lag_weighted":
            return LagWeighted(float(arg))
    except ValueError as exc:
        raise ValueError(f"staleness must be {_FORMS}, got {spec!r} ({exc})") from None
    raise ValueError(f"staleness must be {_FORMS}, got {spec!r}")
