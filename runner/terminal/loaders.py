"""Load a task folder in the native, Harbor or Terminal-Bench 1 layout into a :class:`Task`.

Features a layout has that this runner does not run (Harbor's multi-step ``[[steps]]``,
``docker-compose.yaml`` sidecars, the separate-verifier mode) are refused with one line
naming the feature (:class:`UnsupportedTaskError`).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from runner.terminal.apptainer import parse_definition
from runner.terminal.errors import TaskLoadError, UnsupportedTaskError
from runner.terminal.task import ImageRecipe, Task, TaskLimits

NATIVE_FILES = ("task.json", "test_final_state.py", "container.def")
HARBOR_FILES = ("instruction.md", "task.toml", "tests/test.sh")
TBENCH_FILES = ("task.yaml", "Dockerfile")
# Upstream's agent is the user who ran apptainer, uid 1000 on its machines, with a 0002 umask
# (see docs/terminal.md); ES_TERMINAL_NATIVE_USER=root (or a name) runs it as someone else.
NATIVE_AGENT_USER = "1000"
NATIVE_UMASK = "0002"


def load_task(path: str | Path) -> Task:
    """Detect the layout of ``path`` and load it; raises :class:`TaskLoadError`."""
    root = Path(path)
    if not root.is_dir():
        raise TaskLoadError(f"{root}: not a task folder (no such directory)")
    if (root / "task.json").exists() or (root / "container.def").exists():
        return load_native(root)
    if (root / "task.toml").exists() or (root / "instruction.md").exists():
        return load_harbor(root)
    if (root / "task.yaml").exists():
        return load_terminal_bench(root)
    raise TaskLoadError(
        f"{root}: not a task folder: expected task.json + container.def (native layout), "
        f"task.toml + instruction.md (Harbor layout) or task.yaml + Dockerfile "
        f"(Terminal-Bench 1 layout)"
    )


def detect_layout(root: Path) -> str | None:
    """The layout a folder is in, by its marker files (None: not a task folder)."""
    if (root / "task.json").exists() or (root / "container.def").exists():
        return "native"
    if (root / "task.toml").exists() or (root / "instruction.md").exists():
        return "harbor"
    if (root / "task.yaml").exists():
        return "terminal-bench"
    return None


def find_tasks(path: str | Path) -> list[Path]:
    """Task folders at or under ``path`` (a folder that is a task is not searched further)."""
    root = Path(path)
    if not root.is_dir():
        raise TaskLoadError(f"{root}: no such directory")
    markers = ("task.json", "container.def", "task.toml", "instruction.md", "task.yaml")
    found: list[Path] = []

    def walk(d: Path) -> None:
        if any((d / m).exists() for m in markers):
            found.append(d)
            return
        for child in sorted(d.iterdir()):
            if child.is_dir() and not child.name.startswith("."):
                walk(child)

    walk(root)
    return found


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
    verifier = meta.get("verifier")
    if verifier not in (None, "light", "pytest"):
        raise TaskLoadError(f"{root.name}: task.json's verifier must be light or pytest")
    return Task(
        task_id=task_id,
        path=root,
        layout="native",
        verifier=verifier,
        instruction=description,
        truth=meta.get("truth"),
        recipe=ImageRecipe(definition=definition),
        limits=_limits_from_upstream(config, task_id),
        initial_test=_read(root, "test_initial_state.py") if initial.is_file() else None,
        final_test=_read(root, "test_final_state.py"),
        solution=solution if solution.is_file() else None,
        category=meta.get("category") or metadata.get("category"),
        difficulty=meta.get("difficulty") or metadata.get("difficulty"),
        agent_user=os.environ.get("ES_TERMINAL_NATIVE_USER", NATIVE_AGENT_USER),
        umask=NATIVE_UMASK,
        pipefail=True,
        recordings=sorted((root / "solutions").glob("*_summary.json")),
        notes=list(definition.notes),
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


def _resolve_env(table: Any, where: str, what: str) -> dict[str, str]:
    """Harbor's env tables: values may use ${VAR} / ${VAR:-default} from the host."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise TaskLoadError(f"{where}: task.toml {what} must be a table of strings")
    out = {}
    for key, value in table.items():
        text = str(value)

        def sub(match: re.Match[str], key: str = str(key)) -> str:
            name, default = match.group(1), match.group(3)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise TaskLoadError(
                f"{where}: task.toml {what}.{key} uses ${{{name}}}, which is not set here"
            )

        out[str(key)] = re.sub(r"\$\{([A-Za-z_]\w*)(:-([^}]*))?\}", sub, text)
    return out


def dockerfile_user_and_workdir(text: str) -> tuple[str | None, str | None]:
    """The final stage's USER and WORKDIR (a stage built FROM an earlier one inherits them)."""
    stages: dict[str, tuple[str | None, str | None]] = {}
    user: str | None = None
    workdir: str | None = None
    alias: str | None = None
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        match = re.match(r"^\s*(\w+)\s+(.*?)\s*$", line)
        if not match or line.lstrip().startswith("#"):
            continue
        keyword, rest = match.group(1).upper(), match.group(2)
        if keyword == "FROM":
            if alias is not None:
                stages[alias] = (user, workdir)
            words = rest.split()
            words = [w for w in words if not w.startswith("--platform")]
            base = words[0].lower() if words else ""
            user, workdir = stages.get(base, (None, None))
            alias = words[2].lower() if len(words) >= 3 and words[1].upper() == "AS" else None
        elif keyword == "USER":
            user = rest.split(":")[0].strip() or None
        elif keyword == "WORKDIR":
            path = rest.strip().strip("\"'")
            workdir = path if path.startswith("/") else f"{(workdir or '/').rstrip('/')}/{path}"
    return user, workdir


def _check_compose(path: Path, where: str, main: str) -> str | None:
    """Refuse sidecars; a compose file that only adjusts the main service is ignored."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TaskLoadError(f"{where}: {path.name} is not valid YAML ({exc})") from None
    services = data.get("services") if isinstance(data, dict) else None
    names = sorted(services) if isinstance(services, dict) else []
    extra = [n for n in names if n != main] if main else names[1:]
    if extra:
        raise UnsupportedTaskError(
            f"{where}: {path.relative_to(path.parents[1] if main == 'main' else path.parent)} "
            f"declares sidecar service(s) {', '.join(extra)}; multi-container tasks are not "
            f"supported"
        )
    return f"{path.name} only configures the task's own container; ignored"


def load_harbor(root: Path) -> Task:
    task_id = root.name
    meta = _harbor_meta(root)
    verifier, agent, env, solution_cfg = _harbor_tables(meta, task_id)
    notes = []
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if (root / "environment" / name).is_file():
            notes.append(_check_compose(root / "environment" / name, task_id, "main"))
    if (root / "tests" / "test.bat").is_file() and not (root / "tests" / "test.sh").is_file():
        raise UnsupportedTaskError(f"{task_id}: Windows task (tests/test.bat) is not supported")
    _require(root, HARBOR_FILES)
    dockerfile = None
    if (root / "environment" / "Dockerfile").is_file():
        dockerfile = _read(root, "environment/Dockerfile")
    elif not env.get("docker_image"):
        raise TaskLoadError(
            f"{task_id}: missing file(s): environment/Dockerfile (and task.toml sets no "
            f"[environment].docker_image)"
        )
    limits = _harbor_limits(verifier, agent, env, task_id)
    agent_user, verifier_user, workdir = _harbor_users(dockerfile, verifier, agent, env, task_id)
    solution = root / "solution" / "solve.sh"
    metadata = meta.get("metadata", {}) if isinstance(meta.get("metadata"), dict) else {}
    return Task(
        task_id=task_id,
        path=root,
        layout="harbor",
        instruction=_read(root, "instruction.md"),
        recipe=ImageRecipe(
            dockerfile=dockerfile,
            context_dir=root / "environment" if dockerfile is not None else None,
            docker_image=env.get("docker_image") if dockerfile is None else None,
        ),
        limits=limits,
        tests_dir=root / "tests",
        solution=solution if solution.is_file() else None,
        category=metadata.get("category"),
        difficulty=metadata.get("difficulty"),
        agent_user=agent_user,
        workdir=workdir,
        home_tmpfs=False,
        home=None,
        env=_resolve_env(env.get("env"), task_id, "[environment.env]"),
        verifier_env=_resolve_env(verifier.get("env"), task_id, "[verifier.env]"),
        solution_env=_resolve_env(solution_cfg.get("env"), task_id, "[solution.env]"),
        verifier_user=verifier_user,
        allow_internet=_harbor_internet(verifier, env),
        test_script=root / "tests" / "test.sh",
        solution_dir=root / "solution" if solution.is_file() else None,
        notes=[n for n in notes if n],
    )


def _harbor_meta(root: Path) -> dict:
    """task.toml (empty without one); a multi-step task is refused."""
    meta = {}
    if (root / "task.toml").is_file():
        try:
            meta = tomllib.loads(_read(root, "task.toml"))
        except tomllib.TOMLDecodeError as exc:
            raise TaskLoadError(f"{root.name}: task.toml is not valid TOML ({exc})") from None
    steps = meta.get("steps")
    if steps or (root / "steps").is_dir():
        count = len(steps) if isinstance(steps, list) else len(list((root / "steps").iterdir()))
        raise UnsupportedTaskError(
            f"{root.name}: multi-step task ([[steps]], {count} step(s)) is not supported; "
            f"each step would need its own episode on one shared container"
        )
    return meta


def _harbor_tables(meta: dict, task_id: str) -> tuple[dict, dict, dict, dict]:
    """task.toml's [verifier], [agent], [environment] and [solution] tables."""
    verifier = meta.get("verifier", {}) or {}
    agent = meta.get("agent", {}) or {}
    env = meta.get("environment", {}) or {}
    solution_cfg = meta.get("solution", {}) or {}
    if not all(isinstance(t, dict) for t in (verifier, agent, env, solution_cfg)):
        raise TaskLoadError(f"{task_id}: task.toml [verifier]/[agent]/[environment] must be tables")
    if verifier.get("environment_mode") == "separate" or isinstance(
        verifier.get("environment"), dict
    ):
        raise UnsupportedTaskError(
            f"{task_id}: separate-verifier mode ([verifier] environment_mode = 'separate') "
            f"is not supported; the verifier runs in the agent's container"
        )
    return verifier, agent, env, solution_cfg


def _harbor_limits(verifier: dict, agent: dict, env: dict, task_id: str) -> TaskLimits:
    limits = TaskLimits()
    try:
        limits.verifier_timeout_s = float(verifier.get("timeout_sec", limits.verifier_timeout_s))
        limits.agent_timeout_s = float(agent.get("timeout_sec") or limits.agent_timeout_s)
        limits.build_timeout_s = float(env.get("build_timeout_sec", limits.build_timeout_s))
        limits.cpus = float(env.get("cpus", limits.cpus))
    except (TypeError, ValueError, AttributeError) as exc:
        raise TaskLoadError(f"{task_id}: bad value in task.toml: {exc}") from None
    if "memory_mb" in env or "memory" in env:
        limits.memory_mb = _size_mb(env.get("memory_mb", env.get("memory")), "memory", task_id)
    if "storage_mb" in env or "storage" in env:
        limits.storage_mb = _size_mb(env.get("storage_mb", env.get("storage")), "storage", task_id)
    return limits


def _harbor_users(
    dockerfile: str | None, verifier: dict, agent: dict, env: dict, task_id: str
) -> tuple[str, str, str]:
    """(agent's user, verifier's user, working directory): task.toml's, else the image's."""
    image_user, image_workdir = dockerfile_user_and_workdir(dockerfile or "")
    default_user = image_user or "root"
    agent_user = str(agent["user"]) if agent.get("user") not in (None, "") else default_user
    verifier_user = (
        str(verifier["user"]) if verifier.get("user") not in (None, "") else default_user
    )
    workdir = str(env.get("workdir") or image_workdir or "/")
    for name, value in (("user", agent_user), ("workdir", workdir)):
        if "$" in value:
            raise UnsupportedTaskError(
                f"{task_id}: the agent's {name} {value!r} depends on a build variable"
            )
    return agent_user, verifier_user, workdir


def _harbor_internet(verifier: dict, env: dict) -> bool:
    """Whether the verifier may have the network (the agent never has it)."""
    allow = env.get("allow_internet", True)
    if env.get("network_mode") == "no-network":
        allow = False
    if verifier.get("network_mode") in ("public", "no-network", "allowlist"):
        allow = verifier["network_mode"] != "no-network"
    return bool(allow)


def load_terminal_bench(root: Path) -> Task:
    """Terminal-Bench 1: task.yaml, Dockerfile (context: the task folder), run-tests.sh, tests/."""
    task_id = root.name
    try:
        meta = yaml.safe_load(_read(root, "task.yaml")) if (root / "task.yaml").is_file() else None
    except yaml.YAMLError as exc:
        raise TaskLoadError(f"{task_id}: task.yaml is not valid YAML ({exc})") from None
    if not isinstance(meta, dict):
        raise TaskLoadError(f"{task_id}: task.yaml must hold a mapping")
    notes = []
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if (root / name).is_file():
            notes.append(_check_compose(root / name, task_id, ""))
    _require(root, TBENCH_FILES)
    instruction = meta.get("instruction")
    if not instruction and isinstance(meta.get("descriptions"), list):
        first = meta["descriptions"][0] if meta["descriptions"] else {}
        instruction = first.get("description") if isinstance(first, dict) else None
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskLoadError(f"{task_id}: task.yaml has no 'instruction' string")
    limits = TaskLimits()
    try:
        limits.agent_timeout_s = float(meta.get("max_agent_timeout_sec", limits.agent_timeout_s))
        limits.verifier_timeout_s = float(
            meta.get("max_test_timeout_sec", limits.verifier_timeout_s)
        )
    except (TypeError, ValueError) as exc:
        raise TaskLoadError(f"{task_id}: bad value in task.yaml: {exc}") from None
    dockerfile = _read(root, "Dockerfile")
    image_user, image_workdir = dockerfile_user_and_workdir(dockerfile)
    solution = root / "solution.sh"
    if not solution.is_file() and (root / "solution.yaml").is_file():
        notes.append("solution.yaml (a command list with timeouts) is not run as an oracle")
    run_tests = root / "run-tests.sh"
    return Task(
        task_id=task_id,
        path=root,
        layout="terminal-bench",
        instruction=instruction,
        recipe=ImageRecipe(dockerfile=dockerfile, context_dir=root),
        limits=limits,
        tests_dir=root / "tests",
        solution=solution if solution.is_file() else None,
        category=meta.get("category"),
        difficulty=meta.get("difficulty"),
        agent_user=image_user or "root",
        workdir=image_workdir or "/",
        home_tmpfs=False,
        home=None,
        verifier_user=image_user or "root",
        allow_internet=True,
        test_script=run_tests if run_tests.is_file() else None,
        notes=[n for n in notes if n],
    )
