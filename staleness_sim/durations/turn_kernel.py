"""The turn model's lockstep step compiled with numba (the optional ``fast`` extra): the same
two halves as :class:`~staleness_sim.durations.turn_steps.NumpySteps`, the same arithmetic
in the same order, job by job in a loop instead of numpy calls over the block, so the
results are the same to the bit. Numpy's cost was a fixed overhead per call, dozens of
calls a step; here a step is two calls.

``compiled_steps`` returns None (and the numpy steps run) where numba does not import or
``STALENESS_SIM_NO_NUMBA=1``. The kernels are cached on disk (``cache=True``), so only
the first run after an install compiles them.
"""

from __future__ import annotations

import os

import numpy as np

from staleness_sim.durations.turn_steps import (
    CTX,
    DEADLINE,
    DEC,
    END_S,
    NTURNS,
    PROMPT,
    REPLY,
    SEG,
)

try:
    from numba import njit
except ImportError:  # the fast extra is not installed: the numpy steps run
    njit = None


def _events(when, target, f, fj, ij, am, base, per_ctx, per_batch, c, episodes, out):
    """NumpySteps.events, job by job; the lists go into the rows of ``out`` (ended, more,
    starts, numbers, and the cut sessions as scratch); returns their lengths. ``am`` holds
    each job's argmin of ``target`` and of ``when`` (kept up to date, not searched for at
    every step)."""
    t, virt, held, timed, decoding = fj[0], fj[1], fj[2], fj[3], fj[4]
    batch, assigned, busy = ij[0], ij[1], ij[2]
    ended, more, starts, numbers, cuts = out[0], out[1], out[2], out[3], out[4]
    ne = nm = no = nc = 0
    inf = np.inf
    for j in range(len(t)):
        if busy[j] == 0:  # done: every time is inf, nothing happens (as in numpy)
            continue
        ds, ws = am[0, j], am[1, j]
        first, soonest = target[ds], when[ws]
        bb = max(batch[j], 1)
        step = max(base[bb] + per_ctx * held[j], per_batch * bb)
        t_dec = t[j] + (first - virt[j]) * step if batch[j] > 0 else inf
        is_dec = t_dec <= soonest
        t_next = t_dec if is_dec else soonest
        if not np.isfinite(t_next):
            continue
        adv = first if is_dec else virt[j] + (t_next - t[j]) / step
        dt = t_next - t[j]
        timed[j] += (busy[j] - batch[j]) * dt
        decoding[j] += dt if batch[j] > 0 else 0.0
        if batch[j] > 0:
            virt[j] = adv
        t[j] = t_next
        if is_dec:  # a decode ended: its command and what follows come with the draws
            batch[j] -= 1  # it leaves the batch
            held[j] -= f[ds, CTX]
            f[ds, DEC], target[ds], f[ds, CTX] = 0, inf, 0.0
            am[0, j] = _argmin(target, j * c, c)
            ended[ne] = ds
            ne += 1
            if f[ds, SEG] + 1 < f[ds, NTURNS]:
                more[nm] = ds
                nm += 1
            continue
        if f[ws, DEADLINE] <= t[j]:  # cut at its deadline (a decoder is due only then)
            if f[ws, DEC] > 0:  # it leaves the batch
                batch[j] -= 1
                held[j] -= f[ws, CTX]
                f[ws, DEC], target[ws], f[ws, CTX] = 0, inf, 0.0
                if ws == ds:
                    am[0, j] = _argmin(target, j * c, c)
            cuts[nc] = ws
            nc += 1
            when[ws] = f[ws, DEADLINE] = inf
        elif f[ws, SEG] < f[ws, NTURNS]:  # a timed part ended: decode the next turn
            target[ws] = virt[j] + f[ws, REPLY]
            if target[ws] < first or (target[ws] == first and ws < ds):
                am[0, j] = ws
            f[ws, CTX] = f[ws, PROMPT] + f[ws, REPLY] / 2
            f[ws, DEC] = 1
            when[ws] = f[ws, DEADLINE]
            batch[j] += 1
            held[j] += f[ws, CTX]
        else:  # the episode is over
            starts[no] = ws
            no += 1
            when[ws] = f[ws, DEADLINE] = inf
        am[1, j] = _argmin(when, j * c, c)
    for k in range(nc):  # over: the ended episodes first, then the cut ones (numpy's order)
        starts[no + k] = cuts[k]
    ns = 0
    for k in range(no + nc):
        s = starts[k]
        j = s // c
        if assigned[j] < episodes:
            starts[ns], numbers[ns] = s, assigned[j]
            assigned[j] += 1
            ns += 1
        else:
            busy[j] -= 1
    return ne, nm, ns


def _argmin(x, o, c):
    """The first index of the least of ``x[o:o + c]``, as numpy's argmin."""
    best, at = x[o], o
    for k in range(o + 1, o + c):
        if x[k] < best:
            best, at = x[k], k
    return at


def _apply(when, f, rows, t, am, c, prefill, timeout, ended, more, starts, draws, turns, row):
    """NumpySteps.apply, session by session. ``draws`` rows: the commands of ``ended``, the
    prompts and replies of ``more``, then for ``starts`` their start, end, and first
    prompt and reply (each row as long as its sessions). A session's ``when`` only goes
    down here (from its deadline, or from inf): it may become its job's argmin."""
    for k in range(len(more)):
        f[more[k], PROMPT], f[more[k], REPLY] = draws[1, k], draws[2, k]
    for k in range(len(ended)):
        s = ended[k]
        j = s // c
        f[s, SEG] += 1
        tail = prefill * f[s, PROMPT] if f[s, SEG] < f[s, NTURNS] else f[s, END_S]
        when[s] = min(t[j] + draws[0, k] + tail, f[s, DEADLINE])
        a = am[1, j]
        if when[s] < when[a] or (when[s] == when[a] and s < a):
            am[1, j] = s
    for k in range(len(starts)):
        s = starts[k]
        j = s // c
        now = t[j]
        f[s, NTURNS], f[s, END_S], rows[s], f[s, SEG] = turns[k], draws[4, k], row[k], 0
        f[s, PROMPT], f[s, REPLY] = draws[5, k], draws[6, k]
        f[s, DEADLINE] = now + timeout
        when[s] = min(now + draws[3, k] + prefill * draws[5, k], f[s, DEADLINE])
        a = am[1, j]
        if when[s] < when[a] or (when[s] == when[a] and s < a):
            am[1, j] = s


if njit is not None:
    _argmin = njit(cache=True, inline="always")(_argmin)  # measured: 0.1 s less than a call
    _events = njit(cache=True)(_events)
    _apply = njit(cache=True)(_apply)


class CompiledSteps:
    """NumpySteps' interface over the compiled kernels, for a block of ``n`` jobs."""

    def __init__(self, engine, episodes: int, timeout: float, n: int, c: int) -> None:
        self.base, self.per_ctx, self.per_batch = engine.step_terms(c)
        self.episodes, self.timeout = episodes, float(timeout)
        self.prefill = float(engine.prefill_s_per_token)
        self.out = np.zeros((5, n), np.int64)
        self.am = np.arange(n)[None, :] * c + np.zeros((2, 1), np.int64)  # all inf: the first
        self.draws = np.zeros((7, n * c))

    def events(self, b):
        ne, nm, ns = _events(
            b.when, b.target, b.f, b.fj, b.ij, self.am, self.base, self.per_ctx, self.per_batch, b.c,
            self.episodes, self.out,
        )  # fmt: skip
        out = self.out
        return out[0, :ne], out[1, :nm], out[2, :ns], out[3, :ns]

    def apply(self, b, ended, more, starts, cmd, turn, episode, first) -> None:
        d, ne, nm, ns = self.draws, len(ended), len(more), len(starts)
        turns = row = _NONE
        if ne:
            d[0, :ne], d[1, :nm], d[2, :nm] = cmd, *turn
        if ns:
            turns, d[3, :ns], d[4, :ns], row = episode
            d[5, :ns], d[6, :ns] = first
            turns, row = _as_int(turns), _as_int(row)
        _apply(
            b.when, b.f, b.row, b.t, self.am, b.c, self.prefill, self.timeout, ended, more, starts, d,
            turns, row,
        )  # fmt: skip


_NONE = np.zeros(0, np.int64)


def _as_int(x):
    return np.ascontiguousarray(x, dtype=np.int64)


def compiled_steps(engine, episodes: int, timeout: float, n: int, c: int) -> CompiledSteps | None:
    """The compiled steps, or None where numba is missing or ``STALENESS_SIM_NO_NUMBA=1``."""
    if njit is None or os.environ.get("STALENESS_SIM_NO_NUMBA", "") == "1":
        return None
    return CompiledSteps(engine, episodes, timeout, n, c)
