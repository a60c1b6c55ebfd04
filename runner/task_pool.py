"""The tasks a run draws from: one split of a task folder, loaded and built up front.

A task that cannot be loaded or whose image cannot be built is recorded (stage and
one-line error) and left out, never fatal; the run fails only if no task is left.
Jobs draw their task batch from a named seed, so members dispatched at one version can
share it (common random numbers).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runner.errors import UserError
from runner.terminal.errors import ImageBuildError, TerminalError
from runner.terminal.images import ImageBuilder
from runner.terminal.loaders import load_task
from runner.terminal.task import Task

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Skipped:
    task: str
    stage: str  # load | build
    error: str


def split_ids(folder: Path, split: str) -> list[str]:
    """Task folder names of ``split`` (``<split>.txt``), or every task folder for ``all``."""
    if not folder.is_dir():
        raise UserError(f"tasks.dir {folder}: no such folder")
    if split == "all":
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    listing = folder / f"{split}.txt"
    if not listing.is_file():
        have = [s for s in SPLITS if (folder / f"{s}.txt").is_file()]
        raise UserError(
            f"tasks.split {split!r}: {folder} has no {split}.txt "
            f"(splits there: {', '.join(have) or 'none'}; use split: all for every task)"
        )
    return [ln.strip() for ln in listing.read_text().splitlines() if ln.strip()]


class TaskPool:
    def __init__(self, tasks: list[Task], skipped: list[Skipped]) -> None:
        if not tasks:
            first = f" (first: {skipped[0].task}: {skipped[0].error})" if skipped else ""
            raise UserError(f"no usable task: {len(skipped)} skipped{first}")
        self.tasks = sorted(tasks, key=lambda t: t.task_id)
        self.by_id = {t.task_id: t for t in self.tasks}
        self.skipped = skipped

    @classmethod
    def prepare(
        cls,
        folder: Path,
        split: str,
        builder: ImageBuilder,
        *,
        threads: int = 2,
        limit: int | None = None,
        only: Collection[str] | None = None,
        progress=None,
    ) -> TaskPool:
        """Load and build the split's tasks (cached images are reused at once); ``only``:
        just these of them (``tasks.signal``: those with predicted success in its band).

        The caller checks the engine and the base image first (:func:`docker_ready`), so a
        build failure here is the task's own.
        """
        ids = split_ids(folder, split)[:limit]
        if only is not None:
            wanted = set(only)
            ids = [i for i in ids if i in wanted]
        tasks, skipped = [], []
        for name in ids:
            try:
                tasks.append(load_task(folder / name))
            except TerminalError as exc:
                skipped.append(Skipped(name, "load", str(exc)))

        def build(task: Task) -> Skipped | None:
            try:
                builder.ensure(task)
            except ImageBuildError as exc:
                return Skipped(task.task_id, "build", str(exc))
            return None

        with ThreadPoolExecutor(max(1, threads), thread_name_prefix="build") as pool:
            failed = []
            for task, result in zip(tasks, pool.map(build, tasks), strict=True):
                if result is not None:
                    failed.append(result)
                    log.warning("task %s skipped: %s", task.task_id, result.error)
                if progress is not None:
                    progress(1)
        bad = {s.task for s in failed}
        return cls([t for t in tasks if t.task_id not in bad], skipped + failed)

    def __len__(self) -> int:
        return len(self.tasks)

    def batch(self, seed: int, size: int) -> list[Task]:
        """``size`` tasks drawn by ``seed``: without replacement while the pool allows."""
        rng = np.random.default_rng(seed)
        replace = size > len(self.tasks)
        return [self.tasks[i] for i in rng.choice(len(self.tasks), size, replace=replace)]
