"""Is there signal for ES here? Two figures of a cohort, recorded in every update row.

With common random numbers every member dispatched at one version runs the same tasks
with the same sampling seed, so where two members' episodes on the same task slot differ,
the perturbation made the difference. An episode's value is its fitness as the update
sees it: the graded reward under ``es.reward: graded``, else the reward.

- ``pair_disagreement``: over the antithetic pairs whose two members are both in the
  cohort, the share of their shared slots (same slot, same task) on which the two values
  differ; NaN without antithetic pairs or where no pair is complete. A pair that never
  differs gets a coefficient of 0: the update learns from the pairs that do.
- ``slots_all_agree``: over the cohort's task slots (slot index and task) that at least
  two members ran, the share where every member's value is the same.

A full run is worth starting at :data:`WORTH_A_RUN` pair disagreement or more (issue 39's
measurement: at 9 % and 60 % of slots all failing, twelve runs learned nothing).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

WORTH_A_RUN = 0.20
Episodes = Sequence[dict[str, Any]]


def episode_values(episodes: Episodes, graded: bool) -> dict[tuple[int, str], float]:
    """(slot index, task id) -> the episode's fitness value (episodes that do not say
    their slot are left out)."""
    key = "graded" if graded else "reward"
    return {
        (e["index"], e["task_id"]): float(e.get(key, e["reward"]))
        for e in episodes
        if "index" in e and "task_id" in e
    }


def pair_disagreement(pairs: Iterable[tuple[Episodes, Episodes]], graded: bool) -> float:
    differ = shared = 0
    for a, b in pairs:
        va, vb = episode_values(a, graded), episode_values(b, graded)
        for slot in va.keys() & vb.keys():
            shared += 1
            differ += va[slot] != vb[slot]
    return differ / shared if shared else math.nan


def slots_all_agree(members: Iterable[Episodes], graded: bool) -> float:
    by_slot: dict[tuple[int, str], list[float]] = {}
    for episodes in members:
        for slot, value in episode_values(episodes, graded).items():
            by_slot.setdefault(slot, []).append(value)
    shared = [values for values in by_slot.values() if len(values) >= 2]
    if not shared:
        return math.nan
    return sum(len(set(values)) == 1 for values in shared) / len(shared)


def cohort_figures(
    members: Sequence[tuple[int, int, Episodes]], antithetic: bool, graded: bool
) -> dict[str, float]:
    """The two figures of a cohort given as (seed, sign, episodes) per member."""
    by_seed: dict[int, dict[int, Episodes]] = {}
    for seed, sign, episodes in members:
        by_seed.setdefault(seed, {})[sign] = episodes
    pairs = [(s[1], s[-1]) for s in by_seed.values() if 1 in s and -1 in s]
    return {
        "pair_disagreement": pair_disagreement(pairs, graded) if antithetic else math.nan,
        "slots_all_agree": slots_all_agree([e for _, _, e in members], graded),
    }


def summary_line(pair: Sequence[float], agree: Sequence[float]) -> str:
    """The run's pre-check: the mean of each figure over its updates, and the verdict."""
    pair = [x for x in pair if not math.isnan(x)]
    agree = [x for x in agree if not math.isnan(x)]
    if not agree:
        return "pre-check: no update committed yet"
    text = f"slots where all members agree {100 * sum(agree) / len(agree):.1f} %"
    if not pair:
        return f"pre-check ({len(agree)} updates): {text}; no antithetic pairs"
    mean = sum(pair) / len(pair)
    verdict = "worth a full run" if mean >= WORTH_A_RUN else "too little signal for a full run"
    return (
        f"pre-check ({len(pair)} updates): pair disagreement {100 * mean:.1f} % "
        f"({verdict}: >= {100 * WORTH_A_RUN:.0f} % is), {text}"
    )
