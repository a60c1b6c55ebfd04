"""The validation's figures: predicted against measured per metric, and the lag
distributions side by side (matplotlib is imported only when a figure is drawn)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from staleness_sim.validation.report import Validation


def plot_metrics(v: Validation):
    """Predicted against measured, one panel per metric: the replicates (dots, 90 %
    interval as a bar) and the measured value (a line)."""
    from matplotlib.figure import Figure

    n = len(v.table)
    cols = 4
    fig = Figure(figsize=(3.2 * cols, 3.0 * math.ceil(n / cols)), layout="constrained")
    axes = fig.subplots(math.ceil(n / cols), cols, squeeze=False).ravel()
    rng = np.random.default_rng(0)
    for ax, row in zip(axes, v.table.itertuples(index=False), strict=False):
        values = np.array([float(s[row.metric]) for s in v.predicted])
        ax.scatter(rng.uniform(-0.15, 0.15, len(values)), values, s=12, alpha=0.6, label="sim")
        ax.errorbar(
            [0.35],
            [row.predicted],
            yerr=[[max(0.0, row.predicted - row.low)], [max(0.0, row.high - row.predicted)]],
            fmt="o",
            color="C0",
            capsize=4,
        )
        ax.axhline(row.measured, color="C3", lw=2, label="measured")
        ax.set_xticks([])
        ax.set_xlim(-0.5, 0.6)
        err = f"{100 * row.error:+.1f} %" if row.kind == "relative" else f"{row.error:+.3f}"
        ax.set_title(f"{row.metric}\nerror {err}", fontsize=9)
    for ax in axes[n:]:
        ax.set_visible(False)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Predicted ({len(v.predicted)} replicates) vs measured: {v.run.folder.name}")
    return fig


def plot_lags(v: Validation):
    """The measured and predicted lag distributions of accepted results, side by side."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.4), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    lags = sorted(set(v.measured_lags) | set(v.predicted_lags)) or [0]
    for ax, dist, title, color in (
        (left, v.measured_lags, "measured", "C3"),
        (right, v.predicted_lags, f"predicted ({len(v.predicted)} replicates)", "C0"),
    ):
        ax.bar(lags, [dist.get(k, 0.0) for k in lags], color=color)
        ax.set_xticks(lags)
        ax.set_xlabel("lag of accepted results (updates)")
        ax.set_title(title)
    left.set_ylabel("fraction")
    fig.suptitle(f"Lag distributions (TV distance {v.lag_tv_distance:.3f})")
    return fig


def write_plots(v: Validation, folder: str | Path) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "validate_metrics.png", folder / "validate_lags.png"]
    plot_metrics(v).savefig(paths[0], dpi=110)
    plot_lags(v).savefig(paths[1], dpi=110)
    return paths
