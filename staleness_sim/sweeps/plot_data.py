"""Reading a sweep's results for figures: scenario fields, slices, speed-ups over sync.

Figures show one or two axes at a time. Every other axis of the sweep is held at the base
scenario's value when the sweep has it (else at its first value), and the figure says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from staleness_sim.sweeps.spec import axis_value

TAIL_PATTERN = re.compile(r"^job\.(episode|duration)(\..+)?\.(sigma|cv|shape)$")
QUEUE_TAIL_PATTERN = re.compile(
    r"^rollout\.(sample|job\.(episode|duration))(\..+)?\.(sigma|cv|shape)$"
)


class Skip(Exception):
    """A figure this sweep cannot draw; the message says what it lacks."""


@dataclass
class SweepData:
    results: pd.DataFrame
    lag_hists: pd.DataFrame | None = None
    axes: tuple[str, ...] = ()
    base: dict[str, Any] | None = None
    zip_groups: tuple[tuple[str, ...], ...] = ()  # axes varied together move together
    name: str = ""

    def __post_init__(self) -> None:
        if "workers" not in self.results.columns:  # every figure can group by G
            workers = self.field("workers")
            if len(workers) and workers.isna().any():  # queue pipeline: G is rollout.concurrency
                workers = workers.fillna(self.field("rollout.concurrency"))
            self.results = self.results.assign(workers=workers.astype(int))

    def field(self, dotted: str, frame: pd.DataFrame | None = None) -> pd.Series:
        """A scenario field per row: its axis column when swept, else from the scenario JSON."""
        frame = self.results if frame is None else frame
        if dotted in frame.columns:
            return frame[dotted]
        return frame["scenario"].map(lambda s: _get(json.loads(s), dotted))

    def policies(self, frame: pd.DataFrame | None = None) -> dict[str, Any]:
        """Seaborn hue_order (the labels present in ``frame``) and palette for
        ``policy_label``; colours are the same in every figure."""
        style = policy_style(self.results["policy_label"])
        if frame is not None:
            present = set(frame["policy_label"])
            style["hue_order"] = [p for p in style["hue_order"] if p in present]
        return style

    def varying(self, dotted: str) -> bool:
        return self.field(dotted).astype(str).nunique() > 1

    def slice(self, keep: tuple[str, ...]) -> tuple[pd.DataFrame, str]:
        """Rows with every axis not matching a prefix in ``keep`` held at one value."""
        df, held = self.results, []

        def kept(axis: str) -> bool:
            return any(axis == k or axis.startswith(k + ".") for k in keep)

        # an axis zipped with a kept one is kept too (holding it would collapse its partner)
        keep = (*keep, *(a for g in self.zip_groups if any(map(kept, g)) for a in g))
        for axis in self.axes:
            if kept(axis):
                continue
            values = list(dict.fromkeys(df[axis]))
            target = axis_value(_get(self.base or {}, axis))
            chosen = target if target in values else values[0]
            df = df[df[axis] == chosen]
            held.append(f"{axis}={_short(chosen)}")
        return df, ", ".join(held)

    def tail_axis(self) -> str:
        for axis in self.axes:
            if TAIL_PATTERN.match(axis) and self.results[axis].nunique() > 1:
                return axis
        raise Skip("no tail-heaviness axis (e.g. job.episode.sigma, job.episode.shape)")

    def policy_axes(self) -> tuple[str, ...]:
        return tuple(a for a in self.axes if a == "policy" or a.startswith("policy."))


def speedups(data: SweepData, frame: pd.DataFrame) -> pd.DataFrame:
    """Async rows with ``speedup`` = sync wall clock / this wall clock, matched on every
    non-policy axis and the seed."""
    if not (frame["policy_kind"] == "sync").any():
        raise Skip("no synchronous runs to compare against (add {kind: sync} to a policy axis)")
    if not (frame["policy_kind"] != "sync").any():
        raise Skip("no asynchronous runs")
    match = [a for a in data.axes if a not in data.policy_axes()] + ["seed"]
    sync = frame[frame["policy_kind"] == "sync"][[*match, "wall_clock_s"]]
    sync = sync.rename(columns={"wall_clock_s": "sync_wall_clock_s"})
    out = frame[frame["policy_kind"] != "sync"].merge(sync, on=match, how="inner")
    if out.empty:
        raise Skip("no asynchronous run has a synchronous twin at the same point and seed")
    out["speedup"] = out["sync_wall_clock_s"] / out["wall_clock_s"]
    return out


def pareto(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of points not beaten by another with lower-or-equal x and higher-or-equal y."""
    order = np.lexsort((-y, x))
    best, keep = -np.inf, []
    for i in order:
        if y[i] > best:
            keep.append(i)
            best = y[i]
    return np.asarray(keep, dtype=int)


def _get(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _short(value: Any) -> str:
    if isinstance(value, str) and value.startswith("{"):
        d = json.loads(value)
        return d.get("kind", value) if isinstance(d, dict) else value
    return f"{value:g}" if isinstance(value, float) else str(value)


def policy_style(labels) -> dict:
    """hue_order and palette for policy labels, the same in every figure: sync first, then
    by kind and bound."""
    rank = {"sync": 0, "bounded": 1, "controlled_delay": 2, "unbounded": 3}

    def key(label: str) -> tuple:
        kind = label.split("(")[0].split("+")[0]
        kind = "controlled_delay" if kind == "delay" else kind
        digits = "".join(ch if ch.isdigit() else " " for ch in label).split()
        return (rank.get(kind, 9), [int(d) for d in digits], label)

    order = sorted(dict.fromkeys(labels), key=key)
    import seaborn as sns  # lazy: seaborn is slow to import

    colors = sns.color_palette("tab10", n_colors=max(10, len(order)))
    return {"hue_order": order, "palette": dict(zip(order, colors, strict=False))}
