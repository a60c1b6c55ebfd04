"""The worker timeline: a row per worker, busy (coloured by the version its job was
dispatched at), idle, syncing; cancelled jobs hatched; stale results marked where they landed.

:func:`timeline_bars` is the data (the trace's worker intervals, each busy one matched to
its job, clipped to a window); :func:`draw_timeline` draws it on one Axes, each worker's
bars of one state as one collection whose ``gid`` is ``"<state>/<worker>"``, so what was
drawn can be read back from the figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from staleness_sim.core.metrics import wall_clock
from staleness_sim.core.trace import Trace

STATE_COLOURS = {"idle": "#e6e6e6", "syncing": "#f4a259"}
WINDOW_UPDATES = 30  # a longer run shows the span of its first this many updates
VERSION_COLOURS = "tab10"  # cycled: neighbouring versions always differ
LABEL_MIN_WIDTH = 0.012  # a busy bar this share of the window wide is labelled with its version


def default_window(trace: Trace) -> tuple[float, float]:
    """The whole run, or for a long one the span of its first :data:`WINDOW_UPDATES`."""
    end = wall_clock(trace)
    times = trace.updates["time"].dropna().sort_values()
    if len(times) > WINDOW_UPDATES:
        end = float(times.iloc[WINDOW_UPDATES - 1])
    return 0.0, end


def timeline_bars(trace: Trace, window: tuple[float, float]) -> pd.DataFrame:
    """One row per worker interval inside ``window`` (clipped): worker, state, start, end,
    and for busy ones the job, its dispatch version and whether it was cancelled."""
    lo, hi = window
    w = trace.workers.copy()
    busy = trace.workers[trace.workers["state"] == "busy"].sort_values("start")
    jobs = trace.jobs.dropna(subset=["start_time"]).sort_values("start_time")
    # a busy interval runs the job of that worker that started when it began
    matched = pd.merge_asof(
        busy.reset_index(),
        jobs[["worker", "start_time", "job_id", "dispatch_version", "verdict"]].astype(
            {"worker": busy["worker"].dtype}
        ),
        left_on="start",
        right_on="start_time",
        by="worker",
        direction="nearest",  # (a measured job's start is stamped just after its interval's)
    ).set_index("index")
    w["job_id"] = matched["job_id"]
    w["version"] = matched["dispatch_version"]
    w["cancelled"] = matched["verdict"] == "cancelled"
    w = w[(w["end"] > lo) & (w["start"] < hi)].copy()  # matched before clipping to the window
    w["start"], w["end"] = w["start"].clip(lower=lo), w["end"].clip(upper=hi)
    return w.sort_values(["worker", "start"]).reset_index(drop=True)


def stale_marks(trace: Trace, window: tuple[float, float]) -> pd.DataFrame:
    """Results that landed stale inside ``window``: used at lag > 0, or discarded."""
    j = trace.jobs
    lo, hi = window
    inside = (j["end_time"] > lo) & (j["end_time"] <= hi)
    used_stale = j["verdict"].isin(["accepted", "dropped"]) & (j["lag"].fillna(0) > 0)
    marks = j[inside & (used_stale | (j["verdict"] == "discarded"))]
    return marks[["worker", "end_time", "verdict", "lag"]]


def draw_timeline(ax, trace: Trace, window: tuple[float, float] | None = None, title=""):
    """The timeline of ``trace`` on ``ax``; returns the window drawn."""
    window = window or default_window(trace)
    bars = timeline_bars(trace, window)
    n_workers = int(trace.meta.get("workers") or trace.workers["worker"].max() + 1)
    cmap = colormaps[VERSION_COLOURS]
    span = window[1] - window[0]
    height = 0.8
    for (worker, state), group in bars.groupby(["worker", "state"]):
        spans = list(zip(group["start"], group["end"] - group["start"], strict=True))
        y = (worker - height / 2, height)
        if state == "busy":
            colours = [cmap(int(v) % cmap.N) if pd.notna(v) else "grey" for v in group["version"]]
            hatches = ["////" if c else "" for c in group["cancelled"].fillna(False)]
            coll = ax.broken_barh(spans, y, facecolors=colours, edgecolor="white", linewidth=0.3)
            coll.set_gid(f"busy/{worker}")
            for (start, width), v in zip(spans, group["version"], strict=True):
                if pd.notna(v) and width >= LABEL_MIN_WIDTH * span and len(bars) < 600:
                    ax.text(start + width / 2, worker, str(int(v)), ha="center", va="center",
                            fontsize=6, color="white")  # fmt: skip
            cut = [s for s, h in zip(spans, hatches, strict=True) if h]
            if cut:  # cancelled work over the colour, so the version still shows
                over = ax.broken_barh(cut, y, facecolors="none", edgecolor="#c0392b",
                                      hatch="////", linewidth=0.5)  # fmt: skip
                over.set_gid(f"cancelled/{worker}")
        else:
            coll = ax.broken_barh(spans, y, facecolors=STATE_COLOURS[state], edgecolor="none")
            coll.set_gid(f"{state}/{worker}")
    marks = stale_marks(trace, window)
    for verdict, style in (("accepted", ("^", "#c0392b")), ("dropped", ("v", "#7f8c8d")),
                           ("discarded", ("x", "black"))):  # fmt: skip
        m = marks[marks["verdict"] == verdict]
        if len(m):
            ax.scatter(m["end_time"], m["worker"], marker=style[0], color=style[1], s=18,
                       zorder=3, label=f"{verdict} stale", gid=f"stale/{verdict}")  # fmt: skip
    updates = trace.updates["time"]
    for t in updates[(updates >= window[0]) & (updates <= window[1])]:
        ax.axvline(t, color="black", linewidth=0.4, alpha=0.35)
    ax.set_xlim(*window)
    ax.set_ylim(-0.6, n_workers - 0.4)
    ax.set_yticks(
        range(n_workers) if n_workers <= 32 else np.linspace(0, n_workers - 1, 8, dtype=int)
    )
    ax.set_ylabel("worker")
    ax.set_xlabel("time (s)")
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10)
    return window


def timeline_figure(
    trace: Trace,
    predicted: Trace | None = None,
    window: tuple[float, float] | None = None,
    labels: tuple[str, str] = ("measured", "simulated (prediction)"),
) -> Figure:
    """The timeline; with ``predicted``, the prediction's below it on the same time axis."""
    window = window or default_window(trace)
    rows = 1 if predicted is None else 2
    n = int(trace.meta.get("workers") or 1)
    fig = Figure(figsize=(12, rows * (1.2 + 0.28 * min(n, 32))), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0])
    source = trace.meta.get("source", "trace")
    draw_timeline(axes[0], trace, window, labels[0] if rows == 2 else source)
    if predicted is not None:
        draw_timeline(axes[1], predicted, window, labels[1])
    handles = {}
    for ax in axes:
        handles.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    legend = [Patch(color=colormaps[VERSION_COLOURS](0), label="busy (colour, number: version)")]
    legend += [Patch(color=c, label=s) for s, c in STATE_COLOURS.items()]
    legend += [Patch(facecolor="none", edgecolor="#c0392b", hatch="////", label="cancelled")]
    legend += list(handles.values())
    fig.legend(handles=legend, loc="outside lower center", fontsize=7, ncols=len(legend))
    whole = wall_clock(trace)
    if window[1] < whole or window[0] > 0:
        fig.suptitle(f"window {window[0]:.0f} to {window[1]:.0f} s of {whole:.0f} s", fontsize=9)
    return fig
