"""The turn model with the CPU shared moment by moment (``job.cpu``): a CPU run,
where one worker's containers and its engine compete for a few cores.

At every moment the ``cores`` are shared max-min fairly (water-filling) among threads:
each session in a timed part (a sandbox start, a command with the next prefill, a
verifier) is one thread wanting a core; the engine, while it decodes a batch of ``b``, is
``engine_threads`` threads wanting ``u(b)`` cores between them (``engine_cores``: what it
keeps busy alone). A timed part then advances at its thread's share of a core (its
seconds are uncontended seconds), a decode step takes the engine's uncontended step over
its share of its demand. Shares change at every event, so an event's time is the least of
every session's work left over its rate; the sessions are few (a CPU run), so each event
scans them all.

One job at a time, one function, compiled by numba where it imports (the ``fast`` extra)
and run as plain Python otherwise (``STALENESS_SIM_NO_NUMBA=1``): the same arithmetic in
the same order, so the same jobs to the bit (``tests/sim/test_moment_kernel.py``). Compiled,
a chunk's jobs run in parts on several threads, as the turn kernel's.
"""

from __future__ import annotations

import numpy as np

from staleness_sim.durations.kernel_threads import in_parts
from staleness_sim.durations.turn_kernel import _after_decode, plain

try:
    from numba import njit
except ImportError:  # the fast extra is not installed: plain Python runs
    njit = None

IDLE, TIMED, DECODING = 0, 1, 2


def shares(n_timed, batch, cores, threads, demand):
    """``(timed rate, engine rate)``: the share of its core each of ``n_timed`` timed
    threads gets, and the share of its demand ``demand`` (cores, over
    ``threads`` threads) the engine gets while decoding ``batch > 0`` sequences; 1 where
    the cores suffice, and where there is no such thread. The water level of max-min
    fairness in closed form for two kinds of thread: the smaller wants are met first if
    the level allows, and the other kind shares what they leave."""
    if batch == 0:
        return (min(1.0, cores / n_timed) if n_timed > 0 else 1.0), 1.0
    if n_timed + demand <= cores:
        return 1.0, 1.0
    each = demand / threads  # what one engine thread wants
    level = cores / (n_timed + threads)  # every thread's share if none is met in full
    if each <= 1.0 and each <= level:  # the engine's threads are met; timed share the rest
        return (cores - demand) / n_timed, 1.0
    if each > 1.0 and level >= 1.0:  # the timed threads are met; the engine has the rest
        return 1.0, (cores - n_timed) / demand
    return (level if n_timed > 0 else 1.0), level / each


def _demand(batch, xs, ys):
    """The engine's demand at ``batch``: linear between the curve's points, flat beyond."""
    if batch <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if batch <= xs[i]:
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (batch - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[len(ys) - 1]


def _jobs(turns, start, end, first, prompt, reply, command, c, episodes, base, per_ctx,
          per_batch, prefill, timeout, cores, threads, demand_batch, demand_cores,
          out):  # fmt: skip
    """Every job of the block, one after the other; ``out[0, j]`` is job ``j``'s makespan.
    Per session: ``phase``, ``left`` (a timed part's uncontended seconds, a decode's
    tokens), ``deadline`` and the turn it is at, as in the compiled turn kernel."""
    phase, left = np.zeros(c, np.int64), np.zeros(c)
    deadline, ctx = np.zeros(c), np.zeros(c)
    end_s, pr, rp = np.zeros(c), np.zeros(c), np.zeros(c)
    seg, nturns, at = np.zeros(c, np.int64), np.zeros(c, np.int64), np.zeros(c, np.int64)
    for j in range(out.shape[1]):
        t = held = 0.0
        n_timed, batch, assigned, busy = 0, 0, 0, 0
        for s in range(c):  # every session starts an episode at 0
            e = j * episodes + assigned
            assigned += 1
            busy += 1
            nturns[s], end_s[s], seg[s], at[s] = turns[e], end[e], 0, first[e]
            pr[s], rp[s] = prompt[at[s]], reply[at[s]]
            deadline[s] = timeout
            phase[s], left[s] = TIMED, start[e] + prefill * pr[s]
            n_timed += 1
        while busy > 0:
            demand = _demand(max(batch, 1), demand_batch, demand_cores)
            r_timed, r_engine = shares(n_timed, batch, cores, threads, demand)
            bb = max(batch, 1)
            step = max(base[bb] + per_ctx * held, per_batch * bb) / r_engine
            # the next event: the first session whose part ends or whose deadline comes
            dt, s, cut = np.inf, -1, False
            for k in range(c):
                if phase[k] == IDLE:
                    continue
                due = left[k] / r_timed if phase[k] == TIMED else left[k] * step
                if due < dt:
                    dt, s, cut = due, k, False
                if deadline[k] - t <= dt:  # a part ending at its deadline is cut
                    dt, s, cut = deadline[k] - t, k, True
            dt = max(dt, 0.0)
            t += dt
            for k in range(c):
                if phase[k] == TIMED:
                    left[k] -= dt * r_timed
                elif phase[k] == DECODING:
                    left[k] -= dt / step
            over = cut
            if phase[s] == DECODING:
                batch -= 1
                held -= ctx[s]
                if not cut:  # its command, then the next prefill (or the end)
                    cmd, tail = _after_decode(s, at, seg, nturns, pr, rp, prompt, reply,
                                              command, end_s, prefill)  # fmt: skip
                    phase[s], left[s] = TIMED, cmd + tail
                    n_timed += 1
            else:
                n_timed -= 1
                if not cut and seg[s] < nturns[s]:  # decode the next turn
                    ctx[s] = pr[s] + rp[s] / 2
                    phase[s], left[s] = DECODING, rp[s]
                    batch += 1
                    held += ctx[s]
                elif not cut:
                    over = True
            if not over:
                continue
            if assigned == episodes:  # the job's episodes are all given out
                phase[s] = IDLE
                busy -= 1
                continue
            e = j * episodes + assigned  # the job's next episode, on this session
            assigned += 1
            nturns[s], end_s[s], seg[s], at[s] = turns[e], end[e], 0, first[e]
            pr[s], rp[s] = prompt[at[s]], reply[at[s]]
            deadline[s] = t + timeout
            phase[s], left[s] = TIMED, start[e] + prefill * pr[s]
            n_timed += 1
        out[0, j] = t


if njit is not None:
    shares = njit(cache=True, inline="always")(shares)
    _demand = njit(cache=True, inline="always")(_demand)
    _compiled = njit(cache=True, error_model="numpy", nogil=True)(_jobs)
else:
    _compiled = None


def moment_jobs(engine, episodes: int, timeout: float, c: int, cpu):
    """A function of a block's :class:`~staleness_sim.durations.turn_episodes.Episodes` and its
    number of jobs ``n`` giving their makespans, the CPU shared as ``cpu`` says."""
    base, per_ctx, per_batch = engine.step_terms(c)
    python = plain()
    run = _jobs if python else _compiled
    batch, demand = cpu.demand_curve()
    args = (c, episodes, base, per_ctx, per_batch, float(engine.prefill_s_per_token),
            float(timeout), float(cpu.cores), float(cpu.threads), batch, demand)  # fmt: skip

    def simulate(eps, n: int) -> np.ndarray:
        # plain Python holds the GIL: threads would only take turns
        return in_parts(run, eps, n, episodes, 1, args, parts=1 if python else None)[0]

    return simulate
