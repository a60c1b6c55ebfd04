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
    docker_image: str | None = None  # Harbor's [environment].docker_image (no Dockerfile)

    def digest(self) -> str:
        """Hash of everything that goes into the build, for the image cache."""
        h = hashlib.sha256()
        if self.definition is not None:
            d = self.definition
            for part in (d.bootstrap, d.from_image, d.post, d.environment, d.test):
                h.update(part.encode())
                h.update(b"\0")
        if self.dockerfile is not None:
            h.update(self.dockerfile.encode())
        if self.docker_image is not None:
            h.update(b"image:" + self.docker_image.encode())
        if self.context_dir is not None:
            for path in sorted(self.context_dir.rglob("*")):
                if path.is_file():
                    h.update(str(path.relative_to(self.context_dir)).encode())
                    h.update(b"\0")
                    h.update(path.read_bytes())
        return h.hexdigest()


Layout = Literal["native", "harbor", "terminal-bench"]


@dataclass
class Task:
    """A loaded task. ``agent_user``/``workdir`` say where the agent's shell runs.

    ``agent_user`` is a name or a uid as docker exec takes it: native tasks run as uid 1000,
    which is what upstream's agent is (the invoking user of an unprivileged Apptainer), Harbor
    tasks as ``[agent].user``, else the Dockerfile's last ``USER``, else root.
    """

    task_id: str
    path: Path
    layout: Layout
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
    # Everything below was added for third-party layouts; defaults keep older callers working.
    home: str | None = "/home/user"  # $HOME of the agent; None: from the image's passwd
    umask: str | None = None  # the agent shell's umask (native: upstream's 0002)
    pipefail: bool = False  # `set -o pipefail` in the agent's shell (native: as upstream's)
    env: dict[str, str] = field(default_factory=dict)  # every exec (Harbor [environment].env)
    verifier_env: dict[str, str] = field(default_factory=dict)  # Harbor [verifier].env
    solution_env: dict[str, str] = field(default_factory=dict)  # Harbor [solution].env
    verifier_user: str | None = None  # None: the agent's user
    # Linux capabilities beyond the sandbox's profile (sandbox.AGENT_CAPABILITIES) that this
    # task genuinely needs, e.g. ("NET_RAW",) for a task about ping; none by default.
    capabilities: tuple[str, ...] = ()
    # Whether the verifier gets a network (Harbor [environment].allow_internet, whose default
    # is true); EpisodeConfig.verifier_network overrides it.
    allow_internet: bool = False
    test_script: Path | None = None  # Harbor tests/test.sh, Terminal-Bench run-tests.sh
    solution_dir: Path | None = None  # uploaded to /solution for the oracle (Harbor)
    recordings: list[Path] = field(default_factory=list)  # solutions/*_summary.json
    # "pytest": this native task's test files always run under pytest, never the light
    # verifier (task.json's "verifier"); None: the run's choice
    verifier: str | None = None
    notes: list[str] = field(default_factory=list)  # what loading reinterpreted
