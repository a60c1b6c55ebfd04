"""The episodes of a block of jobs, drawn before the block is simulated
(:class:`Episodes`), as the turn kernels (:mod:`~staleness_sim.durations.turn_kernel`,
:mod:`~staleness_sim.durations.moment_kernel`) read them."""

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
