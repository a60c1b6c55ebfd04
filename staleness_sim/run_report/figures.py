"""The other figures of one run, each from the trace alone (and ``eval.parquet`` where a
measured run has one). Each returns a ``Figure`` or raises :class:`Skip` with the reason."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from staleness_sim.core.metrics import wall_clock
from staleness_sim.core.trace import COMPLETED, Trace

IDLE_BINS = 40


class Skip(Exception):
    """The run cannot draw this figure; the message says why."""


def _figure(cols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(5.5 * cols, 3.6), layout="constrained")
    return fig, list(np.atleast_1d(fig.subplots(1, cols)))


def lag_histogram(trace: Trace, evaluations=None) -> Figure:
    """How many used results had each lag."""
    used = trace.jobs.loc[trace.jobs["verdict"] == "accepted", "lag"].dropna().astype(int)
    if used.empty:
        raise Skip("no result was used")
    counts = used.value_counts().sort_index()
    fig, (ax,) = _figure()
    ax.bar(counts.index, counts.to_numpy(), color="#4c72b0", gid="lag_counts")
    ax.set_xticks(counts.index)
    ax.set(xlabel="lag at use (versions)", ylabel="results used",
           title=f"lag of the {len(used)} used results")  # fmt: skip
    return fig


def progress(trace: Trace, evaluations=None) -> Figure:
    """Results landed (and used) and updates committed, against wall time."""
    j = trace.jobs
    landed = np.sort(j.loc[j["verdict"].isin(COMPLETED), "end_time"].dropna().to_numpy())
    used = np.sort(j.loc[j["verdict"] == "accepted", "end_time"].dropna().to_numpy())
    ups = np.sort(trace.updates["time"].dropna().to_numpy())
    if len(ups) == 0:
        raise Skip("no update was committed")
    fig, (a1, a2) = _figure(2)
    a1.step(landed, np.arange(1, len(landed) + 1), where="post", label="landed", gid="landed")
    a1.step(used, np.arange(1, len(used) + 1), where="post", label="used", gid="used")
    a1.set(xlabel="time (s)", ylabel="results", title="results against wall time")
    a1.legend()
    a2.step(ups, np.arange(1, len(ups) + 1), where="post", color="black", gid="updates")
    a2.set(xlabel="time (s)", ylabel="version", title="updates against wall time")
    return fig


def idle_fraction(trace: Trace, evaluations=None) -> Figure:
    """The share of the workers' time idle (and syncing) in equal bins of wall time."""
    end = wall_clock(trace)
    if end <= 0:
        raise Skip("the run has no time")
    edges = np.linspace(0.0, end, IDLE_BINS + 1)
    shares = binned_shares(trace.workers, edges)
    n = trace.workers["worker"].nunique()
    mid = (edges[:-1] + edges[1:]) / 2
    fig, (ax,) = _figure()
    for state, colour in (("idle", "#7f7f7f"), ("syncing", "#f4a259")):
        ax.plot(mid, shares[state] / n, color=colour, label=state, gid=f"share/{state}")
    ax.set(xlabel="time (s)", ylabel="share of worker time", ylim=(0, 1.02),
           title=f"idle over time ({IDLE_BINS} bins of {end / IDLE_BINS:.3g} s)")  # fmt: skip
    ax.legend()
    return fig


def binned_shares(workers: pd.DataFrame, edges: np.ndarray) -> dict[str, np.ndarray]:
    """Per state, the worker-seconds in each bin divided by the bin's width (so a share
    of one worker's time; divide by the workers for the fleet's share)."""
    out = {}
    width = np.diff(edges)
    for state in ("busy", "idle", "syncing"):
        w = workers[workers["state"] == state]
        s, e = w["start"].to_numpy(float)[:, None], w["end"].to_numpy(float)[:, None]
        overlap = np.clip(np.minimum(e, edges[1:]) - np.maximum(s, edges[:-1]), 0, None)
        out[state] = overlap.sum(axis=0) / width
    return out


def reward_vs_lag(trace: Trace, evaluations=None) -> Figure:
    """Each used result's reward against its lag, with the mean at each lag."""
    j = trace.jobs
    used = j[j["verdict"].isin(["accepted", "dropped"])].dropna(subset=["lag", "reward"])
    if used.empty:
        raise Skip("the trace records no reward (a simulated run draws none)")
    lag = used["lag"].astype(int).to_numpy()
    jitter = np.random.default_rng(0).uniform(-0.15, 0.15, len(lag))
    fig, (ax,) = _figure()
    ax.scatter(lag + jitter, used["reward"], s=10, alpha=0.5, gid="rewards")
    means = used.groupby(used["lag"].astype(int))["reward"].mean()
    ax.plot(means.index, means.to_numpy(), "o-", color="black", label="mean", gid="mean_reward")
    ax.set_xticks(sorted(set(lag)))
    ax.set(xlabel="lag at use", ylabel="reward", title="reward against lag")
    ax.legend()
    return fig


def held_out_success(trace: Trace, evaluations: pd.DataFrame | None = None) -> Figure:
    """Held-out success per evaluated version, against the update and the wall time."""
    if evaluations is None or evaluations.empty:
        raise Skip("no held-out evaluation (eval.parquet) in the folder")
    split = evaluations["split"].mode().iloc[0]
    ev = evaluations[evaluations["split"] == split]
    success = ev.groupby("version")["passed"].mean()
    when = {0: 0.0, **dict(zip(trace.updates["version"], trace.updates["time"], strict=True))}
    times = [when.get(int(v), np.nan) for v in success.index]
    fig, (a1, a2) = _figure(2)
    a1.plot(success.index, success.to_numpy(), "o-", gid="success_by_version")
    a1.set(xlabel="version", ylabel=f"success ({split})", ylim=(-0.02, 1.02),
           title="held-out success against update")  # fmt: skip
    a2.plot(times, success.to_numpy(), "o-", gid="success_by_time")
    a2.set(xlabel="time (s)", ylabel=f"success ({split})", ylim=(-0.02, 1.02),
           title="held-out success against wall time")  # fmt: skip
    return fig


FIGURES = {  # file stem -> (title, function)
    "lag_histogram": ("Lag of the used results", lag_histogram),
    "progress": ("Results and updates against wall time", progress),
    "idle_fraction": ("Idle fraction over time", idle_fraction),
    "reward_vs_lag": ("Reward against lag", reward_vs_lag),
    "held_out_success": ("Held-out success against update and wall time", held_out_success),
}
