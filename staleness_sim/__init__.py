"""A discrete-event simulator of asynchronous ES training: workers, cohorts, staleness rules.

Quick use::

    from staleness_sim import load_scenario, simulate, summarize
    trace = simulate(load_scenario("configs/sim/paper_async1.yaml"))
    print(summarize(trace)["stale_fraction"])

Packages, by concern (docs/architecture.md has the map and the import rules):
``core`` (the contract both drivers share: policies, the driver, trace, metrics, analytic,
config machinery), ``durations`` (specs, samplers, job makespans), ``cohort`` (the SimPy
engine and its scenario), ``queue`` (the queue pipeline), ``sweeps`` (sweeps, reports,
plots), ``validation`` (measured runs against the simulator, fitting).
"""

from staleness_sim.cohort.engine import Simulation, simulate
from staleness_sim.config import ConfigError, Scenario, load_scenario, validate
from staleness_sim.core.metrics import summarize
from staleness_sim.core.trace import Trace

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
