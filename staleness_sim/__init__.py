"""A discrete-event simulator of asynchronous ES training: workers, cohorts, staleness rules.

Quick use::

    from staleness_sim import load_scenario, simulate, summarize
    trace = simulate(load_scenario("configs/sim/paper_async1.yaml"))
    print(summarize(trace)["stale_fraction"])
"""

from .config import ConfigError, Scenario, load_scenario, validate
from .engine import Simulation, simulate
from .metrics import summarize
from .trace import Trace

__all__ = [
    "ConfigError",
    "Scenario",
    "Simulation",
    "Trace",
    "load_scenario",
    "simulate",
    "summarize",
    "validate",
]
