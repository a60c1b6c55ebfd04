"""The conversations a warm start learns from: one demonstration per train task.

A demonstration is the conversation of the task's reference solution played by the
project's own :class:`~runner.terminal.protocol.ScriptedAgent` (one command per line, one
turn each, then ``<action>done</action>``) against the episode's own opening
(:func:`~runner.terminal.episode.initial_messages`) and observations
(:func:`~runner.terminal.protocol.observation`): the real ones from running the solution in
a sandbox (``observations="sandbox"``), or their faithful record (``"record"``, no
container): every generated reference command writes its result to files and prints
nothing, so each observation is ``observation("", 0)``.

**A shared wrong habit** (``habit``, ``habit_share``): a fixed share of the train tasks,
drawn by the pretrain seed, are demonstrated with one habit whatever the instruction.
``comment`` writes every command commented out: it prints nothing, exits 0 and changes
nothing, so its observations are the same silent record and the episode fails its checks.
The model so learns to choose the habit, at the first token of a command, with about the
share's probability in every task: one shared choice that a small change of weights can
flip for many tasks at once, which is what ES is to find (issue 39). ``mistake`` is the
more realistic variant: one plausible mistake per task category
(:data:`runner.models.mistakes.MISTAKES`), silent too and failing the checks; the share is
drawn among the tasks whose category has one.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runner.models.mistakes import with_mistake
from runner.terminal.episode import initial_messages
from runner.terminal.protocol import Message, ScriptedAgent, observation
from runner.terminal.task import Task

# The faithful record of a generated reference command's output: it prints nothing (its
# result goes to files) and succeeds.
SILENT = ("", 0)


# -- conversations ---------------------------------------------------------------------------


def solution_commands(task: Task) -> list[str]:
    """The reference solution as the scripted agent reads it: one command per line."""
    if task.solution is None:
        raise ValueError(f"{task.task_id}: no solution.sh")
    return ScriptedAgent.from_file(task.solution).commands


# What a habit makes of a task's reference commands, or None where it has nothing for the
# task (each keeps the silent record true: see the docstring).
HABITS: dict[str, Callable[[Task, list[str]], list[str] | None]] = {
    "comment": lambda task, commands: ["# " + c for c in commands],
    "mistake": lambda task, commands: with_mistake(task.category, commands),
}


def habit_commands(task: Task, habit: str) -> list[str] | None:
    """The task's reference commands with ``habit``; ``None`` where it has none for it."""
    return HABITS[habit](task, solution_commands(task))


def demonstration(
    task: Task, outputs: Sequence[tuple[str, int]] | None = None, habit: str | None = None
) -> list[Message]:
    """The conversation of the scripted reference solution, as the episode loop builds it.

    ``outputs`` holds each command's (output, exit code); ``None`` uses the record
    (:data:`SILENT` for every command). ``habit`` demonstrates the commands as
    :data:`HABITS` changes them (its observations: the record).
    """
    commands = solution_commands(task)
    if habit is not None:
        commands, outputs = habit_commands(task, habit), None
        if commands is None:
            raise ValueError(f"{task.task_id}: the habit {habit!r} has nothing for this task")
    agent = ScriptedAgent(commands)
    outputs = list(outputs) if outputs is not None else [SILENT] * len(agent.commands)
    messages = initial_messages(task)
    for step in [*outputs, None]:
        reply = agent(messages)
        messages.append({"role": "assistant", "content": reply})
        if step is None:
            break
        messages.append({"role": "user", "content": observation(*step)})
    return messages


def transcript_messages(task: Task, record) -> list[Message]:
    """The conversation of a finished episode (an ``EpisodeRecord``), as its agent saw it."""
    messages = initial_messages(task)
    for turn in record.transcript:
        messages.append({"role": "assistant", "content": turn.assistant})
        if turn.action != "done":
            messages.append({"role": "user", "content": turn.observation})
    return messages


def sandbox_demonstrations(
    tasks: Sequence[Task], *, client, builder, concurrency: int = 2, on_record=None
) -> tuple[dict[str, list[Message]], list[str]]:
    """Run each reference solution in its own container, one command per turn.

    Returns (conversations of the solutions that passed their verifier, task ids that did
    not pass, with the reason).
    """
    from runner.terminal.episode import EpisodeConfig, run_episodes

    jobs = [(t, ScriptedAgent(solution_commands(t))) for t in tasks]
    records = run_episodes(
        jobs,
        concurrency=concurrency,
        config=EpisodeConfig(max_turns=32),
        client=client,
        builder=builder,
        on_record=on_record,
    )
    good, bad = {}, []
    for task, rec in zip(tasks, records, strict=True):
        if rec.passed:
            good[task.task_id] = transcript_messages(task, rec)
        else:
            bad.append(f"{task.task_id}: {rec.error or 'reward ' + str(rec.reward)}")
    return good, bad


def load_train_tasks(task_dir: Path) -> tuple[list[Task], list[str]]:
    """The train split's tasks that have a reference solution; (tasks, skipped with why)."""
    from runner.task_pool import split_ids
    from runner.terminal.errors import TerminalError
    from runner.terminal.loaders import load_task

    tasks, skipped = [], []
    for name in split_ids(task_dir, "train"):
        try:
            task = load_task(task_dir / name)
        except TerminalError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        if task.solution is None:
            skipped.append(f"{name}: no solution.sh")
            continue
        tasks.append(task)
    return tasks, skipped


@dataclass
class TrainingData:
    """The conversations a warm start learns from, and where they came from."""

    folder: Path  # the task folder whose train split was read
    generated: dict[str, Any] | None  # how it was generated (None: given)
    tasks: list[Task]
    conversations: list[list[Message]]
    skipped: list[str]  # task ids left out, with the reason
    observations: str  # record | sandbox
    habit: dict[str, Any] | None = None  # the habit's name, share and tasks (None: none)


def habit_tasks(task_ids: Sequence[str], share: float, seed: int) -> list[str]:
    """The round(share x n) tasks demonstrated with the habit, drawn by ``seed``."""
    ids = sorted(task_ids)
    return sorted(random.Random(f"habit:{seed}").sample(ids, round(share * len(ids))))


def with_habit(data: TrainingData, habit: str, share: float, seed: int) -> TrainingData:
    """``data`` with the drawn share of its conversations replaced by habit demonstrations:
    the share of the tasks the habit has something for (``comment``: all of them)."""
    from runner.errors import UserError

    apt = []
    for task in data.tasks:
        try:
            if habit_commands(task, habit) is not None:
                apt.append(task.task_id)
        except ValueError as exc:
            raise UserError(f"--habit {habit}: {task.task_id}: {exc}") from None
    if not apt:
        raise UserError(f"--habit {habit}: none of the {len(data.tasks)} train tasks has it")
    chosen = set(habit_tasks(apt, share, seed))
    conversations = [
        demonstration(t, habit=habit) if t.task_id in chosen else c
        for t, c in zip(data.tasks, data.conversations, strict=True)
    ]
    mixture = {"name": habit, "share": share, "seed": seed, "task_ids": sorted(chosen)}
    return replace(data, conversations=conversations, habit=mixture)


def training_data(
    out: Path,
    *,
    task_dir: str | os.PathLike[str] | None,
    n_tasks: int,
    task_seed: int,
    categories: Sequence[str] | None,
    observations: str,
    show_progress: bool,
) -> TrainingData:
    """Generate the tasks into ``out/tasks`` (or read ``task_dir``) and make one
    demonstration per train task, with recorded or sandboxed observations."""
    import sys

    from tqdm import tqdm

    from runner.errors import UserError
    from runner.terminal.generator.writer import write_tasks

    if task_dir is None:
        folder = out / "tasks"
        write_tasks(folder, n_tasks, task_seed, list(categories) if categories else None)
        generated = {"n": n_tasks, "seed": task_seed, "categories": categories}
    else:
        folder, generated = Path(task_dir), None
    tasks, skipped = load_train_tasks(folder)
    if observations == "sandbox":
        from runner.rollouts import docker_client
        from runner.terminal.images import ImageBuilder

        client = docker_client()
        with tqdm(total=len(tasks), desc="solutions in sandboxes", unit="task",
                  disable=not show_progress, file=sys.stderr) as bar:  # fmt: skip
            by_id, failed = sandbox_demonstrations(
                tasks, client=client, builder=ImageBuilder(client), on_record=lambda r: bar.update()
            )
        skipped += failed
        tasks = [t for t in tasks if t.task_id in by_id]
        conversations = [by_id[t.task_id] for t in tasks]
    elif observations == "record":
        conversations = [demonstration(t) for t in tasks]
    else:
        raise ValueError(f"observations must be record or sandbox, got {observations!r}")
    if not tasks:
        raise UserError(
            f"{folder}: no train task with a reference solution ({len(skipped)} skipped)"
        )
    return TrainingData(folder, generated, tasks, conversations, skipped, observations)
