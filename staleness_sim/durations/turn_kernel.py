"""The turn model's event loop (:mod:`~staleness_sim.durations.turns`): each job's whole
loop over turn boundaries in one call, its sessions in a few small arrays that stay in
cache, from the episodes drawn beforehand
(:class:`~staleness_sim.durations.turn_episodes.Episodes`). One source, compiled by numba
where it imports (the ``fast`` extra) and run as plain Python otherwise
(``STALENESS_SIM_NO_NUMBA=1`` too): the same arithmetic in the same order, so the same
jobs to the bit (``tests/sim/test_turn_kernel.py``). Compiled, a chunk's jobs run in
parts on several threads (:mod:`~staleness_sim.durations.kernel_threads`: the kernel
releases the GIL), with the same results whatever the split. The compiled kernel is
cached on disk (``cache=True``), so only the first run after an install compiles it.
"""

from __future__ import annotations

import os

import numpy as np

from staleness_sim.durations.kernel_threads import in_parts

try:
    from numba import njit
except ImportError:  # the fast extra is not installed: plain Python runs
    njit = None


def _jobs(turns, start, end, first, prompt, reply, command, c, episodes, base, per_ctx,
          per_batch, prefill, timeout, out):  # fmt: skip
    """Every job of the block, one after the other; ``out[0, j]`` is job ``j``'s makespan.
    Per session: ``when`` (a timed part: min(its end, deadline);
    decoding: the deadline), ``target`` (decoding: the virtual token count at which it
    ends), ``at`` (its turn in the turn arrays), the rest as in ``Block``. ``ds`` and
    ``ws`` are the first argmin of ``target`` and of ``when``, kept up to date."""
    inf = np.inf
    ng = (c + 3) // 4  # groups of 4 sessions, each group's least when and target kept
    when, target = np.full(4 * ng, inf), np.full(4 * ng, inf)
    wmin, tmin = np.empty(ng), np.empty(ng)
    wat, tat = np.empty(ng, np.int64), np.empty(ng, np.int64)
    deadline, ctx = np.empty(c), np.empty(c)
    end_s, pr, rp = np.empty(c), np.empty(c), np.empty(c)
    seg, nturns, at = np.empty(c, np.int64), np.empty(c, np.int64), np.empty(c, np.int64)
    dec = np.empty(c, np.bool_)
    for j in range(out.shape[1]):
        t = virt = held = 0.0
        batch, assigned, busy = 0, c, c
        for s in range(c):  # every session starts an episode at 0
            e = j * episodes + s
            nturns[s], end_s[s], seg[s], at[s] = turns[e], end[e], 0, first[e]
            pr[s], rp[s] = prompt[at[s]], reply[at[s]]
            deadline[s] = 0.0 + timeout
            when[s] = min(0.0 + start[e] + prefill * pr[s], deadline[s])
            target[s], ctx[s], dec[s] = inf, 0.0, False
        for g in range(ng):
            _regroup(when, wmin, wat, g)
            _regroup(target, tmin, tat, g)
        ds, ws = tat[_argmin(tmin, ng)], wat[_argmin(wmin, ng)]
        while busy > 0:
            soonest, first_target = when[ws], target[ds]
            bb = max(batch, 1)
            step = max(base[bb] + per_ctx * held, per_batch * bb)
            t_dec = t + (first_target - virt) * step if batch > 0 else inf
            is_dec = t_dec <= soonest
            t_next = t_dec if is_dec else soonest
            if not np.isfinite(t_next):  # cannot happen while a session is busy
                break
            adv = first_target if is_dec else virt + (t_next - t) / step
            if batch > 0:
                virt = adv
            t = t_next
            if is_dec:  # a decode ended: its command, then the next prefill or the end
                s = ds
                batch -= 1
                held -= ctx[s]
                dec[s], ctx[s] = False, 0.0
                ds = _put(target, tmin, tat, s, inf, ng)
                cmd, tail = _after_decode(s, at, seg, nturns, pr, rp, prompt, reply, command,
                                          end_s, prefill)  # fmt: skip
                ws = _lower(when, wmin, wat, s, min(t + cmd + tail, deadline[s]), ws)
                continue
            s = ws
            over = True
            if deadline[s] <= t:  # cut at its deadline (a decoder is due only then)
                if dec[s]:  # it leaves the batch
                    batch -= 1
                    held -= ctx[s]
                    dec[s], ctx[s] = False, 0.0
                    ds = _put(target, tmin, tat, s, inf, ng)
            elif seg[s] < nturns[s]:  # a timed part ended: decode the next turn
                ds = _lower(target, tmin, tat, s, virt + rp[s], ds)
                ctx[s] = pr[s] + rp[s] / 2
                dec[s] = True
                batch += 1
                held += ctx[s]
                over = False
            if not over:  # due again only at its deadline
                ws = _put(when, wmin, wat, s, deadline[s], ng)
            elif assigned == episodes:  # the episode is over, and the job's episodes
                busy -= 1
                deadline[s] = inf
                ws = _put(when, wmin, wat, s, inf, ng)
            else:  # the episode is over: the job's next episode, on this session
                e = j * episodes + assigned
                assigned += 1
                nturns[s], end_s[s], seg[s], at[s] = turns[e], end[e], 0, first[e]
                pr[s], rp[s] = prompt[at[s]], reply[at[s]]
                deadline[s] = t + timeout
                ws = _put(when, wmin, wat, s, min(t + start[e] + prefill * pr[s], deadline[s]), ng)
        out[0, j] = t


def _after_decode(s, at, seg, nturns, pr, rp, prompt, reply, command, end_s, prefill):
    """Session ``s``'s decode ended: it moves to its next turn (its prompt and reply in
    ``pr`` and ``rp``) and returns the seconds of its timed part: the turn's command, then
    the next turn's prefill or, after its last turn, the episode's end."""
    cmd = command[at[s]]
    if seg[s] + 1 < nturns[s]:
        at[s] += 1
        pr[s], rp[s] = prompt[at[s]], reply[at[s]]
    seg[s] += 1
    return cmd, (prefill * pr[s] if seg[s] < nturns[s] else end_s[s])


def _argmin(x, c):
    """The first index of the least of ``x[:c]``, as numpy's argmin."""
    best, at = x[0], 0
    for k in range(1, c):
        if x[k] < best:
            best, at = x[k], k
    return at


def _regroup(x, gmin, gat, g):
    """Group ``g``'s least value of ``x`` and its first index."""
    o = 4 * g
    at = o + _argmin(x[o : o + 4], 4)
    gmin[g], gat[g] = x[at], at


def _put(x, gmin, gat, s, v, ng):
    """``x[s] = v``; returns the first index of the least of ``x``, from the least of its
    groups (a search of c / 4 + 4 values instead of c: measured 25 ns instead of 37 for
    32 sessions)."""
    x[s] = v
    _regroup(x, gmin, gat, s >> 2)
    return gat[_argmin(gmin, ng)]


def _lower(x, gmin, gat, s, v, least):
    """``x[s] = v`` where ``x[s]`` only goes down, ``least`` being the first index of the
    least of ``x`` before: it is ``least`` or ``s`` after (no search)."""
    x[s] = v
    _regroup(x, gmin, gat, s >> 2)
    return s if v < x[least] or (v == x[least] and s < least) else least


if njit is not None:
    # not inline="always": numba's own inlining of it doubled the loop's time (measured);
    # LLVM inlines it anyway
    _after_decode = njit(cache=True)(_after_decode)
    _argmin = njit(cache=True, inline="always")(_argmin)
    _regroup = njit(cache=True, inline="always")(_regroup)
    _put = njit(cache=True, inline="always")(_put)
    _lower = njit(cache=True, inline="always")(_lower)
    # error_model="numpy": a float division needs no zero check (a step is > 0): 4 % faster
    # nogil: a chunk's jobs run in parts on several threads (kernel_threads)
    _compiled = njit(cache=True, error_model="numpy", nogil=True)(_jobs)
else:
    _compiled = None


def plain() -> bool:
    """Whether the kernels run as plain Python (no numba, or ``STALENESS_SIM_NO_NUMBA=1``)."""
    return _compiled is None or os.environ.get("STALENESS_SIM_NO_NUMBA", "") == "1"


def turn_jobs(engine, episodes: int, timeout: float, c: int):
    """A function of a block's :class:`~staleness_sim.durations.turn_episodes.Episodes` and
    its number of jobs ``n`` giving their makespans."""
    base, per_ctx, per_batch = engine.step_terms(c)
    args = (c, episodes, base, per_ctx, per_batch, float(engine.prefill_s_per_token),
            float(timeout))  # fmt: skip
    python = plain()
    run = _jobs if python else _compiled

    def simulate(eps, n: int) -> np.ndarray:
        # plain Python holds the GIL: threads would only take turns
        return in_parts(run, eps, n, episodes, 1, args, parts=1 if python else None)[0]

    return simulate
