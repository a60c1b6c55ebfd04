"""``env check``: build a task, test its initial state, replay a solution, verify."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import docker

from runner.terminal.episode import EpisodeConfig, run_episode
from runner.terminal.errors import TaskLoadError
from runner.terminal.images import ImageBuilder
from runner.terminal.loaders import load_task
from runner.terminal.protocol import ScriptedAgent


def check_task(
    task_dir: str | Path,
    solution: str | Path | None,
    client: docker.DockerClient,
    config: EpisodeConfig | None = None,
) -> dict[str, Any]:
    """Return the check's JSON-able summary; raises TerminalError when load/build fails."""
    t0 = time.perf_counter()
    task = load_task(task_dir)
    sol = Path(solution) if solution else None
    if sol is not None and not sol.is_file():
        raise TaskLoadError(f"{task.task_id}: solution file {sol} not found")
    agent = ScriptedAgent.from_file(sol) if sol else ScriptedAgent([])
    builder = ImageBuilder(client)
    built = builder.ensure(task)  # raises ImageBuildError with the failing step
    config = config or EpisodeConfig()
    config.check_initial = True
    record = run_episode(task, agent, client=client, builder=builder, config=config)
    return {
        "task_id": task.task_id,
        "layout": task.layout,
        "image": built.tag,
        "image_built": built.built,
        "image_fallback": built.fell_back,
        "build_s": round(built.seconds, 3),
        "initial_ok": record.initial_ok,
        "reward": record.reward,
        "passed": record.passed,
        "turns": record.turns,
        "done": record.done,
        "timed_out": record.timed_out,
        "error": record.error,
        "start_s": round(record.start_s, 3),
        "verifier_output": record.verifier_output[-2000:],
        "duration_s": round(time.perf_counter() - t0, 3),
    }
