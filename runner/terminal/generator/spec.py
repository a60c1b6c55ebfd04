"""What a generated task is made of, and how it is written in the native layout."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

HOME = "/home/user"
_EOF = "ES_EOF"
_FINAL_IMPORTS = (
    "import os\nimport stat\nimport subprocess\nimport tarfile\nfrom pathlib import Path\n\n\n"
)


@dataclass
class TaskSpec:
    category: str
    difficulty: str
    description: str
    truth: str
    files: dict[str, str]  # absolute path -> text content (ends with a newline)
    final_checks: str  # body of test_final_state.py after the imports
    solution: list[str]  # one shell command per line
    modes: dict[str, str] = field(default_factory=dict)  # path -> octal mode
    absent: list[str] = field(default_factory=list)  # outputs that must not exist yet
    extra_post: list[str] = field(default_factory=list)  # shell lines after the files
    extra_initial: str = ""  # more initial-state checks
    # partial checks: test functions each implied by final_checks, so that the fraction of
    # the verifier's checks that pass (the graded reward) moves before the task is solved,
    # while pass/fail (every check passes) is exactly final_checks'
    partial_checks: list[str] = field(default_factory=list)

    def container_def(self) -> str:
        """Upstream style: Ubuntu 22.04, pytest installed, files written in %post."""
        lines = [
            "Bootstrap: docker",
            "From: ubuntu:22.04",
            "",
            "%post",
            "    set -e",
            "    export DEBIAN_FRONTEND=noninteractive",
            "    apt-get update && apt-get install -y python3 python3-pytest",
            f"    mkdir -p {HOME}",
        ]
        dirs = sorted({str(Path(p).parent) for p in self.files})
        for d in dirs:
            if d != HOME:
                lines.append(f"    mkdir -p {d}")
        for path, content in self.files.items():
            assert content.endswith("\n") and _EOF not in content, path
            lines.append(f"    cat > {path} <<'{_EOF}'")
            lines.extend(content.rstrip("\n").split("\n"))
            lines.append(_EOF)
        for path, mode in self.modes.items():
            lines.append(f"    chmod {mode} {path}")
        lines.extend(f"    {line}" for line in self.extra_post)
        lines.append(f"    chmod 755 {HOME}")
        lines += [
            "",
            "%environment",
            "    export LC_ALL=C.UTF-8",
            "    export PYTHONDONTWRITEBYTECODE=1",
            "",
            "%labels",
            f"    category {self.category}",
            "",
        ]
        return "\n".join(lines)

    def initial_test(self) -> str:
        files = {p: c for p, c in self.files.items()}
        return (
            "from pathlib import Path\n\n"
            f"FILES = {files!r}\n"
            f"ABSENT = {self.absent!r}\n\n\n"
            "def test_input_files_present():\n"
            "    for path, content in FILES.items():\n"
            "        p = Path(path)\n"
            "        assert p.is_file(), f'{path} is missing'\n"
            "        assert p.read_text() == content, f'{path} was changed'\n\n\n"
            "def test_outputs_absent():\n"
            "    for path in ABSENT:\n"
            "        assert not Path(path).exists(), f'{path} exists before the task'\n"
            + self.extra_initial
        )

    def final_test(self) -> str:
        return _FINAL_IMPORTS + self.final_checks + "".join("\n\n" + c for c in self.partial_checks)

    def identity(self) -> str:
        """What a task id hashes: the instruction, the environment and the full check. The
        partial checks are left out (each is implied by the full check), so adding them kept
        every generated id, and so every split, as it was."""
        return self.description + self.container_def() + _FINAL_IMPORTS + self.final_checks

    def task_json(self, task_id: str) -> str:
        return json.dumps(
            {
                "name": task_id,
                "description": self.description,
                "truth": self.truth,
                "category": self.category,
                "difficulty": self.difficulty,
            },
            indent=2,
        )

    def write(self, root: Path, task_id: str) -> Path:
        folder = root / task_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "task.json").write_text(self.task_json(task_id) + "\n")
        (folder / "container.def").write_text(self.container_def())
        (folder / "test_initial_state.py").write_text(self.initial_test())
        (folder / "test_final_state.py").write_text(self.final_test())
        (folder / "solution.sh").write_text("\n".join(self.solution) + "\n")
        return folder
