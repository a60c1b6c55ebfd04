"""A chunk's jobs simulated in parts on several threads: the compiled kernels
(:mod:`~staleness_sim.durations.turn_kernel`, :mod:`~staleness_sim.durations.moment_kernel`)
release the GIL, and jobs are independent, so each part runs on its own core and the
results are the same to the bit however the jobs are split (``tests/sim/test_turn_kernel.py``).

``STALENESS_SIM_THREADS`` sets the number of threads (default: the cores this process may
use, at most 8); a sweep's worker processes use one each, the sweep itself being
parallel across them.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from staleness_sim.durations.turn_episodes import Episodes

ENV = "STALENESS_SIM_THREADS"


def threads() -> int:
    """Threads a chunk's jobs are split across."""
    given = os.environ.get(ENV, "")
    if given:
        try:
            n = int(given)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{ENV}={given!r}: expected a whole number of threads >= 1")
        return n
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


def in_parts(kernel, eps: Episodes, n: int, episodes: int, rows: int, args: tuple,
             parts: int | None = None) -> np.ndarray:  # fmt: skip
    """``kernel(*episodes of jobs a..b, *args, out)`` for parts ``a..b`` of the ``n`` jobs,
    each part on its own thread (the first on this one); ``out`` of shape ``(rows, b -
    a)``. Returns the parts' ``out`` side by side: ``(rows, n)``."""
    parts = max(1, min(threads() if parts is None else parts, n))
    bounds = [n * p // parts for p in range(parts + 1)]
    outs = [np.zeros((rows, b - a)) for a, b in zip(bounds, bounds[1:], strict=False)]
    failed: list[BaseException] = []

    def part(p: int) -> None:
        try:
            kernel(*eps.jobs(bounds[p], bounds[p + 1], episodes), *args, outs[p])
        except BaseException as e:  # raised again in the caller's thread
            failed.append(e)

    others = [threading.Thread(target=part, args=(p,), daemon=True) for p in range(1, parts)]
    for t in others:
        t.start()
    part(0)
    for t in others:
        t.join()
    if failed:
        raise failed[0]
    return outs[0] if parts == 1 else np.concatenate(outs, axis=1)
