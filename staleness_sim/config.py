"""Scenario files of either pipeline: load, override, validate.

``pipeline: queue`` selects the queue pipeline (``staleness_sim.queue.config``); anything
else is a cohort scenario (``staleness_sim.cohort.config``). The config machinery
(``ConfigError``, YAML, dotted overrides) is ``staleness_sim.core.settings``, re-exported
here because users' scripts import it from this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from staleness_sim.cohort.config import Scenario, validate_cohort
from staleness_sim.core.settings import (
    ConfigError,
    parse_assignment,
    read_yaml,
    scenario_dict,
    set_dotted,
    with_overrides,
)
from staleness_sim.queue.config import QueueScenario, validate_queue

__all__ = [
    "ConfigError",
    "QueueScenario",
    "Scenario",
    "load_scenario",
    "parse_assignment",
    "read_yaml",
    "scenario_dict",
    "set_dotted",
    "validate",
    "with_overrides",
]


def validate(data: dict[str, Any], source: str = "config") -> Scenario | QueueScenario:
    """A scenario of the pipeline the data names (default: cohort)."""
    if isinstance(data, dict) and "pipeline" in data:
        if data["pipeline"] != "cohort":
            return validate_queue(data, source)
        data = {k: v for k, v in data.items() if k != "pipeline"}
    return validate_cohort(data, source)


def load_scenario(path: str | Path, sets: list[str] | tuple[str, ...] = ()) -> Scenario:
    overrides = dict(parse_assignment(s) for s in sets)
    return validate(with_overrides(read_yaml(path), overrides), str(path))
