"""One lockstep step of the turn model (:mod:`staleness_sim.durations.turns`) over a block of
jobs, in numpy: the block's state (:class:`Block`) and the two halves of a step.

A step handles exactly one event per job (the job's next decode end, timed end or
deadline). It comes in two halves around the random draws, which the caller makes in
between, in the same order whatever runs the halves (so this and the compiled
:mod:`~staleness_sim.durations.turn_kernel` give the same jobs from the same stream):

- ``events``: advance every job to its next event and apply what needs no draw; list the
  decodes that ended (``ended``, in job order), those of them with a turn to come
  (``more``), and the sessions that start their job's next episode (``starts``, with the
  episode's number in its job);
- ``apply``: the draws for them (commands, next turns, new episodes) go in.
"""

from __future__ import annotations

import numpy as np

# Columns of a session's record in Block.f (the counts too: exact as floats).
DEADLINE, CTX, END_S, PROMPT, REPLY, SEG, NTURNS, DEC = range(8)


class Block:
    """``n`` jobs of ``c`` sessions each, session ``k`` of job ``j`` at ``j * c + k``.

    Per session: ``when`` (a timed part: min(its end, deadline); decoding: the deadline),
    ``target`` (decoding: the virtual token count at which it ends), ``deadline``, ``ctx``
    (the context it holds while decoding: prompt + half reply), ``end_s``, ``prompt``,
    ``reply``, ``seg`` (the turn it is in), ``nturns``, ``row`` (its episode's table
    row), ``dec`` (1 while decoding). Per job: ``t``, ``virt`` (tokens a sequence in the
    batch has decoded since time 0), ``held`` (the context the batch holds), ``batch``
    (sessions decoding), ``assigned`` (episodes started), ``busy`` (sessions with an
    episode), and two integrals over time for the CPU a job's parts share (``job.cpu``):
    ``timed`` (of the sessions in a timed part: busy less batch) and ``decoding`` (of the
    time the batch is not empty).

    ``when`` and ``target`` are searched job by job, so each is one array; a session's
    other fields but ``row`` are one record (a row of ``f``, one 64-byte cache line), so
    that handling an event touches one line, not seven (a block of 4,096 jobs of 32
    sessions is larger than the cache; measured: the compiled ``apply`` takes 30 us a
    step instead of 40 to 55). The named fields are views.
    """

    def __init__(self, n: int, c: int) -> None:
        self.n, self.c = n, c
        self.when, self.target = np.full(n * c, np.inf), np.full(n * c, np.inf)
        self.f = _on_lines((n * c, 8))
        self.row = np.zeros(n * c, np.int64)
        self.fj = np.zeros((5, n))
        self.ij = np.zeros((3, n), np.int64)
        self.deadline, self.ctx, self.end_s, self.prompt, self.reply = self.f.T[:5]
        self.seg, self.nturns, self.dec = self.f.T[5:]
        self.t, self.virt, self.held, self.timed, self.decoding = self.fj
        self.batch, self.assigned, self.busy = self.ij
        self.deadline[:] = np.inf
        self.assigned[:] = self.busy[:] = c


def _on_lines(shape: tuple[int, int]) -> np.ndarray:
    """Float zeros whose rows start on 64-byte cache lines."""
    size = shape[0] * shape[1] * 8
    raw = np.zeros(size + 64, np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip : skip + size].view(np.float64).reshape(shape)


class NumpySteps:
    """The two halves of a step, vectorised over the block's jobs."""

    def __init__(self, engine, episodes: int, timeout: float) -> None:
        self.engine, self.episodes, self.timeout = engine, episodes, timeout
        self.prefill = engine.prefill_s_per_token

    def events(self, b: Block):
        """Every job's next event; returns ``ended, more, starts, numbers``."""
        n, c, inf = b.n, b.c, np.inf
        batch, held, t, virt = b.batch, b.held, b.t, b.virt
        every = np.arange(n)
        when2, target2 = b.when.reshape(n, c), b.target.reshape(n, c)
        step = self.engine.step_s(np.maximum(batch, 1), held)
        ds, ws = target2.argmin(axis=1), when2.argmin(axis=1)
        first, soonest = target2[every, ds], when2[every, ws]
        with np.errstate(invalid="ignore"):
            t_dec = np.where(batch > 0, t + (first - virt) * step, inf)
        is_dec = t_dec <= soonest
        t_next = np.where(is_dec, t_dec, soonest)
        go = np.isfinite(t_next)
        # Virtual tokens: exactly the finisher's target when a decode ends.
        adv = np.where(is_dec, first, virt + (t_next - t) / step)
        with np.errstate(invalid="ignore"):
            dt = np.where(go, t_next - t, 0.0)
        b.timed += (b.busy - batch) * dt
        b.decoding += np.where(batch > 0, dt, 0.0)
        virt[:] = np.where(go & (batch > 0), adv, virt)
        t[:] = np.where(go, t_next, t)
        jd = np.flatnonzero(go & is_dec)
        jt = np.flatnonzero(go & ~is_dec)
        ended = jd * c + ds[jd]  # a decode ended
        due = jt * c + ws[jt]  # a timed part ended, or a deadline came
        cut = b.deadline[due] <= t[jt]
        cut, due = due[cut], due[~cut]  # a decoder is due only at its deadline
        if len(cut):
            self._leave(b, cut[b.dec[cut] > 0])
        # A decode ended: its command and what follows come with the draws.
        self._leave(b, ended)
        more = ended[b.seg[ended] + 1 < b.nturns[ended]]
        # A timed part ended: decode the next turn, or the episode is over.
        to_dec = due[b.seg[due] < b.nturns[due]]
        if len(to_dec):
            jobs = to_dec // c
            b.target[to_dec] = virt[jobs] + b.reply[to_dec]
            b.ctx[to_dec] = b.prompt[to_dec] + b.reply[to_dec] / 2
            b.dec[to_dec] = 1
            b.when[to_dec] = b.deadline[to_dec]
            batch[jobs] += 1
            held[jobs] += b.ctx[to_dec]
        over = np.concatenate([due[b.seg[due] >= b.nturns[due]], cut])
        b.when[over], b.deadline[over] = inf, inf
        jobs = over // c
        more_eps = b.assigned[jobs] < self.episodes
        starts, numbers = over[more_eps], b.assigned[jobs[more_eps]]
        b.assigned[jobs[more_eps]] += 1
        b.busy[jobs[~more_eps]] -= 1
        return ended, more, starts, numbers

    def apply(self, b: Block, ended, more, starts, cmd, turn, episode, first) -> None:
        """The draws go in: ``cmd`` for ``ended``, ``turn`` (prompt, reply) for ``more``,
        ``episode`` (turns, start, end, row) and its ``first`` turn for ``starts``."""
        c, prefill = b.c, self.prefill
        if len(ended):
            b.prompt[more], b.reply[more] = turn
            b.seg[ended] += 1
            tail = np.where(
                b.seg[ended] < b.nturns[ended], prefill * b.prompt[ended], b.end_s[ended]
            )
            b.when[ended] = np.minimum(b.t[ended // c] + cmd + tail, b.deadline[ended])
        if len(starts):  # their start, then turn 0's prefill
            turns, start, end, row = episode
            now = b.t[starts // c]
            b.nturns[starts], b.end_s[starts], b.row[starts], b.seg[starts] = turns, end, row, 0
            b.prompt[starts], b.reply[starts] = first
            b.deadline[starts] = now + self.timeout
            b.when[starts] = np.minimum(now + start + prefill * first[0], b.deadline[starts])

    @staticmethod
    def _leave(b: Block, idx: np.ndarray) -> None:
        """Sessions ``idx`` (one per job) leave the decode batch."""
        jobs = idx // b.c
        b.batch[jobs] -= 1
        b.held[jobs] -= b.ctx[idx]
        b.dec[idx], b.target[idx], b.ctx[idx] = 0, np.inf, 0.0
