"""One scenario's summary and label, shared by ``run``, ``compare`` and sweeps."""

from __future__ import annotations

from typing import Any

from staleness_sim.cohort.engine import simulate
from staleness_sim.config import Scenario
from staleness_sim.core.metrics import summarize
from staleness_sim.core.trace import Trace
from staleness_sim.learning.model import learn_trace
from staleness_sim.queue.config import QueueScenario
from staleness_sim.queue.engine import simulate_queue
from staleness_sim.queue.metrics import queue_summary


def simulate_scenario(scenario: Scenario | QueueScenario) -> Trace:
    """The trace of a scenario of either pipeline (the default cohort engine, or the queue)."""
    if isinstance(scenario, QueueScenario):
        return simulate_queue(scenario)
    return simulate(scenario)


def run_summary(scenario: Scenario) -> dict[str, Any]:
    """The summary of one scenario, exactly as ``staleness-sim run --json`` prints it."""
    return trace_summary(scenario, simulate_scenario(scenario))


def trace_summary(scenario: Scenario, trace: Trace) -> dict[str, Any]:
    out = {"name": scenario.name, "seed": scenario.seed, **summarize(trace)}
    if isinstance(scenario, QueueScenario):  # the queue pipeline's own keys, after these
        out.update(queue_summary(trace))
    elif scenario.learning is not None:  # held-out success along the schedule
        d = scenario.learning_episodes()
        out.update(learn_trace(trace, scenario.learning, scenario.seed, d).outputs())
    return out


def policy_kind(scenario: Scenario | QueueScenario) -> str:
    """The policy's kind; a queue scenario's is its rule (its ES policy's under rule cohort)."""
    if isinstance(scenario, QueueScenario):
        q = scenario.queue
        return q.policy.kind if q.rule == "cohort" else q.rule
    return scenario.policy.kind


def policy_label(scenario: Scenario) -> str:
    """A short readable name of the scenario's policy, e.g. ``bounded(max_lag=1,drop)+drain20``
    (a queue scenario: its rule, e.g. ``drop_oldest(q=2)``)."""
    if isinstance(scenario, QueueScenario):
        return _queue_label(scenario)
    p = scenario.policy
    if p.kind == "bounded":
        label = f"bounded(max_lag={p.max_lag},{p.on_stale})"
    elif p.kind == "controlled_delay":
        label = f"delay({p.fraction:g}x{p.delay})"
    else:
        label = p.kind
    return label + (f"+drain{scenario.drain_every}" if scenario.drain_every else "")


def compare_row(scenario: Scenario, s: dict[str, Any]) -> dict[str, Any]:
    """One row of ``staleness-sim compare`` from a summary (simulated or measured).

    ``scenario`` may be any object with the scenario's ``name``, ``workers``, ``policy``
    and ``drain_every`` (a runner config has them too).
    """
    return {
        "scenario": scenario.name,
        "G": scenario.workers,
        "policy": policy_label(scenario),
        "hours": s["wall_clock_s"] / 3600,
        "updates/h": s["updates_per_hour"],
        "results/h": s["results_per_hour"],
        "idle %": 100 * s["worker_idle_fraction"],
        "stale %": 100 * s["stale_fraction"],
        "mean lag": s["mean_lag"],
        "max lag": s["max_lag"],
        "discarded": s["results_discarded"],
        "util %": 100 * s["data_utilization"],
        **_success_columns(s),
    }


def _success_columns(s: dict[str, Any]) -> dict[str, Any]:
    """The success model's columns, where the scenario has a ``learning:`` block."""
    if "success_final" not in s:
        return {}
    return {"success %": 100 * s["success_final"], "h to target": s["hours_to_success"]}


def _queue_label(sc: QueueScenario) -> str:
    q = sc.queue
    if q.rule == "cohort":  # the ES policy's own label
        es = Scenario.model_construct(policy=q.policy, drain_every=q.drain_every)
        return policy_label(es)
    parts = [f"q={q.capacity:g}" if q.capacity is not None else "q=inf"]
    if q.rule == "max_staleness" or q.admission:
        parts.append(f"K={q.max_staleness}")
    if q.admission:
        parts.append("admission")
    if sc.in_flight_updates:
        parts.append("in-flight")
    return f"{q.rule}({','.join(parts)})"
