"""Figures of a sweep (seaborn on matplotlib ``Figure`` objects; no pyplot state, no display).

Each function takes a :class:`SweepData` (or use :func:`load`) and returns a Figure, or
raises :class:`Skip` saying what the sweep lacks. :func:`write_all` draws every figure it
can into a folder and returns one note per figure (path, or why it was skipped).
Error bars are one standard deviation over seeds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from staleness_sim.sweeps.plot_data import (
    QUEUE_TAIL_PATTERN,
    Skip,
    SweepData,
    pareto,
    speedups,
)
from staleness_sim.sweeps.store import LAG_HISTS, RESULTS, SWEEP_INFO

__all__ = ["FIGURES", "QUEUE_FIGURES", "Skip", "SweepData", "load", "write_all"]
sns.set_theme(style="whitegrid", context="notebook")


def load(folder: str | Path) -> SweepData:
    """A sweep output folder (results.parquet, lag_hists.parquet, sweep.json)."""
    folder = Path(folder)
    if not (folder / RESULTS).exists():
        raise ValueError(f"{folder}: no {RESULTS} (run staleness-sim sweep first)")
    results = pd.read_parquet(folder / RESULTS)
    lags = pd.read_parquet(folder / LAG_HISTS) if (folder / LAG_HISTS).exists() else None
    info = json.loads((folder / SWEEP_INFO).read_text()) if (folder / SWEEP_INFO).exists() else {}
    axes = tuple(a for a in info.get("axes", []) if a in results.columns)
    groups = tuple(tuple(a for a in g if a in axes) for g in info.get("zip", []))
    name = info.get("name") or (str(results["name"].iloc[0]) if len(results) else folder.name)
    return SweepData(results, lags, axes, info.get("base", {}), groups, name)


def _title(fig: Figure, text: str, held: str) -> None:
    fig.suptitle(text + (f"\n(at {held})" if held else ""), fontsize=11)


def throughput_vs_workers(data: SweepData) -> Figure:
    if "workers" not in data.axes or not data.varying("workers"):
        raise Skip("workers is not a swept axis")
    df, held = data.slice(("workers", *data.policy_axes()))
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    kw = dict(x="workers", hue="policy_label", marker="o", errorbar="sd", **data.policies(df))
    sns.lineplot(df, y="updates_per_hour", ax=ax1, **kw)
    sns.lineplot(df, y="worker_idle_fraction", ax=ax2, legend=False, **kw)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(df["workers"].unique()), labels=sorted(df["workers"].unique()))
        ax.set_xlabel("workers G")
    ax1.set_ylabel("updates per hour")
    ax2.set_ylabel("worker idle fraction")
    ax1.legend(title="policy", fontsize=8)
    _title(fig, "Throughput and idle time against workers", held)
    return fig


def lag_distributions(data: SweepData) -> Figure:
    if data.lag_hists is None or data.lag_hists.empty:
        raise Skip("no lag histograms (lag_hists.parquet)")
    df, held = data.slice(("workers", *data.policy_axes()))
    lags = data.lag_hists.merge(df[["key", "workers", "policy_label"]], on="key")
    per = lags.groupby(["workers", "policy_label", "lag"], as_index=False)["count"].sum()
    total = per.groupby(["workers", "policy_label"])["count"].transform("sum")
    per["fraction"] = per["count"] / total
    workers = sorted(per["workers"].unique())
    fig = Figure(figsize=(3.2 * len(workers) + 2.5, 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(workers), sharey=True))
    style = data.policies(per)
    for i, (ax, g) in enumerate(zip(axes, workers, strict=True)):
        part = per[per["workers"] == g]
        sns.barplot(
            part,
            x="lag",
            y="fraction",
            hue="policy_label",
            ax=ax,
            legend=i == len(workers) - 1,
            **style,
        )
        ax.set_yscale("log")
        ax.set_title(f"G = {g}")
        ax.set_xlabel("lag (updates)")
    axes[0].set_ylabel("fraction of accepted results")
    if axes[-1].get_legend():
        sns.move_legend(axes[-1], "upper left", bbox_to_anchor=(1, 1), title="policy", fontsize=8)
    _title(fig, "Lag of accepted results per policy (all seeds pooled)", held)
    return fig


def speedup_vs_tail(data: SweepData) -> Figure:
    tail = data.tail_axis()
    keep = (tail, "workers", *data.policy_axes())
    df, held = data.slice(keep)
    sp = speedups(data, df)
    workers = sorted(sp["workers"].unique()) if "workers" in sp.columns else [None]
    fig = Figure(figsize=(3.6 * len(workers) + 1.5, 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(workers), sharey=True))
    for i, (ax, g) in enumerate(zip(axes, workers, strict=True)):
        part = sp if g is None else sp[sp["workers"] == g]
        sns.lineplot(
            part,
            x=tail,
            y="speedup",
            hue="policy_label",
            marker="o",
            errorbar="sd",
            ax=ax,
            legend=i == len(workers) - 1,
            **data.policies(sp),
        )
        ax.axhline(1.0, color="grey", lw=1, ls="--")
        ax.set_title(f"G = {g}" if g is not None else "")
        heavier = (
            " (lower = heavier tail)" if tail.endswith("shape") else " (higher = heavier tail)"
        )
        ax.set_xlabel(tail + heavier, fontsize=9)
    axes[0].set_ylabel("speed-up over sync (wall clock)")
    if len(axes) and axes[-1].get_legend():
        sns.move_legend(axes[-1], "upper left", bbox_to_anchor=(1, 1), title="policy", fontsize=8)
    _title(fig, "Async-over-sync speed-up against tail heaviness", held)
    return fig


def stale_vs_bound(data: SweepData) -> Figure:
    df, held = data.slice(("workers", *data.policy_axes()))
    df = df[df["policy_kind"] == "bounded"].copy()
    if df.empty:
        raise Skip("no bounded-staleness runs")
    df["bound"] = data.field("policy.max_lag", df).astype(int)
    df["on_stale"] = data.field("policy.on_stale", df)
    if df["bound"].nunique() < 2:
        raise Skip("the bound (policy.max_lag) takes a single value")
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    hue = "workers" if df["workers"].nunique() > 1 else None
    style = "on_stale" if df["on_stale"].nunique() > 1 else None
    kw = dict(
        x="bound",
        hue=hue,
        style=style,
        marker="o",
        errorbar="sd",
        palette="viridis" if hue else None,
    )
    sns.lineplot(df, y="stale_fraction", ax=ax1, **kw)
    sns.lineplot(df, y="data_utilization", ax=ax2, legend=False, **kw)
    ax1.set_ylabel("stale fraction (accepted with lag >= 1)")
    ax2.set_ylabel("data utilisation (accepted / completed)")
    for ax in (ax1, ax2):
        ax.set_xlabel("staleness bound max_lag")
        ax.set_xticks(sorted(df["bound"].unique()))
    _title(fig, "Staleness and waste against the bound", held)
    return fig


def frontier(data: SweepData) -> Figure:
    df, held = data.slice(("workers", *data.policy_axes()))
    try:
        pts, ylabel = speedups(data, df), "speed-up over sync"
        y = "speedup"
    except Skip:
        pts, ylabel, y = df, "updates per hour", "updates_per_hour"
    group = ["workers", "policy_label"]
    means = pts.groupby(group, as_index=False)[[y, "stale_fraction", "mean_lag"]].mean()
    workers = sorted(means["workers"].unique())
    fig = Figure(figsize=(3.6 * len(workers) + 1.5, 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(workers), sharey=y == "speedup"))
    for i, (ax, g) in enumerate(zip(axes, workers, strict=True)):
        part = means[means["workers"] == g]
        sns.scatterplot(
            part,
            x="mean_lag",
            y=y,
            hue="policy_label",
            s=60,
            ax=ax,
            legend=i == len(workers) - 1,
            **data.policies(means),
        )
        idx = pareto(part["mean_lag"].to_numpy(), part[y].to_numpy())
        front = part.iloc[idx]
        ax.plot(front["mean_lag"], front[y], color="black", lw=1, drawstyle="steps-post", zorder=0)
        ax.set_title(f"G = {g}")
        ax.set_xlabel("mean lag of accepted results")
    axes[0].set_ylabel(ylabel)
    if axes[-1].get_legend():
        sns.move_legend(axes[-1], "upper left", bbox_to_anchor=(1, 1), title="policy", fontsize=8)
    _title(fig, "Speed against staleness (black: the frontier; means over seeds)", held)
    return fig


def queue_vs_rho(data: SweepData) -> Figure:
    """Queue pipeline: mean staleness (with the queue-drop closed form, dashed), trainer idle
    and rollout idle against the measured rho; colour: queue capacity q, marker: queue rule;
    one row of panels per length tail when the sweep varies one."""
    res = data.results
    if "rho" not in res.columns or res["rho"].isna().all():
        raise Skip("no queue-pipeline runs (pipeline: queue)")
    keep = tuple(a for a in data.axes if a.split(".")[0] in ("trainer", "rollout"))
    keep += ("queue.capacity", "queue.rule")
    tail = next(
        (a for a in data.axes if QUEUE_TAIL_PATTERN.match(a) and res[a].nunique() > 1), None
    )
    df, held = data.slice(keep)
    df = df[df["rho"].notna()].copy()
    if df.empty:
        raise Skip("no queue-pipeline runs at the held axis values")
    df["q"] = data.field("queue.capacity", df).map(
        lambda q: "inf" if q is None or q != q else f"{q:g}"
    )
    df["rule"] = data.field("queue.rule", df).fillna("block")
    group = ["point", "q", "rule"] + ([tail] if tail else [])
    cols = ["rho", "mean_staleness", "closed_form_staleness"]
    cols += ["trainer_idle_fraction", "rollout_idle_fraction"]
    means = df.groupby(group, as_index=False)[cols].mean().sort_values("rho")
    tails = sorted(means[tail].unique()) if tail else [None]
    fig = Figure(figsize=(14, 3.6 * len(tails) + 0.8), layout="constrained")
    axes = fig.subplots(len(tails), 3, squeeze=False)
    qs = sorted(means["q"].unique(), key=float)
    colors = dict(zip(qs, sns.color_palette("viridis", n_colors=len(qs)), strict=True))
    rules = sorted(means["rule"].unique())
    markers = dict(zip(rules, "os^Dv", strict=False))
    for r, t in enumerate(tails):
        part = means if t is None else means[means[tail] == t]
        for q in qs:
            for rule in rules:
                line = part[(part["q"] == q) & (part["rule"] == rule)]
                if line.empty:
                    continue
                kw = dict(color=colors[q], marker=markers[rule], ms=4, label=f"{rule}, q = {q}")
                axes[r, 0].plot(line["rho"], line["mean_staleness"], **kw)
                axes[r, 1].plot(line["rho"], line["trainer_idle_fraction"], **kw)
                axes[r, 2].plot(line["rho"], line["rollout_idle_fraction"], **kw)
                if rule == "drop_oldest":
                    axes[r, 0].plot(
                        line["rho"], line["closed_form_staleness"], ls="--", lw=1, color=colors[q]
                    )
        axes[r, 0].set_ylabel("mean staleness (steps)")
        axes[r, 1].set_ylabel("trainer idle fraction")
        axes[r, 2].set_ylabel("rollout idle fraction")
        for ax in axes[r]:
            ax.axvline(1.0, color="grey", lw=1, ls=":")
            ax.set_xlabel("rho = rollout / trainer throughput (measured)")
            if t is not None:
                ax.set_title(f"{tail} = {t:g}", fontsize=10)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, title="rule, capacity")
    _title(fig, "Queue pipeline: staleness (dashed: queue-drop closed form) and idle time", held)
    return fig


@dataclass
class FigureNote:
    name: str
    title: str
    path: Path | None
    note: str = ""


FIGURES: dict[str, tuple[str, Callable[[SweepData], Figure]]] = {
    "throughput_vs_workers": (
        "Throughput and idle fraction against workers",
        throughput_vs_workers,
    ),
    "lag_distributions": ("Lag distributions per policy", lag_distributions),
    "speedup_vs_tail": ("Async-over-sync speed-up against tail heaviness", speedup_vs_tail),
    "stale_vs_bound": ("Stale fraction against the bound", stale_vs_bound),
    "frontier": ("Speed-versus-staleness frontier", frontier),
}
# drawn only for sweeps of the queue pipeline (pipeline: queue)
QUEUE_FIGURES: dict[str, tuple[str, Callable[[SweepData], Figure]]] = {
    "queue_vs_rho": ("Queue pipeline: staleness and idle time against rho", queue_vs_rho),
}


def write_all(data: SweepData, folder: str | Path, dpi: int = 110) -> list[FigureNote]:
    """Draw every figure the sweep allows as PNG files in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    notes = []
    figures = dict(FIGURES)
    res = data.results
    if "rho" in res.columns and res["rho"].notna().any():
        figures.update(QUEUE_FIGURES)
    for name, (title, draw) in figures.items():
        try:
            fig = draw(data)
        except Skip as why:
            notes.append(FigureNote(name, title, None, f"skipped: {why}"))
            continue
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=dpi)
        notes.append(FigureNote(name, title, path))
    return notes
