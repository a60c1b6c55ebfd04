"""What the success model needs of a trace: which results entered which update, evaluated
at which version, with which weight, sign and perturbation, on how many episodes.

Everything comes from the trace's ``jobs`` and ``updates`` tables, so a simulated and a
measured run are read alike. A result entered the update that took version
``dispatch_version + lag`` to the next (its verdict ``accepted``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from staleness_sim.core.trace import Trace, TraceError


@dataclass(frozen=True)
class Schedule:
    """The used results, one entry per job, in dispatch (job id) order."""

    dispatch: np.ndarray  # version the result was evaluated at
    update: np.ndarray  # the update it entered (version -> version + 1)
    weight: np.ndarray  # the update's weight for it (es.staleness), 1 if not recorded
    sign: np.ndarray  # +1, or -1 for the negative half of an antithetic pair
    perturbation: np.ndarray  # index of its perturbation (a pair shares one)
    episodes: np.ndarray  # D, its episodes
    n_perturbations: int
    times: np.ndarray  # when each version's weights were available (version 0 at 0 s)

    @property
    def n_updates(self) -> int:
        return self.times.size - 1


def schedule_from_trace(trace: Trace, episodes: int | None, antithetic: bool) -> Schedule:
    """The schedule of ``trace``. ``episodes`` is D where the jobs table has no ``episodes``
    column. A simulated trace records no signs: with ``antithetic`` jobs 2k and 2k+1 are a
    pair, and an update leaves out a member whose partner it does not also use (the
    runner's ``es.antithetic`` rule); a measured trace's signs and verdicts are its own."""
    jobs = trace.jobs.sort_values("job_id", kind="stable")
    measured_signs = "sign" in jobs.columns
    used = jobs[jobs["verdict"] == "accepted"]
    if "episodes" in used.columns:
        d = used["episodes"].to_numpy(dtype=np.int64)
    elif episodes is None:
        raise TraceError("the jobs table has no episodes column: give learning.episodes")
    else:
        d = np.full(len(used), int(episodes), dtype=np.int64)
    dispatch = used["dispatch_version"].to_numpy(dtype=np.int64)
    update = dispatch + used["lag"].to_numpy(dtype=np.int64)
    weight = _column(used, "weight", 1.0)
    job_id = used["job_id"].to_numpy(dtype=np.int64)
    if measured_signs:
        sign = used["sign"].to_numpy(dtype=np.int64)
        _, key = np.unique(used["seed"].to_numpy(), return_inverse=True)
    elif antithetic:
        sign = np.where(job_id % 2 == 1, -1, 1)
        key = job_id // 2
    else:
        sign = np.ones(len(used), dtype=np.int64)
        key = job_id
    _, perturbation = np.unique(key, return_inverse=True)
    keep = np.ones(len(used), dtype=bool)
    if antithetic and not measured_signs:
        pair_in_update = pd.Series(update).groupby(perturbation).transform("nunique")
        twice = pd.Series(perturbation).map(pd.Series(perturbation).value_counts())
        keep = (twice.to_numpy() == 2) & (pair_in_update.to_numpy() == 1)
    times = np.concatenate(([0.0], trace.updates["time"].to_numpy(dtype=float)))
    if update.size and update.max() >= times.size - 1:
        raise TraceError("a used result names an update the updates table lacks")
    return Schedule(
        dispatch=dispatch[keep],
        update=update[keep],
        weight=weight[keep],
        sign=sign[keep],
        perturbation=perturbation[keep],
        episodes=d[keep],
        n_perturbations=int(perturbation.max()) + 1 if perturbation.size else 0,
        times=times,
    )


def _column(frame: pd.DataFrame, name: str, default: float) -> np.ndarray:
    if name not in frame.columns:
        return np.full(len(frame), default)
    return frame[name].fillna(default).to_numpy(dtype=float)
