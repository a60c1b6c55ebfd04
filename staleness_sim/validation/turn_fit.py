"""The turn model of a measured run (``--durations turns``), from its ``episodes.parquet``
alone.

- **Episodes**: one table row per episode of a completed job, resampled a measured job at a
  time (a simulated job replays one measured job's episodes in order, so what they shared,
  the machine's load and the tasks, stays shared): its turns, its prompt and reply tokens
  per turn (``tokens_in / turns``, ``tokens_out / turns``), its command seconds per turn
  (``container_s`` less the sandbox start and the verifier), ``start_s`` (the sandbox
  start and what the episode spent outside generation and containers) and ``end_s`` (the
  verifier).
- **Engine**: the decode curve is estimated from the batch sizes the run itself went
  through, not benchmarked: a benchmark measures the engine alone, while a run's
  generation seconds carry what the run shared the machine with (containers, other
  workers), which is what a prediction of the run needs. See :func:`generation_samples`
  for the batch each generation saw and :func:`fit_engine` for the curve.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize

from staleness_sim.core.trace import TraceError
from staleness_sim.durations import CpuShare
from staleness_sim.validation.moment_fit import uncontended
from staleness_sim.validation.run import MeasuredRun, completed_jobs, need_jobs

NEEDS = ("job_id", "index", "turns", "tokens_in", "tokens_out", "generation_s",
         "container_s", "sandbox_start_s", "verify_s", "duration_s", "start_time",
         "end_time")  # fmt: skip


def run_episodes(run: MeasuredRun, scale: dict[int, float] | None = None) -> pd.DataFrame:
    """The episodes of completed jobs (by job, then index), their times multiplied by the
    job's ``scale`` (solo over measured, under contention) where given."""
    if run.episodes is None or not len(run.episodes):
        raise TraceError(f"{run.folder}: durations 'turns' needs episodes.parquet")
    missing = [c for c in NEEDS if c not in run.episodes]
    if missing:
        raise TraceError(f"{run.folder}/episodes.parquet lacks column(s): {', '.join(missing)}")
    for key in ("episodes_per_job", "concurrency"):
        if key not in run.config:
            raise TraceError(f"{run.folder}: meta.json config lacks {key}")
    done = set(completed_jobs(run)["job_id"])
    eps = run.episodes[run.episodes["job_id"].isin(done) & (run.episodes["turns"] > 0)]
    eps = eps.sort_values(["job_id", "index"], kind="stable").reset_index(drop=True)
    need_jobs(run, eps["job_id"].nunique(), "completed job with episodes")
    if scale:
        f = eps["job_id"].map(scale).fillna(1.0).to_numpy(float)
        for col in ("generation_s", "container_s", "sandbox_start_s", "verify_s", "duration_s"):
            eps[col] = eps[col].to_numpy(float) * f
    return eps


def _mean_load(start: np.ndarray, end: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """For each interval, the time average over it of the summed weights of the intervals
    open at each moment (itself included)."""
    times = np.unique(np.concatenate([start, end]))
    order_s, order_e = np.argsort(start), np.argsort(end)
    opened = np.concatenate([[0.0], np.cumsum(weight[order_s])])
    closed = np.concatenate([[0.0], np.cumsum(weight[order_e])])
    # load on [times[k], times[k + 1]): weights opened at or before, not yet closed
    load = (
        opened[np.searchsorted(start[order_s], times[:-1], side="right")]
        - closed[np.searchsorted(end[order_e], times[:-1], side="right")]
    )
    work = np.concatenate([[0.0], np.cumsum(load * np.diff(times))])
    span = np.maximum(end - start, 1e-12)
    return (np.interp(end, times, work) - np.interp(start, times, work)) / span


def per_turn(eps: pd.DataFrame) -> bool:
    """Whether the run recorded each turn's generation (``turn_start``, ``turn_gen_s``...)."""
    cols = ("turn_start", "turn_gen_s", "turn_tokens_out")
    return all(c in eps for c in cols) and bool(
        eps["turn_gen_s"]
        .map(lambda x: len(x) if hasattr(x, "__len__") else -1)
        .eq(eps["turns"])
        .all()
    )


def turn_samples(eps: pd.DataFrame) -> pd.DataFrame:
    """(tokens_out, generation seconds, mean batch) of every turn: its batch is the time
    average of its job's generations open at once (a job has the worker's engine to
    itself), itself included. The seconds are ``turn_gen_uncontended_s`` where the run's
    contention was taken out (:mod:`~staleness_sim.validation.moment_fit`), the batch
    always from the measured intervals."""
    rows = []
    seconds = "turn_gen_uncontended_s" if "turn_gen_uncontended_s" in eps else "turn_gen_s"
    for _, job in eps.groupby("job_id", sort=False):
        start = np.concatenate(job["turn_start"].to_numpy()).astype(float)
        gen = np.concatenate(job["turn_gen_s"].to_numpy()).astype(float)
        out = np.concatenate(job["turn_tokens_out"].to_numpy()).astype(float)
        batch = _mean_load(start, start + gen, np.ones(len(gen)))
        work = np.concatenate(job[seconds].to_numpy()).astype(float)
        rows.append(pd.DataFrame({"out": out, "gen_s": work, "batch": batch}))
    return pd.concat(rows, ignore_index=True)


def fit_engine(eps: pd.DataFrame, concurrency: int) -> tuple[dict[str, Any], str]:
    """The curve and how it was found.

    With per-turn records: two points, batch 1 and ``concurrency`` (linear beyond), by
    least squares of each turn's generation seconds on ``tokens_out * (a + s * (batch -
    1))`` with ``0 <= s <= a`` (:func:`_batch_fit`). Without them the batch each
    generation saw is unknown (a run at one concurrency has its sessions generate in
    step), so the slope cannot be told from the rate: the curve is flat at the run's mean
    seconds per reply token, which reproduces the run at its own concurrency and predicts
    no batching cost elsewhere. Either way the prefill stays in the decode rate: within a
    run the prompt a reply token comes with barely changes, so the two are not told
    apart.
    """
    top = max(2, int(concurrency))
    if per_turn(eps):
        g = turn_samples(eps)
        g = g[g["out"] > 0]
        base, slope = _batch_fit(g["out"].to_numpy(float), g["batch"].to_numpy(float),
                                 g["gen_s"].to_numpy(float))  # fmt: skip
        how = f"fitted to the batches its {len(g)} turns went through"
    else:
        base, slope = eps["generation_s"].sum() / max(eps["tokens_out"].sum(), 1), 0.0
        how = "flat: the run has no per-turn records to tell the batching cost"
    if not base > 0:
        raise TraceError("durations 'turns': the run's generation seconds give no decode rate")
    curve = {"batch": [1, top], "step_s": [float(base), float(base + slope * (top - 1))]}
    return {"curve": curve}, how


def _batch_fit(out: np.ndarray, batch: np.ndarray, gen_s: np.ndarray) -> tuple[float, float]:
    """Least squares of ``gen_s`` on ``out * (base + slope * (batch - 1))`` with ``slope >= 0``
    and ``base >= slope``: a sequence alone costs at least what one more adds to a batch
    (batching shares work, it adds none), which also keeps the batch-1 step positive where
    a run never went near batch 1 (C = 16). Where the free fit breaks that, the optimum
    lies on one of the two edges, flat (``slope = 0``) or proportional (``base = slope``),
    and is the better of them; a tie (a run only at batch 1) goes to flat: no batching
    cost was seen, so none is predicted."""
    x = np.column_stack([out, out * (batch - 1.0)])
    (base, slope), _ = optimize.nnls(x, gen_s)
    if base >= slope:
        return float(base), float(slope)
    flat = float(out @ gen_s / (out @ out))
    prop_x = out * batch
    prop = max(float(prop_x @ gen_s / (prop_x @ prop_x)), 0.0)
    sq = lambda r: float(r @ r)  # noqa: E731
    if sq(gen_s - flat * out) <= sq(gen_s - prop * prop_x):
        return flat, 0.0
    return prop, prop


def episode_table(eps: pd.DataFrame) -> dict[str, Any]:
    turns = eps["turns"].to_numpy(int)
    commands = eps["container_s"] - eps["sandbox_start_s"] - eps["verify_s"]
    other = eps["duration_s"] - eps["generation_s"] - eps["container_s"]
    col = lambda x: [float(v) for v in np.maximum(np.asarray(x, float), 0.0)]  # noqa: E731
    return {
        "turns": [int(t) for t in turns],
        "prompt_tokens": col(eps["tokens_in"] / turns),
        "reply_tokens": col(eps["tokens_out"] / turns),
        "command_s": col(commands / turns),
        "start_s": col(eps["sandbox_start_s"] + other),
        "end_s": col(eps["verify_s"]),
        "job": [int(j) for j in eps["job_id"]],
    }


def run_cores(run: MeasuredRun) -> float | None:
    """The cores each worker of a CPU run had, from the run itself: the CPUs its process
    could use (``meta.json``: its first segment's ``machine.usable_cpus``) over its
    workers, where its local workers' engines ran on the CPU (``model.device: cpu``,
    ``backend: local``); None for any other run (a GPU engine, Ray workers elsewhere, a run
    that recorded no machine)."""
    cfg = run.config
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    if model.get("device", "cpu") != "cpu" or cfg.get("backend", "local") != "local":
        return None
    machines = [s.get("machine") for s in run.trace.meta.get("segments", [])]
    machine = next((m for m in machines if isinstance(m, dict)), {})
    cpus = machine.get("usable_cpus", machine.get("cpus"))
    if not isinstance(cpus, int | float) or not cpus > 0:
        return None
    return float(cpus) / max(int(run.scenario.get("workers", 1)), 1)


def turn_job(
    run: MeasuredRun, scale: dict[int, float] | None = None, cores: float | None = None
) -> tuple[dict, str]:
    """The scenario's ``job`` (turns on an engine) and a line describing it. With ``cores``
    each worker's containers and engine shared that many CPUs moment by moment (the job's
    ``cpu``), so the table and curve hold uncontended times: every part's measured seconds
    are scaled by the shares it had moment by moment, the run's G workers sharing a
    machine of G ``cores`` (:mod:`~staleness_sim.validation.moment_fit`; the simulated
    parts share again, each worker its ``cores``)."""
    eps = run_episodes(run, scale)
    d, c = int(run.config["episodes_per_job"]), int(run.config["concurrency"])
    cpu_what = ""
    if cores is not None:
        if not per_turn(eps):
            raise TraceError("a shared CPU (cores) needs the run's per-turn records")
        jobs = run.trace.jobs
        worker = jobs.set_index("job_id")["worker"] if "worker" in jobs else pd.Series(dtype=int)
        # the run's workers shared one machine of ``cores`` each, moment by moment
        each = CpuShare(cores=cores)
        g = max(int(run.scenario.get("workers", 1)), 1)
        machine = CpuShare(cores=cores * g, engine_threads=each.threads, engine_demand=each.engine)
        eps, how_much = uncontended(eps, worker, machine)
        cpu_what = f"; containers and engine shared {cores:g} cores moment by moment: {how_much}"
    engine, how = fit_engine(eps, c)
    turns: dict[str, Any] = {"table": episode_table(eps)}
    if run.episode_timeout is not None:
        turns["timeout_s"] = run.episode_timeout
    step, top = engine["curve"]["step_s"], engine["curve"]["batch"][1]
    what = (
        f"{d} episodes of turns over {c} sessions on one engine: {eps['job_id'].nunique()} "
        f"measured jobs' {len(eps)} episodes replayed a job at a time; decode step "
        f"{step[0] * 1e3:.3g} ms at batch 1, {step[1] * 1e3:.3g} ms at {top} ({how})"
    )
    job = {"episodes": d, "concurrency": c, "turns": turns, "engine": engine}
    if cores is not None:
        job["cpu"] = {"cores": float(cores)}
    return job, what + cpu_what
