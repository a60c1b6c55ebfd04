"""One task model for both layouts (native Endless Terminals and Harbor)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from runner.terminal.apptainer import Definition


@dataclass
class TaskLimits:
    """Time and resource limits; defaults are the upstream task config's."""

    agent_timeout_s: float = 300.0
    verifier_timeout_s: float = 300.0
    build_timeout_s: float = 600.0
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    pids: int = 512


@dataclass
class ImageRecipe:
    """How to build a task's image: a container.def (native) or a Dockerfile + context."""

    definition: Definition | None = None
    dockerfile: str | None = None
    context_dir: Path | None = None

    def digest(self) -> str:
        """Hash of everything that goes into the build, for the image cache."""
        h = hashlib.sha256()
        if self.definition is not None:
            d = self.definition
            for part in (d.bootstrap, d.from_image, d.post, d.environment):
                h.update(part.encode())
                h.update(b"\0")
        if self.dockerfile is not None:
            h.update(self.dockerfile.encode())
        if self.context_dir is not None:
            for path in sorted(self.context_dir.rglob("*")):
                if path.is_file():
                    h.update(str(path.relative_to(self.context_dir)).encode())
                    h.update(b"\0")
                    h.update(path.read_bytes())
        return h.hexdigest()


@dataclass
class Task:
    """A loaded task. ``agent_user``/``workdir`` say where the agent's shell runs."""

    task_id: str
    path: Path
    layout: Literal["native", "harbor"]
    instruction: str
    recipe: ImageRecipe
    limits: TaskLimits = field(default_factory=TaskLimits)
    truth: str | None = None
    initial_test: str | None = None
    final_test: str | None = None
    tests_dir: Path | None = None
    solution: Path | None = None
    category: str | None = None
    difficulty: str | None = None
    agent_user: str = "user"
    workdir: str = "/home/user"
    # Native tasks keep /home/user on a size-limited tmpfs (seeded from the image) so a
    # command that fills the disk hits a clear ENOSPC instead of the host's disk.
    home_tmpfs: bool = True
