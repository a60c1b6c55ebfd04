"""A measured run's uncontended work under the CPU shared moment by moment (``job.cpu``; a
CPU run with ``--durations turns``): the inverse of
:mod:`~staleness_sim.durations.moment_kernel`.

From the run's per-turn records the machine's moments are rebuilt exactly (no grid): at
every moment, the sessions in timed parts (an episode's time outside its generations) and
each worker's decode batch. The cores are shared among them by the kernel's own
:func:`~staleness_sim.durations.moment_kernel.shares` (max-min fairly: a thread a timed
session, ``engine_threads`` threads an engine wanting its demand), which gives every
moment a timed rate and each engine's rate. A timed part's uncontended seconds are its
measured seconds times the mean timed rate over it (per episode: the mean over its timed
time), a turn's uncontended generation seconds its measured ones times its engine's mean
rate over it. Workers on one machine are
counted together here (they share its cores), though a simulated worker has the cores to
itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from staleness_sim.durations import CpuShare
from staleness_sim.durations.moment_kernel import shares


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

    def shares(self, cpu: CpuShare) -> tuple[np.ndarray, np.ndarray]:
        """On every piece, the cores shared as the kernel shares them
        (:func:`~staleness_sim.durations.moment_kernel.shares`: a thread a timed session
        wanting a core; ``threads`` threads an engine, each engine wanting ``cpu``'s demand,
        the engines decoding at a moment counted together): the timed rate and each
        engine's rate (workers x pieces; 1 where it does not decode)."""
        if cpu.engine_cores is not None:
            raise ValueError("a run's moments take one engine demand, not engine_cores")
        decoding = self.batch > 0
        engines = decoding.sum(axis=0)
        threads, demand, cores = cpu.threads, float(cpu.engine), float(cpu.cores)
        rate_t, rate_e = np.ones(len(engines)), np.ones(len(engines))
        for k, (n, d) in enumerate(zip(self.timed.tolist(), engines.tolist(), strict=True)):
            rate_t[k], rate_e[k] = shares(n, d, cores, threads * d, demand * d)
        return rate_t, np.where(decoding, rate_e, 1.0)


class Moments:
    """The run's moments under ``cpu``: piecewise-constant timed and per-worker engine
    rates on the :class:`RunPieces`, and their integrals."""

    def __init__(self, eps: pd.DataFrame, worker: pd.Series, cpu: CpuShare) -> None:
        p = RunPieces(eps, worker)
        self.start, self.gen, self.worker, self.times = p.start, p.gen, p.worker, p.times
        rate_t, rate_e = p.shares(cpu)
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


def uncontended(eps: pd.DataFrame, worker: pd.Series, cpu: CpuShare) -> tuple[pd.DataFrame, str]:
    """``eps`` with its times made uncontended (per episode: its timed columns times its mean
    timed rate; per turn: ``turn_gen_uncontended_s``, its ``turn_gen_s`` times its
    engine's mean rate, and ``generation_s`` their sum; the measured intervals kept in
    ``turn_start`` and ``turn_gen_s``), and a line saying by how much."""
    m = Moments(eps, worker, cpu)
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
