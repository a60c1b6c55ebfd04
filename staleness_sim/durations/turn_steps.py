"""The turn model (:mod:`staleness_sim.durations.turns`) in numpy: a block of jobs simulated
in lockstep (:func:`simulate_numpy`), one event per job per step, from their episodes drawn
beforehand (:class:`Episodes`). The compiled :mod:`~staleness_sim.durations.turn_kernel`
runs each job's whole event loop instead, with the same arithmetic in the same order, so
the two give the same jobs to the bit.

A step comes in two halves:

- ``events``: advance every job to its next event (its next decode end, timed end or
  deadline) and apply what needs no drawn value; list the decodes that ended (``ended``,
  in job order), those of them with a turn to come (``more``), and the sessions that
  start their job's next episode (``starts``, with the episode's number in its job);
- ``apply``: their drawn values (commands, next turns, new episodes) go in.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Episodes(NamedTuple):
    """The episodes of a block of jobs, drawn before it is simulated: episode ``e`` of job
    ``j`` is at ``j * D + e`` in ``turns``, ``start``, ``end`` and ``first`` (where its
    turns begin in ``prompt``, ``reply`` and ``command``, one value per turn). Drawing
    them by episode, not as the simulation reaches them, makes the values a job gets
    independent of the order its events are handled in."""

    turns: np.ndarray  # int64
    start: np.ndarray
    end: np.ndarray
    first: np.ndarray  # int64
    prompt: np.ndarray
    reply: np.ndarray
    command: np.ndarray

    @classmethod
    def of(cls, turns, start, end, prompt, reply, command) -> Episodes:
        """From each episode's ``turns``, ``start`` and ``end`` and each turn's values."""
        turns = np.ascontiguousarray(turns, dtype=np.int64)
        first = np.zeros(len(turns), np.int64)
        np.cumsum(turns[:-1], out=first[1:])
        start, end, prompt, reply, command = (
            np.ascontiguousarray(x, np.float64) for x in (start, end, prompt, reply, command)
        )
        return cls(turns, start, end, first, prompt, reply, command)

    def jobs(self, a: int, b: int, episodes: int) -> Episodes:
        """Jobs ``a`` to ``b`` (excluded) of ``episodes`` episodes each: their episodes' values,
        and every turn's (``first`` still points into the whole block's turns)."""
        ea, eb = a * episodes, b * episodes
        return Episodes(*(x[ea:eb] for x in self[:4]), *self[4:])

    @classmethod
    def joined(cls, blocks: list[Episodes]) -> Episodes:
        """Several blocks' episodes as one block, their jobs in order."""
        if len(blocks) == 1:
            return blocks[0]
        turns, start, end, _, prompt, reply, command = (
            np.concatenate(x) for x in zip(*blocks, strict=True)
        )
        return cls.of(turns, start, end, prompt, reply, command)


def simulate_numpy(engine, episodes: int, timeout: float, eps: Episodes, n: int, c: int):
    """``(t, timed, decoding)`` of ``n`` jobs of ``episodes`` episodes over ``c`` sessions
    (at most ``episodes``): their makespans and the two integrals of :class:`Block`."""
    b, steps = Block(n, c), NumpySteps(engine, episodes, timeout)
    at = np.zeros(n * c, np.int64)  # each session's turn in eps' turn arrays
    ended = more = np.zeros(0, np.int64)
    starts, numbers = np.arange(n * c), np.tile(np.arange(c), n)
    while True:
        cmd = turn = episode = first = None
        if len(ended):  # this turn's command, then the next turn's prefill or the end
            cmd = eps.command[at[ended]]
            at[more] += 1
            turn = eps.prompt[at[more]], eps.reply[at[more]]
        if len(starts):  # an episode's start, then turn 0's prefill
            e = starts // c * episodes + numbers
            at[starts] = eps.first[e]
            episode = eps.turns[e], eps.start[e], eps.end[e]
            first = eps.prompt[at[starts]], eps.reply[at[starts]]
        steps.apply(b, ended, more, starts, cmd, turn, episode, first)
        if not b.busy.any():
            return b.t, b.timed, b.decoding
        ended, more, starts, numbers = steps.events(b)


# Columns of a session's record in Block.f (the counts too: exact as floats).
DEADLINE, CTX, END_S, PROMPT, REPLY, SEG, NTURNS, DEC = range(8)


class Block:
    """``n`` jobs of ``c`` sessions each, session ``k`` of job ``j`` at ``j * c + k``.

    Per session: ``when`` (a timed part: min(its end, deadline); decoding: the deadline),
    ``target`` (decoding: the virtual token count at which it ends), ``deadline``, ``ctx``
    (the context it holds while decoding: prompt + half reply), ``end_s``, ``prompt``,
    ``reply``, ``seg`` (the turn it is in), ``nturns``, ``dec`` (1 while decoding). Per
    job: ``t``, ``virt`` (tokens a sequence in the batch has decoded since time 0),
    ``held`` (the context the batch holds), ``batch`` (sessions decoding), ``assigned``
    (episodes started), ``busy`` (sessions with an episode), and two integrals over time
    for the CPU a job's parts share (``job.cpu``):
    ``timed`` (of the sessions in a timed part: busy less batch) and ``decoding`` (of the
    time the batch is not empty).

    ``when`` and ``target`` are searched job by job, so each is one array; a session's
    other fields are one record (a row of ``f``); the named fields are views.
    """

    def __init__(self, n: int, c: int) -> None:
        self.n, self.c = n, c
        self.when, self.target = np.full(n * c, np.inf), np.full(n * c, np.inf)
        self.f = np.zeros((n * c, 8))
        self.fj = np.zeros((5, n))
        self.ij = np.zeros((3, n), np.int64)
        self.deadline, self.ctx, self.end_s, self.prompt, self.reply = self.f.T[:5]
        self.seg, self.nturns, self.dec = self.f.T[5:]
        self.t, self.virt, self.held, self.timed, self.decoding = self.fj
        self.batch, self.assigned, self.busy = self.ij
        self.deadline[:] = np.inf
        self.assigned[:] = self.busy[:] = c


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
        ``episode`` (turns, start, end) and its ``first`` turn for ``starts``."""
        c, prefill = b.c, self.prefill
        if len(ended):
            b.prompt[more], b.reply[more] = turn
            b.seg[ended] += 1
            tail = np.where(
                b.seg[ended] < b.nturns[ended], prefill * b.prompt[ended], b.end_s[ended]
            )
            b.when[ended] = np.minimum(b.t[ended // c] + cmd + tail, b.deadline[ended])
        if len(starts):  # their start, then turn 0's prefill
            turns, start, end = episode
            now = b.t[starts // c]
            b.nturns[starts], b.end_s[starts], b.seg[starts] = turns, end, 0
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
