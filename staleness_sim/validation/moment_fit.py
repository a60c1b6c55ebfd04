"""A measured run's uncontended work under the CPU shared moment by moment (``--cpu-share
moment``, ``job.cpu.share: moment``): the inverse of
:mod:`~staleness_sim.durations.moment_kernel`.

From the run's per-turn records the machine's moments are rebuilt exactly (no grid): at
every moment, the sessions in timed parts (an episode's time outside its generations) and
each worker's decode batch. The cores are shared among them as the kernel shares them
(max-min fairly: a thread a timed session, ``engine_threads`` threads an engine wanting
``engine_cores`` at its batch), which gives every moment a timed rate and each engine's
rate. A timed part's uncontended seconds are its measured seconds times the mean timed
rate over it (per episode: the mean over its timed time), a turn's uncontended generation
seconds its measured ones times its engine's mean rate over it. Workers on one machine are
counted together here (they share its cores), though a simulated worker has the cores to
itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from staleness_sim.core.trace import TraceError
from staleness_sim.durations import CpuShare
from staleness_sim.validation.run import MeasuredRun


def fair_levels(wants: np.ndarray, counts: np.ndarray, cores: float) -> np.ndarray:
    """Row by row, the water level of max-min fair shares of ``cores`` among ``counts[k]``
    threads each wanting ``wants[k]`` (inf where all are met): water-filling over groups
    of equal wants, the smaller met first while the level allows, every moment at once."""
    order = np.argsort(wants, axis=1, kind="stable")
    want = np.take_along_axis(wants, order, axis=1)
    count = np.take_along_axis(counts, order, axis=1).astype(float)
    left, waiting = np.full(len(want), float(cores)), count.sum(axis=1)
    level, open_ = np.full(len(want), np.inf), np.ones(len(want), bool)
    for k in range(want.shape[1]):
        with np.errstate(divide="ignore", invalid="ignore"):
            share = left / waiting
        stop = open_ & (count[:, k] > 0) & (want[:, k] > share)
        level[stop] = share[stop]
        open_ &= ~stop
        left -= np.where(open_, count[:, k] * want[:, k], 0.0)
        waiting -= count[:, k]
    return level


class RunPieces:
    """The run's moments as the CPU does not change them: on the sorted times of every
    episode and turn boundary, the sessions in timed parts and each worker's decode batch,
    piecewise constant. Every episode has at least one turn (as
    :func:`~staleness_sim.validation.turn_fit.run_episodes` keeps)."""

    def __init__(self, eps: pd.DataFrame, worker: pd.Series) -> None:
        workers = sorted(set(worker.astype(int)) | {0})
        col = {w: i for i, w in enumerate(workers)}
        w_of = eps["job_id"].map(worker).fillna(0).astype(int).map(col).to_numpy()
        self.start, self.gen = (np.concatenate(eps[c].to_numpy()).astype(float)
                                for c in ("turn_start", "turn_gen_s"))  # fmt: skip
        self.worker = np.repeat(w_of, eps["turns"].to_numpy(int))
        t0, t1 = eps["start_time"].to_numpy(float), eps["end_time"].to_numpy(float)
        self.times = np.unique(np.concatenate([t0, t1, self.start, self.start + self.gen]))
        self.timed = np.maximum(
            self._open(t0, t1) - self._open(self.start, self.start + self.gen), 0
        )
        self.batch = np.array([self._open(self.start[self.worker == w],
                                          (self.start + self.gen)[self.worker == w])
                               for w in range(len(workers))])  # fmt: skip

    def _open(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """How many of the intervals [a, b) are open on each piece."""
        at = self.times[:-1]
        return np.searchsorted(np.sort(a), at, side="right") - np.searchsorted(
            np.sort(b), at, side="right"
        )

    def shares(self, cpu: CpuShare) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """On every piece, as the kernel shares ``cpu``'s cores (max-min fairly: a thread a
        timed session wanting ``timed_demand``, ``threads`` threads an engine wanting its
        demand at its batch): the timed rate, each engine's rate (workers x pieces), and
        the cores the timed parts and the engines use (their wants times their rates)."""
        part = float(cpu.timed_demand)
        demand = np.interp(self.batch, *cpu.demand_curve())  # linear between the points
        decoding = self.batch > 0
        each = np.where(decoding, demand / cpu.threads, 0.0)
        wants = np.vstack([np.full(len(self.timed), part), each]).T
        counts = np.vstack([self.timed, np.where(decoding, cpu.threads, 0)]).T
        level = fair_levels(wants, counts, cpu.cores)
        rate_t = np.where(self.timed > 0, np.minimum(part, level) / part, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate_e = np.where(decoding & (each > 0), np.minimum(each, level) / each, 1.0)
        used_t = self.timed * part * rate_t
        used_e = np.where(decoding, demand * rate_e, 0.0).sum(axis=0)
        return rate_t, rate_e, used_t, used_e

    def within(self, windows: np.ndarray) -> np.ndarray:
        """Each piece's seconds inside the windows (rows ``[a, b)``)."""
        t0, t1 = self.times[:-1], self.times[1:]
        inside = np.zeros(len(t0))
        for a, b in windows:
            inside += np.clip(np.minimum(t1, b) - np.maximum(t0, a), 0.0, None)
        return inside


class Moments:
    """The run's moments under ``cpu``: piecewise-constant timed and per-worker engine
    rates on the :class:`RunPieces`, and their integrals."""

    def __init__(self, eps: pd.DataFrame, worker: pd.Series, cpu: CpuShare,
                 pieces: RunPieces | None = None) -> None:  # fmt: skip
        p = pieces if pieces is not None else RunPieces(eps, worker)
        self.start, self.gen, self.worker, self.times = p.start, p.gen, p.worker, p.times
        rate_t, rate_e, _, _ = p.shares(cpu)
        span = np.diff(self.times)
        self._int_t = np.concatenate([[0.0], np.cumsum(rate_t * span)])
        self._int_e = np.column_stack([np.zeros(len(rate_e)), np.cumsum(rate_e * span, axis=1)])

    def timed_work(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The integral of the timed rate over each [a, b)."""
        return np.interp(b, self.times, self._int_t) - np.interp(a, self.times, self._int_t)

    def engine_work(self, a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
        """The integral of worker ``w``'s engine rate over each [a, b)."""
        out = np.empty(len(a))
        for x in np.unique(w):
            on = w == x
            f = self._int_e[x]
            out[on] = np.interp(b[on], self.times, f) - np.interp(a[on], self.times, f)
        return out


def uncontended(eps: pd.DataFrame, worker: pd.Series, cpu: CpuShare,
                pieces: RunPieces | None = None) -> tuple[pd.DataFrame, str]:  # fmt: skip
    """``eps`` with its times made uncontended (per episode: its timed columns times its mean
    timed rate; per turn: ``turn_gen_uncontended_s``, its ``turn_gen_s`` times its
    engine's mean rate, and ``generation_s`` their sum; the measured intervals kept in
    ``turn_start`` and ``turn_gen_s``), and a line saying by how much."""
    m = Moments(eps, worker, cpu, pieces)
    start, gen, end = m.start, m.gen, m.start + m.gen
    gen_rate = np.ones(len(gen))
    on = gen > 0
    gen_rate[on] = m.engine_work(start[on], end[on], m.worker[on]) / gen[on]
    new_gen = gen * gen_rate
    first = np.concatenate([[0], np.cumsum(eps["turns"].to_numpy(int))[:-1]])
    per_episode = lambda x: np.add.reduceat(x, first)  # noqa: E731 (every episode has a turn)
    gen_old, gen_new = per_episode(gen), per_episode(new_gen)
    t0, t1 = eps["start_time"].to_numpy(float), eps["end_time"].to_numpy(float)
    timed_work = m.timed_work(t0, t1) - per_episode(m.timed_work(start, end))
    rate = np.clip(timed_work / np.maximum(t1 - t0 - gen_old, 1e-12), 0.0, 1.0)
    out = eps.copy()
    out["turn_gen_uncontended_s"] = list(np.split(new_gen, first[1:]))
    for c in ("container_s", "sandbox_start_s", "verify_s"):
        out[c] = eps[c].to_numpy(float) * rate
    out["duration_s"] = (eps["duration_s"].to_numpy(float) - gen_old) * rate + gen_new
    out["generation_s"] = gen_new
    what = (
        f"timed parts ran at {rate.min():.2f} to {rate.max():.2f} of their want (mean "
        f"{rate.mean():.2f}), the engine at {gen_rate[on].mean():.2f} of its demand on average"
    )
    return out, what


BUSY_KEYS = ("machine_busy_cores", "process_busy_cores")  # the runner's CPU_USE_KEYS


def recorded_busy(run: MeasuredRun) -> np.ndarray:
    """Rows ``(start, end, machine busy cores, process busy cores)``: the run's segments
    that recorded both (``meta.json``; runs since 2026-12-06, not a segment ended by a
    kill), each from its start to the next one's (the last to the run's end). The run's
    process must hold its workers' engines (``backend: local``)."""
    backend = run.config.get("placement", run.config.get("backend", "local"))  # old name
    if backend != "local":
        raise TraceError(
            f"{run.folder}: --cpu-share measured needs backend: local (the run's process "
            f"holds its engines), got backend: {backend}"
        )
    segments = list(run.trace.meta.get("segments", []))
    eps = run.episodes
    end = float(run.trace.jobs["end_time"].max())
    if eps is not None and len(eps):
        end = max(end, float(eps["end_time"].max()))
    starts = [float(s.get("t", 0.0)) for s in segments]
    rows = [
        (a, b, float(s[BUSY_KEYS[0]]), float(s[BUSY_KEYS[1]]))
        for s, a, b in zip(segments, starts, [*starts[1:], end], strict=True)
        if all(k in s for k in BUSY_KEYS) and b > a
    ]
    if not rows:
        raise TraceError(
            f"{run.folder}: --cpu-share measured needs the busy cores a run records "
            f"({' and '.join(BUSY_KEYS)} in meta.json's segments, since 2026-12-06); "
            "this run has none"
        )
    return np.array(rows)


def scaled(cpu: CpuShare, part: float, engine: float) -> CpuShare:
    """``cpu`` with a timed part wanting ``part`` of a core and the engine ``engine`` times
    its demand (its curve, or its one number), its threads kept."""
    data = cpu.model_dump(exclude_none=True) | {"timed_demand": part, "engine_threads": cpu.threads}
    if cpu.engine_cores is not None:
        curve = cpu.engine_cores
        data["engine_cores"] = {"batch": curve.batch, "cores": [c * engine for c in curve.cores]}
    else:
        data["engine_demand"] = cpu.engine * engine
    return CpuShare(**data)


LEAST_WANT = 0.01  # the least a timed part or the engine is fitted to want (of the given)


def fit_wants(pieces: RunPieces, cpu: CpuShare, busy: np.ndarray) -> tuple[CpuShare, str]:
    """What a timed part and the engine wanted, fitted so that the cores they use over the
    run's moments (:meth:`RunPieces.shares`) are the busy cores the run recorded: the
    engines the run's process used (``process_busy_cores``, its orchestrator and docker
    clients counted with them), the timed parts the rest of the machine
    (``machine_busy_cores`` less that: containers, the docker daemon). Two bisections,
    each want between :data:`LEAST_WANT` and what ``cpu`` gives (a core a timed part, the
    engine's given demand): for a timed part's want, the engine's scale that uses the
    process's cores; then the timed want that uses the rest. A machine whose CPU was
    saturated leaves the wants at the given ones; an idle one lowers them.
    Returns ``cpu`` with the fitted wants and a line saying what they are."""
    inside = pieces.within(busy[:, :2])
    seconds = busy[:, 1] - busy[:, 0]
    target_t = float(((busy[:, 2] - busy[:, 3]).clip(0) * seconds).sum())
    target_e = float((busy[:, 3] * seconds).sum())

    def used(part: float, engine: float) -> tuple[float, float]:
        _, _, used_t, used_e = pieces.shares(scaled(cpu, part, engine))
        return float(used_t @ inside), float(used_e @ inside)

    def bisect(f, target: float) -> float:  # f increasing on [LEAST_WANT, 1]
        lo, hi = LEAST_WANT, 1.0
        if f(hi) <= target:
            return hi
        if f(lo) >= target:
            return lo
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
        return (lo + hi) / 2

    engine_for = lambda part: bisect(lambda e: used(part, e)[1], target_e)  # noqa: E731
    part = bisect(lambda p: used(p, engine_for(p))[0], target_t)
    engine = engine_for(part)
    fitted = scaled(cpu, part, engine)
    got_t, got_e = used(part, engine)
    total = float(seconds.sum())
    what = (
        f"a timed part wanting {part:.3g} of a core and the engine {engine:.3g} of "
        f"{'its curve' if cpu.engine_cores is not None else f'{cpu.engine:g} cores'}, fitted "
        f"to the recorded busy cores: the machine {(target_t + target_e) / total:.2f} "
        f"(fitted {(got_t + got_e) / total:.2f}), the run's process {target_e / total:.2f} "
        f"(fitted {got_e / total:.2f})"
    )
    return fitted, what
