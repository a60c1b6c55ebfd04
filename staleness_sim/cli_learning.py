"""``staleness-sim fit --learning``: the success model's free parameters fitted to a measured
curve (a run directory's evaluations) or to held-out success endpoints (a scenario)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import pandas as pd
import yaml

from staleness_sim.config import ConfigError, Scenario
from staleness_sim.summary import simulate_scenario


def fit_learning(args: argparse.Namespace) -> int:
    from staleness_sim.config import read_yaml, validate, with_overrides
    from staleness_sim.core.settings import parse_assignment
    from staleness_sim.learning.fit import fit_effect, read_learning_run, train_rewards
    from staleness_sim.learning.model import learn
    from staleness_sim.learning.schedule import schedule_from_trace
    from staleness_sim.learning.spec import LearningSpec

    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    overrides = dict(parse_assignment(s) for s in args.sets)
    measured_rewards = None
    if args.data.is_dir():
        bad = [k for k in overrides if not k.startswith("learning.")]
        if bad:
            raise ConfigError(f"--set {bad[0]}: a run directory takes only learning.* fields")
        schedule, curve, es = read_learning_run(args.data)
        data = with_overrides({"learning": es}, overrides)
        spec = validate_learning(data.get("learning") or {}, f"{args.data}")
        updates = pd.read_parquet(args.data / "updates.parquet")
        if "mean_reward" in updates.columns:
            measured_rewards = updates["mean_reward"].to_numpy(dtype=float)
    else:
        scenario = validate(with_overrides(read_yaml(args.data), overrides), str(args.data))
        if not isinstance(scenario, Scenario):
            raise ConfigError(f"{args.data}: --learning fits a cohort scenario")
        spec = scenario.learning or LearningSpec()
        episodes = spec.episodes or scenario.job.episodes
        if episodes is None:
            raise ConfigError(f"{args.data}: learning.episodes: required (job has no episodes)")
        schedule = schedule_from_trace(simulate_scenario(scenario), episodes, spec.antithetic)
        curve = {0: args.endpoints[0], schedule.n_updates: args.endpoints[1]}
    fit = fit_effect(schedule, curve, spec, seeds=args.seeds)
    out = fit.to_json()
    if measured_rewards is not None:  # the training rewards as a check the fit did not use
        model = np.nanmean(
            [train_rewards(schedule, learn(schedule, fit.spec, s).rewards) for s in range(2)],
            axis=0,
        )
        k = max(1, len(model) // 4)
        out["train_reward"] = {
            "measured_first_quarter": float(np.nanmean(measured_rewards[:k])),
            "measured_last_quarter": float(np.nanmean(measured_rewards[-k:])),
            "model_first_quarter": float(np.nanmean(model[:k])),
            "model_last_quarter": float(np.nanmean(model[-k:])),
        }
    if args.json:
        print(json.dumps(out))
        return 0
    print(yaml.safe_dump({"learning": out["learning"]}, sort_keys=False).rstrip())
    print(f"\nversion  measured  predicted (sd over {fit.seeds} seeds)")
    for row in out["versions"]:
        print(f"{row['version']:>7}  {row['measured']:8.3f}  {row['predicted']:9.3f} "
              f"({row['spread']:.3f})")  # fmt: skip
    if fit.at_bound:
        print("\nno gain to fit: effect = 0 (the measured curve does not rise)")
    if "train_reward" in out:
        t = out["train_reward"]
        print(
            f"\ntraining reward, first / last quarter of updates: measured "
            f"{t['measured_first_quarter']:.3f} / {t['measured_last_quarter']:.3f}, model "
            f"{t['model_first_quarter']:.3f} / {t['model_last_quarter']:.3f}"
        )
    return 0


def validate_learning(data: dict[str, Any], source: str):
    """A ``learning:`` block alone, validated with the scenario's one-line errors."""
    from pydantic import ValidationError

    from staleness_sim.core.settings import describe_error
    from staleness_sim.learning.spec import LearningSpec

    try:
        return LearningSpec.model_validate(data)
    except ValidationError as e:
        where = describe_error(e, data, root=LearningSpec)
        raise ConfigError(f"{source}: learning.{where}") from None
