"""Load a task folder in the native or the Harbor layout into a :class:`Task`."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

from runner.terminal.apptainer import parse_definition
from runner.terminal.errors import TaskLoadError
from runner.terminal.task import ImageRecipe, Task, TaskLimits

NATIVE_FILES = ("task.json", "test_final_state.py", "container.def")
HARBOR_FILES = ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh")


def load_task(path: str | Path) -> Task:
    """Detect the layout of ``path`` and load it; raises :class:`TaskLoadError`."""
    root = Path(path)
    if not root.is_dir():
        raise TaskLoadError(f"{root}: not a task folder (no such directory)")
    if (root / "task.json").exists() or (root / "container.def").exists():
        return load_native(root)
    if (root / "task.toml").exists() or (root / "instruction.md").exists():
        return load_harbor(root)
    raise TaskLoadError(
        f"{root}: not a task folder: expected task.json + container.def (native layout) "
        f"or task.toml + instruction.md (Harbor layout)"
    )


def _require(root: Path, names: tuple[str, ...]) -> None:
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise TaskLoadError(f"{root.name}: missing file(s): {', '.join(missing)}")


def _read(root: Path, name: str) -> str:
    try:
        return (root / name).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskLoadError(f"{root.name}: {name} is not UTF-8 text ({exc.reason})") from None


def _limits_from_upstream(config: dict[str, Any], where: str) -> TaskLimits:
    """Read the upstream ``config`` block (agent/verifier timeouts, environment sizes)."""
    limits = TaskLimits()
    env = config.get("environment", {}) or {}
    try:
        limits.agent_timeout_s = float(config.get("agent_timeout_sec", limits.agent_timeout_s))
        limits.verifier_timeout_s = float(
            config.get("verifier_timeout_sec", limits.verifier_timeout_s)
        )
        limits.build_timeout_s = float(env.get("build_timeout_sec", limits.build_timeout_s))
        limits.cpus = float(env.get("cpus", limits.cpus))
        limits.memory_mb = int(env.get("memory_mb", limits.memory_mb))
        limits.storage_mb = int(env.get("storage_mb", limits.storage_mb))
        limits.pids = int(env.get("pids", limits.pids))
    except (TypeError, ValueError) as exc:
        raise TaskLoadError(f"{where}: bad value in task config: {exc}") from None
    return limits


def load_native(root: Path) -> Task:
    _require(root, NATIVE_FILES)
    try:
        meta = json.loads(_read(root, "task.json"))
    except json.JSONDecodeError as exc:
        raise TaskLoadError(
            f"{root.name}: task.json is not valid JSON (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg})"
        ) from None
    if not isinstance(meta, dict):
        raise TaskLoadError(f"{root.name}: task.json must hold a JSON object")
    description = meta.get("description") or meta.get("instruction")
    if not isinstance(description, str) or not description.strip():
        raise TaskLoadError(f"{root.name}: task.json has no 'description' string")
    task_id = str(meta.get("name") or meta.get("task_id") or root.name)
    definition = parse_definition(_read(root, "container.def"), task_id)
    initial = root / "test_initial_state.py"
    solution = root / "solution.sh"
    metadata = meta.get("metadata", {}) if isinstance(meta.get("metadata"), dict) else {}
    config = meta.get("config", {}) if isinstance(meta.get("config"), dict) else {}
    return Task(
        task_id=task_id,
        path=root,
        layout="native",
        instruction=description,
        truth=meta.get("truth"),
        recipe=ImageRecipe(definition=definition),
        limits=_limits_from_upstream(config, task_id),
        initial_test=_read(root, "test_initial_state.py") if initial.is_file() else None,
        final_test=_read(root, "test_final_state.py"),
        solution=solution if solution.is_file() else None,
        category=meta.get("category") or metadata.get("category"),
        difficulty=meta.get("difficulty") or metadata.get("difficulty"),
    )


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)


def _size_mb(value: Any, field_name: str, where: str) -> int:
    """Harbor writes sizes as numbers of MB or strings like '2G' / '512M'."""
    if isinstance(value, int | float):
        return int(value)
    match = _SIZE.match(str(value))
    if not match:
        raise TaskLoadError(f"{where}: task.toml {field_name} = {value!r} is not a size")
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2).upper()]
    return int(float(match.group(1)) * scale)


def load_harbor(root: Path) -> Task:
    _require(root, HARBOR_FILES)
    try:
        meta = tomllib.loads(_read(root, "task.toml"))
    except tomllib.TOMLDecodeError as exc:
        raise TaskLoadError(f"{root.name}: task.toml is not valid TOML ({exc})") from None
    task_id = root.name
    limits = TaskLimits()
    verifier = meta.get("verifier", {})
    agent = meta.get("agent", {})
    env = meta.get("environment", {})
    try:
        limits.verifier_timeout_s = float(verifier.get("timeout_sec", limits.verifier_timeout_s))
        limits.agent_timeout_s = float(agent.get("timeout_sec", limits.agent_timeout_s))
        limits.build_timeout_s = float(env.get("build_timeout_sec", limits.build_timeout_s))
        limits.cpus = float(env.get("cpus", limits.cpus))
    except (TypeError, ValueError, AttributeError) as exc:
        raise TaskLoadError(f"{task_id}: bad value in task.toml: {exc}") from None
    if "memory_mb" in env or "memory" in env:
        limits.memory_mb = _size_mb(env.get("memory_mb", env.get("memory")), "memory", task_id)
    if "storage_mb" in env or "storage" in env:
        limits.storage_mb = _size_mb(env.get("storage_mb", env.get("storage")), "storage", task_id)
    dockerfile = _read(root, "environment/Dockerfile")
    workdirs = re.findall(r"^\s*WORKDIR\s+(\S+)", dockerfile, flags=re.MULTILINE | re.IGNORECASE)
    solution = root / "solution" / "solve.sh"
    metadata = meta.get("metadata", {}) if isinstance(meta.get("metadata"), dict) else {}
    return Task(
        task_id=task_id,
        path=root,
        layout="harbor",
        instruction=_read(root, "instruction.md"),
        recipe=ImageRecipe(dockerfile=dockerfile, context_dir=root / "environment"),
        limits=limits,
        tests_dir=root / "tests",
        solution=solution if solution.is_file() else None,
        category=metadata.get("category"),
        difficulty=metadata.get("difficulty"),
        # Harbor tasks are written for a root agent in the image's WORKDIR.
        agent_user="root",
        workdir=workdirs[-1] if workdirs else "/root",
        home_tmpfs=False,
    )
