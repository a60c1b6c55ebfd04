"""The scenario's opt-in ``learning:`` block: the success model's free parameters and the
ES hyper-parameters it runs with (sigma and alpha mean what they mean in the runner)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from staleness_sim.core.settings import _Strict

SHAPINGS = ("zscore", "centered_rank", "raw")


class LearningSpec(_Strict):
    """What ``learning:`` holds; every field has a default (the published setting, the free
    parameters calibrated on the published sync endpoints, docs/success.md)."""

    # the model's free parameters
    dimension: Annotated[int, Field(ge=1)] = 512  # parameters a perturbation moves
    base_rate: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.093  # held-out success at version 0
    shared: Annotated[float, Field(ge=0.0, le=1.0)] = (
        0.5  # share of a task's response common to all
    )
    effect: Annotated[float, Field(ge=0.0)] = 33.6  # logit change per unit parameter move
    spread: Annotated[float, Field(ge=0.0)] = 1.5  # sd of the tasks' base logits (difficulty)
    # chance that a member's episode follows its version's shared draw (common random
    # numbers); else the member draws its own (a perturbed model's sampling path diverges)
    coupling: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    # what to report
    target: Annotated[float, Field(ge=0.0, le=1.0)] = 0.25  # hours_to_success reaches this
    # the ES update, as in the runner's es: block
    sigma: Annotated[float, Field(gt=0.0)] = 0.0015
    alpha: Annotated[float, Field(ge=0.0)] = 0.00075
    shaping: Literal["zscore", "centered_rank", "raw"] = "zscore"
    antithetic: bool = False
    episodes: Annotated[int, Field(ge=1)] | None = None  # D per job (default: job.episodes)
