"""Calibration: the free parameter ``effect`` fitted to a measured learning curve.

``base_rate`` is the measured success at version 0 (the model starts there exactly); the
other parameters keep the values given (they are not identified by one curve of held-out
success). ``effect`` minimises the squared error of the mean model curve over ``seeds``,
at the versions measured, along the measured (or simulated) schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from staleness_sim.core.settings import ConfigError
from staleness_sim.core.trace import Trace, TraceError
from staleness_sim.learning.model import learn
from staleness_sim.learning.schedule import Schedule, schedule_from_trace
from staleness_sim.learning.spec import LearningSpec

EFFECT_MAX = 2000.0
_GRID = np.concatenate(([0.0], np.geomspace(1.0, EFFECT_MAX, 31)))
_GOLDEN = (np.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class Fit:
    spec: LearningSpec
    measured: dict[int, float]  # version -> held-out success
    predicted: dict[int, float]  # version -> the fitted model's mean over seeds
    spread: dict[int, float]  # version -> its standard deviation over seeds
    seeds: int
    at_bound: bool  # effect = 0: the curve shows no gain the model can fit

    def to_json(self) -> dict[str, Any]:
        return {
            "learning": self.spec.model_dump(mode="json", exclude_none=True),
            "versions": [
                {
                    "version": v,
                    "measured": self.measured[v],
                    "predicted": self.predicted[v],
                    "spread": self.spread[v],
                }
                for v in sorted(self.measured)
            ],  # fmt: skip
            "seeds": self.seeds,
            "no_gain": self.at_bound,
        }


def fit_effect(
    schedule: Schedule, measured: dict[int, float], spec: LearningSpec, seeds: int = 4
) -> Fit:
    """``spec`` with ``base_rate`` from version 0 and ``effect`` fitted to the rest."""
    if 0 not in measured:
        raise ValueError("a measured curve needs version 0 (the starting success)")
    later = sorted(v for v in measured if v > 0)
    if not later or later[-1] > schedule.n_updates:
        raise ValueError(f"measured versions must include some in 1..{schedule.n_updates}")
    base = measured[0]
    if not 0.0 < base < 1.0:
        raise ValueError(f"the success at version 0 must be in (0, 1), got {base}")
    template = spec.model_copy(update={"base_rate": base})
    target = np.array([measured[v] for v in later])

    def curves(effect: float) -> np.ndarray:
        s = template.model_copy(update={"effect": float(effect)})
        return np.array([learn(schedule, s, seed).success[later] for seed in range(seeds)])

    def loss(effect: float) -> float:
        return float(((curves(effect).mean(axis=0) - target) ** 2).sum())

    losses = [loss(e) for e in _GRID]
    i = int(np.argmin(losses))
    lo, hi = _GRID[max(i - 1, 0)], _GRID[min(i + 1, _GRID.size - 1)]
    best = _golden(loss, lo, hi) if i > 0 else 0.0
    if loss(best) > losses[i]:
        best = float(_GRID[i])
    fitted = template.model_copy(update={"effect": float(best)})
    c = curves(best)
    at = {v: float(m) for v, m in zip(later, c.mean(axis=0), strict=True)}
    sd = {v: float(x) for v, x in zip(later, c.std(axis=0, ddof=1) if seeds > 1 else 0 * c[0],
                                      strict=True)}  # fmt: skip
    return Fit(fitted, dict(measured), {0: base, **at}, {0: 0.0, **sd}, seeds, bool(best == 0))


def _golden(f, lo: float, hi: float, steps: int = 14) -> float:
    a, b = lo, hi
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(d)
    return c if fc <= fd else d


# -- a measured run ---------------------------------------------------------------------


def read_learning_run(folder: str | Path) -> tuple[Schedule, dict[int, float], dict[str, Any]]:
    """A run directory from ``es-runner train``: its schedule (the trace), its held-out
    success per version (``eval.parquet``: the mean of ``passed`` over tasks and seeds)
    and the ES settings of its ``config.yaml`` as ``learning`` fields."""
    folder = Path(folder)
    trace = Trace.read(folder)
    path = folder / "eval.parquet"
    if not path.exists():
        raise TraceError(f"{folder}: no eval.parquet (held-out success per version)")
    ev = pd.read_parquet(path)
    column = "passed" if "passed" in ev.columns else "reward"
    curve = {int(v): float(x) for v, x in ev.groupby("version")[column].mean().items()}
    es = _run_es(folder)
    fields = {k: es[k] for k in ("sigma", "alpha", "shaping", "antithetic") if k in es}
    schedule = schedule_from_trace(trace, None, bool(fields.get("antithetic", False)))
    return schedule, curve, fields


def _run_es(folder: Path) -> dict[str, Any]:
    path = folder / "config.yaml"
    if not path.exists():
        return {}
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        raise ConfigError(f"{path}: not valid YAML") from None
    return config.get("es") or {}


def train_rewards(schedule: Schedule, rewards: np.ndarray) -> np.ndarray:
    """The mean reward of the results each update used (the runner's mean_reward)."""
    out = np.full(schedule.n_updates, np.nan)
    frame = pd.DataFrame({"u": schedule.update, "r": rewards})
    means = frame.groupby("u")["r"].mean()
    out[means.index.to_numpy()] = means.to_numpy()
    return out
