"""What the runner's benchmarks share: timing on a device, concurrent sessions through the
session batcher (the path a job takes), and a short CPU training run with its figures.

Benchmarks run as ``python benchmarks/NAME.py``, so they import this file as a sibling
module (``from harness import ...``); the project itself is imported installed.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.backends import GenerationRequest, SessionBatcher

REPO = Path(__file__).resolve().parents[1]
SYSTEM = {"role": "system", "content": "You are an agent in a Linux terminal."}


# -- timing -------------------------------------------------------------------------------
def sync(device: str) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def best_time(fn: Callable[[], object], device: str, repeats: int = 3) -> float:
    """The shortest of ``repeats`` timed calls: the least disturbed by other processes."""
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def rounds(
    fns: dict[str, Callable[[], object]], device: str, repeats: int
) -> dict[str, list[float]]:
    """Each function timed in turn, round after round, so that all see the same machine
    load: ``repeats`` times per function after one warm-up round (left out)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats + 1):
        for k, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[k].append(time.perf_counter() - t0)
    return {k: ts[1:] for k, ts in times.items()}


# -- sessions -----------------------------------------------------------------------------
def conversation(i: int, turns: int = 1) -> list[dict]:
    """Session i's conversation: a task and ``turns - 1`` earlier commands with output."""
    msgs = [SYSTEM, {"role": "user", "content": f"Task {i}: list the files in /home/user."}]
    for t in range(turns - 1):
        msgs += [
            {"role": "assistant", "content": f"<command>ls /home/user/d{i}_{t}</command>"},
            {"role": "user", "content": f"Command executed successfully. Output: f{t}.txt"},
        ]
    return msgs


@dataclass
class Sessions:
    """What :func:`run_sessions` measured."""

    tokens: int  # generated, all sessions
    wall_s: float  # from the first session's start to the last one's end
    cpu_s: float  # this process's CPU time meanwhile (every thread: the engine's)
    waited_s: float  # summed over turns: from asking for a reply to having it
    texts: list[list[str]]  # the replies, per session and turn
    batch_sizes: list[int] = field(default_factory=list)  # the batcher's window batches


def run_sessions(
    backend: Any,
    requests: Sequence[GenerationRequest],
    turns: int = 1,
    *,
    seed_stride: int = 1000,
    command_ms: float = 0.0,
    command_seeds: Sequence[int] | None = None,
    observation: str = "Output: line {t}",
    max_batch: int = 64,
    window_s: float = 0.05,
) -> Sessions:
    """One thread per request, all through one SessionBatcher, each ``turns`` turns: turn
    t of session i asks with seed ``requests[i].seed + seed_stride * t``, then "runs its
    command" for an exponential time of mean ``command_ms`` (seeded by ``command_seeds[i]``,
    default the request's seed), and answers with ``observation`` (``{t}``: the turn)."""
    n = len(requests)
    batcher = SessionBatcher(backend, max_batch=max_batch, window_s=window_s)
    texts: list[list[str]] = [[] for _ in range(n)]
    tokens, waited = [0] * n, [0.0] * n
    opened = threading.Barrier(n)
    seeds = [r.seed for r in requests] if command_seeds is None else list(command_seeds)

    def session(i: int) -> None:
        rng = random.Random(seeds[i])
        msgs = list(requests[i].messages)
        batcher.open_session()
        opened.wait()  # a session that is not open yet is not waited for
        for t in range(turns):
            t0 = time.perf_counter()
            reply = batcher.generate(
                GenerationRequest(list(msgs), seed=requests[i].seed + seed_stride * t)
            )
            waited[i] += time.perf_counter() - t0
            texts[i].append(reply.text)
            tokens[i] += reply.tokens_out
            msgs += [{"role": "assistant", "content": reply.text},
                     {"role": "user", "content": observation.format(t=t)}]  # fmt: skip
            if command_ms > 0:
                time.sleep(rng.expovariate(1000.0 / command_ms))
        batcher.close_session()

    threads = [threading.Thread(target=session, args=(i,)) for i in range(n)]
    t0, cpu0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    batcher.close()
    return Sessions(sum(tokens), wall, cpu, sum(waited), texts, list(batcher.batch_sizes))


# -- a short training run -----------------------------------------------------------------
def short_run_config(folder: Path, model: Path, updates: int, tasks: int = 40) -> Path:
    """configs/runner/cpu_tiny.yaml cut to ``updates`` updates on ``tasks`` generated tasks
    (written to ``folder/tasks``), no evaluation, with ``model``; returns its path."""
    import yaml

    from runner.terminal.generator.writer import write_tasks

    config = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
    write_tasks(folder / "tasks", tasks, seed=0)
    tasks_spec = {"dir": str(folder / "tasks"), "split": "train"}
    config.update(updates=updates, eval_every=0, tasks=tasks_spec)
    config["model"]["path"] = str(model)
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_figures(run: Path) -> dict[str, Any]:
    """A finished run's figures from its files: the run time (first dispatch to the last
    update), the orchestrator's own time (policy calls, journal, trace writes) and its
    fraction, the dispatch gaps (a worker's result landing to its next job starting, its
    sync excluded), and where an episode's time went (the episodes of jobs not cancelled)."""
    import pandas as pd

    meta = json.loads((run / "meta.json").read_text())
    jobs = pd.read_parquet(run / "jobs.parquet")
    episodes = pd.read_parquet(run / "episodes.parquet")
    wall = float(pd.read_parquet(run / "updates.parquet")["time"].max())
    gaps: list[float] = []
    ran = jobs.dropna(subset=["start_time", "end_time"]).sort_values("dispatch_time")
    for _, g in ran.groupby("worker"):
        gaps += list(
            g["start_time"].to_numpy()[1:]
            - g["end_time"].to_numpy()[:-1]
            - g["sync_s"].to_numpy()[1:]
        )
    orch = meta["orchestrator"]
    own_s = orch["controller_s"] + orch["journal_s"] + orch["flush_s"]
    done = episodes[episodes["job_id"].isin(jobs.loc[jobs.verdict != "cancelled", "job_id"])]
    return {
        "wall_s": round(wall, 2),
        "jobs": len(jobs),
        "episodes": len(done),
        "orchestrator_own_s": round(own_s, 3),
        "orchestrator_fraction": round(own_s / wall, 5),
        "dispatch_gap_s_mean": round(statistics.mean(gaps), 4) if gaps else None,
        "dispatch_gap_s_total": round(sum(gaps), 4),
        "sync_s_mean": round(float(jobs["sync_s"].dropna().mean()), 4),
        "generation_s_per_episode": round(float(done["generation_s"].mean()), 3),
        "container_s_per_episode": round(float(done["container_s"].mean()), 3),
        "turns_per_episode": round(float(done["turns"].mean()), 2),
        "task_ids": list(done["task_id"]),
    }
