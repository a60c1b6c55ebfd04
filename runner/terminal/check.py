"""``env check`` and ``tasks check``: build tasks, test initial states, solve, replay, verify."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import docker

from runner.terminal.episode import EpisodeConfig, run_episode
from runner.terminal.errors import TaskLoadError, TerminalError, UnsupportedTaskError
from runner.terminal.images import ImageBuilder
from runner.terminal.loaders import detect_layout, find_tasks, load_task
from runner.terminal.protocol import Agent, ScriptedAgent, SolutionScriptAgent
from runner.terminal.replay import load_recording, replay_recording
from runner.terminal.task import Task

SolutionMode = Literal["script", "lines"]


def solution_agent(task: Task, solution: str | Path | None, mode: SolutionMode) -> Agent:
    """The agent that plays a solution file: one script (default) or one command per line."""
    sol = Path(solution) if solution else task.solution
    if sol is None:
        return ScriptedAgent([])
    if not sol.is_file():
        raise TaskLoadError(f"{task.task_id}: solution file {sol} not found")
    if mode == "lines":
        return ScriptedAgent.from_file(sol)
    folder = None
    if solution is None and task.solution_dir is not None:
        folder = task.solution_dir  # Harbor: the whole solution/ folder is uploaded
    return SolutionScriptAgent(sol, folder=folder)


def check_task(
    task_dir: str | Path,
    solution: str | Path | None,
    client: docker.DockerClient,
    config: EpisodeConfig | None = None,
    *,
    solution_mode: SolutionMode = "script",
    builder: ImageBuilder | None = None,
) -> dict[str, Any]:
    """Return the check's JSON-able summary; raises TerminalError when load/build fails."""
    t0 = time.perf_counter()
    task = load_task(task_dir)
    agent = solution_agent(task, solution, solution_mode) if solution else ScriptedAgent([])
    builder = builder or ImageBuilder(client)
    built = builder.ensure(task)  # raises ImageBuildError with the failing step
    config = replace(config or EpisodeConfig())
    config.check_initial = True
    record = run_episode(task, agent, client=client, builder=builder, config=config)
    return {
        "task_id": task.task_id,
        "layout": task.layout,
        "image": built.tag,
        "image_built": built.built,
        "image_fallback": built.fell_back,
        "builder": built.builder,
        "build_s": round(built.seconds, 3),
        "build_notes": built.notes,
        "initial_ok": record.initial_ok,
        "reward": record.reward,
        "rewards": record.rewards,
        "passed": record.passed,
        "graded": record.graded,  # the fraction of the verifier's checks that passed
        "verifier": record.verifier,
        "verifier_error": record.verifier_error,
        "turns": record.turns,
        "done": record.done,
        "timed_out": record.timed_out,
        "error": record.error,
        "agent_user": task.agent_user,
        "start_s": round(record.start_s, 3),
        "verifier_output": record.verifier_output[-2000:],
        "duration_s": round(time.perf_counter() - t0, 3),
    }


def replay_task(
    task_dir: str | Path,
    recording: str | Path,
    client: docker.DockerClient,
    config: EpisodeConfig | None = None,
    *,
    index: int | None = None,
    replay_all: bool = False,
    concurrency: int = 4,
) -> dict[str, Any]:
    """``env check TASK --replay FILE``: one rollout (``index``, default 0) or all."""
    t0 = time.perf_counter()
    task = load_task(task_dir)
    rec = load_recording(recording)
    indices = None if replay_all else [0 if index is None else index]
    report = replay_recording(
        task, rec, client=client, indices=indices, config=config, concurrency=concurrency
    )
    report["layout"] = task.layout
    report["duration_s"] = round(time.perf_counter() - t0, 3)
    return report


def _status(value: bool | None) -> str:
    return "-" if value is None else ("pass" if value else "FAIL")


def check_one(path: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """One row of the compatibility report; an unexpected failure becomes the row's error."""
    try:
        return _check_one(path, *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - one task must not end the report
        return {
            "path": str(path),
            "task_id": path.name,
            "layout": None,
            "load": "error",
            "error": f"{path.name}: {type(exc).__name__}: {exc}",
        }


def _check_one(
    path: Path,
    client: docker.DockerClient,
    builder: ImageBuilder,
    config: EpisodeConfig,
    *,
    solutions: bool,
    max_replays: int | None,
    replay_concurrency: int = 2,
) -> dict[str, Any]:
    """One row of the compatibility report (never raises for a task's own problems)."""
    row: dict[str, Any] = {"path": str(path), "task_id": path.name, "layout": detect_layout(path)}
    try:
        task = load_task(path)
    except UnsupportedTaskError as exc:
        row.update(load="unsupported", error=str(exc))
        return row
    except TerminalError as exc:
        row.update(load="error", error=str(exc))
        return row
    row.update(task_id=task.task_id, layout=task.layout, load="ok", load_notes=task.notes)
    try:
        built = builder.ensure(task)
    except TerminalError as exc:
        row.update(build="FAIL", error=str(exc))
        return row
    row.update(
        build="built" if built.built else "cached",
        builder=built.builder,
        fallback=built.fell_back,
        build_notes=built.notes,
    )
    cfg = replace(config)
    cfg.check_initial = True
    agent: Agent = ScriptedAgent([])
    if solutions and task.solution is not None:
        agent = solution_agent(task, None, "script")
    record = run_episode(task, agent, client=client, builder=builder, config=cfg)
    row["initial_ok"] = record.initial_ok
    if solutions:
        if task.solution is None:
            row["solution"] = None
        else:
            row.update(
                solution=record.reward,
                rewards=record.rewards,
                verifier=record.verifier,
                verifier_error=record.verifier_error,
            )
            if record.error:
                row["error"] = record.error
            if not record.passed:
                row["verifier_output"] = record.verifier_output[-800:]
    if solutions and task.recordings and max_replays != 0:
        agree = total = 0
        files = []
        for rec_path in task.recordings:
            try:
                rec = load_recording(rec_path)
            except TerminalError as exc:
                files.append({"recording": str(rec_path), "error": str(exc)})
                continue
            n = len(rec.rollouts) if max_replays is None else min(max_replays, len(rec.rollouts))
            report = replay_recording(
                task,
                rec,
                client=client,
                indices=list(range(n)),
                builder=builder,
                config=config,
                concurrency=replay_concurrency,
            )
            agree += sum(1 for e in report["replays"] if e["agree"])
            total += len(report["replays"])
            files.append(report)
        row["replays"] = files
        row["replay_agreement"] = agree / total if total else None
        row["replay_counts"] = [agree, total]
    return row


def check_dir(
    root: str | Path,
    client: docker.DockerClient,
    config: EpisodeConfig | None = None,
    *,
    solutions: bool = False,
    concurrency: int = 4,
    max_replays: int | None = None,
    builder: ImageBuilder | None = None,
) -> dict[str, Any]:
    """``tasks check DIR``: every task under ``root``; rows in path order and a summary."""
    t0 = time.perf_counter()
    paths = find_tasks(root)
    if not paths:
        raise TaskLoadError(f"{root}: no task folders found")
    config = config or EpisodeConfig()
    builder = builder or ImageBuilder(client)
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        rows = list(
            pool.map(
                lambda p: check_one(
                    p, client, builder, config, solutions=solutions, max_replays=max_replays
                ),
                paths,
            )
        )
    return {"root": str(root), "tasks": rows, "summary": summarize(rows, solutions, t0)}


def summarize(rows: list[dict[str, Any]], solutions: bool, t0: float) -> dict[str, Any]:
    loaded = [r for r in rows if r.get("load") == "ok"]
    built = [r for r in loaded if r.get("build") in ("built", "cached")]
    summary: dict[str, Any] = {
        "tasks": len(rows),
        "loaded": len(loaded),
        "unsupported": sum(1 for r in rows if r.get("load") == "unsupported"),
        "load_errors": sum(1 for r in rows if r.get("load") == "error"),
        "built": len(built),
        "initial_pass": sum(1 for r in built if r.get("initial_ok") is True),
        "initial_fail": sum(1 for r in built if r.get("initial_ok") is False),
        "duration_s": round(time.perf_counter() - t0, 1),
    }
    if solutions:
        with_solution = [r for r in built if r.get("solution") is not None]
        summary["with_solution"] = len(with_solution)
        summary["solved"] = sum(1 for r in with_solution if (r["solution"] or 0) >= 1.0)
        summary["verifier_needs_network"] = sum(
            1 for r in with_solution if (r.get("verifier_error") or "").startswith("verifier needs")
        )
        counts = [r["replay_counts"] for r in built if r.get("replay_counts")]
        agree, total = sum(c[0] for c in counts), sum(c[1] for c in counts)
        summary["replays"] = total
        summary["replay_agreement"] = round(agree / total, 3) if total else None
    return summary


def format_row(row: dict[str, Any]) -> str:
    """One line: task, layout, build, initial state, solution reward, replay agreement."""
    parts = [row["task_id"], row.get("layout") or "?"]
    if row.get("load") != "ok":
        return "  ".join([*parts, f"{row.get('load', 'error').upper()}: {row.get('error')}"])
    if row.get("build") == "FAIL":
        return "  ".join([*parts, f"build=FAIL: {row.get('error')}"])
    build = row["build"] + ("/buildkit" if row.get("builder") == "buildkit" else "")
    build += " (FROM fallback)" if row.get("fallback") else ""
    parts += [f"build={build}", f"initial={_status(row.get('initial_ok'))}"]
    if "solution" in row:
        sol = row["solution"]
        text = "none" if sol is None else f"{sol:g}"
        if row.get("rewards") and len(row["rewards"]) > 1:
            text += " " + ",".join(f"{k}={v:g}" for k, v in sorted(row["rewards"].items()))
        if row.get("verifier") == "offline-pytest":
            text += " (offline verifier)"
        if row.get("verifier_error"):
            text += f" [{row['verifier_error'][:90]}]"
        elif row.get("error"):
            text += f" [{row['error'][:90]}]"
        parts.append(f"solution={text}")
    if row.get("replay_counts"):
        agree, total = row["replay_counts"]
        parts.append(f"replays={agree}/{total} agree")
    notes = len(row.get("build_notes") or []) + len(row.get("load_notes") or [])
    if notes:
        parts.append(f"notes={notes}")
    return "  ".join(parts)


def format_summary(summary: dict[str, Any]) -> str:
    s = summary
    text = (
        f"{s['tasks']} task(s): {s['loaded']} loaded ({s['unsupported']} unsupported, "
        f"{s['load_errors']} load errors), {s['built']} built, initial state "
        f"{s['initial_pass']} pass / {s['initial_fail']} fail"
    )
    if "solved" in s:
        text += f", solutions {s['solved']}/{s['with_solution']} solved"
        if s["verifier_needs_network"]:
            text += f" ({s['verifier_needs_network']} verifier(s) need network)"
        if s["replays"]:
            text += f", replay agreement {s['replay_agreement']:.3f} over {s['replays']} rollouts"
    return text + f"; {s['duration_s']} s"
