"""Update records: an update is a version plus (seed, coefficient) pairs, nothing else.

Any version of the weights is the base weights plus the log of records, so a worker
catches up by regenerating noise from seeds instead of receiving weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from numbers import Integral
from typing import Any

from runner.es.schemes import check_seed


@dataclass(frozen=True)
class Result:
    """One evaluated perturbation: reward of ``master + sign * sigma * eps(seed)``.

    ``dispatch_version`` is the optimizer version the worker evaluated at; its lag when
    used is ``optimizer.version - dispatch_version``.
    """

    seed: int
    reward: float
    dispatch_version: int
    sign: int = 1

    @classmethod
    def coerce(cls, item: Result | tuple | list) -> Result:
        """Accept a Result or a tuple ``(seed, reward, dispatch_version[, sign])``."""
        if isinstance(item, Result):
            r = item
        elif isinstance(item, tuple | list) and len(item) in (3, 4):
            r = cls(*item)
        else:
            raise ValueError(
                f"a result must be (seed, reward, dispatch_version[, sign]) or a Result, got {item!r}"
            )
        if r.sign not in (1, -1):
            raise ValueError(f"result sign must be +1 or -1, got {r.sign!r}")
        if isinstance(r.dispatch_version, bool) or not isinstance(r.dispatch_version, Integral):
            raise ValueError(f"dispatch_version must be an integer, got {r.dispatch_version!r}")
        reward = float(r.reward)
        if reward != reward or reward in (float("inf"), float("-inf")):
            raise ValueError(f"reward of seed {r.seed} is not finite: {r.reward!r}")
        return cls(check_seed(r.seed), reward, int(r.dispatch_version), int(r.sign))


@dataclass(frozen=True)
class UpdateRecord:
    """One committed update. ``version`` is the version it produces (base is ``version - 1``).

    ``entries`` are ``(seed, coefficient)``: the update is ``sum_j coefficient_j * eps(seed_j)``
    added to the fp32 master (alpha, 1/N, the shaped reward, the sign and the staleness
    weight are all folded into the coefficient). ``sigma``/``alpha``/``shaping`` document
    how the coefficients were made; replay needs only ``entries``. ``noise`` names the
    noise scheme of the optimizer that made it (None: not recorded, e.g. a coordinator's
    :class:`~runner.es.update_rule.UpdateRule`); an optimizer refuses to apply a record of
    another scheme. A record without it reads and writes exactly as before.
    """

    version: int
    entries: tuple[tuple[int, float], ...]
    sigma: float
    alpha: float
    shaping: str = "zscore"
    staleness: str = "none"
    n_accepted: int = 0
    lags: tuple[int, ...] = ()
    dropped: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    noise: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["entries"] = [[s, c] for s, c in self.entries]
        d["lags"] = list(self.lags)
        d["dropped"] = [dict(x) for x in self.dropped]
        if self.noise is None:
            del d["noise"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> UpdateRecord:
        try:
            return cls(
                version=int(d["version"]),
                entries=tuple((check_seed(int(s)), float(c)) for s, c in d["entries"]),
                sigma=float(d["sigma"]),
                alpha=float(d["alpha"]),
                shaping=str(d.get("shaping", "zscore")),
                staleness=str(d.get("staleness", "none")),
                n_accepted=int(d.get("n_accepted", len(d["entries"]))),
                lags=tuple(int(x) for x in d.get("lags", ())),
                dropped=tuple(dict(x) for x in d.get("dropped", ())),
                noise=None if d.get("noise") is None else str(d["noise"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed update record {d!r}: {exc}") from None
