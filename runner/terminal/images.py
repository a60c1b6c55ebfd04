"""Images: the offline base image, task images cached by recipe hash, FROM fallback.

The base image is built by ``scripts/setup_docker.sh`` (debootstrap + docker import) where
no registry answers. A task image's tag is derived from the hash of its recipe and of the
image it is built on, so an unchanged task is never rebuilt and a rebuilt base invalidates
every task image built on it.
"""

from __future__ import annotations

import base64
import fnmatch
import io
import json
import logging
import os
import re
import tarfile
import threading
import time
from dataclasses import dataclass, field

import docker
import docker.errors

from runner.terminal.apptainer import drop_provided_installs
from runner.terminal.errors import ImageBuildError
from runner.terminal.task import Task

log = logging.getLogger(__name__)

BASE_IMAGE = "es-runner/terminal-base:bookworm"
TASK_REPO = "es-runner/task"
# Installed by scripts/setup_docker.sh (keep in sync with BASE_PACKAGES there), plus the
# Ubuntu names upstream %post sections use for the same things.
BASE_APT_PACKAGES = frozenset(
    [
        "bash",
        "coreutils",
        "findutils",
        "grep",
        "sed",
        "gawk",
        "tar",
        "gzip",
        "bzip2",
        "xz-utils",
        "zip",
        "unzip",
        "procps",
        "psmisc",
        "util-linux",
        "diffutils",
        "file",
        "less",
        "jq",
        "bc",
        "python3",
        "python3-pytest",
        "ca-certificates",
        "passwd",
        "python3-minimal",
        "python-is-python3",
        "mawk",
        "debianutils",
        "base-files",
        "dash",
    ]
)
BASE_PIP_PACKAGES = frozenset({"pytest", "pluggy", "iniconfig", "packaging"})

# Appended to every native task build: the agent user exists, owns its home, and a copy
# of the home is kept so the sandbox can seed a size-limited tmpfs from it.
_NATIVE_EPILOGUE = (
    "id user >/dev/null 2>&1 || useradd -m -d /home/user -s /bin/bash user; "
    "mkdir -p /home/user /.es && chown -R user:user /home/user && "
    "rm -rf /.es/home-seed && cp -a /home/user /.es/home-seed"
)


@dataclass
class ImageConfig:
    """Where images come from. ``from_map`` maps FROM patterns (fnmatch) to local images."""

    base_image: str = field(
        default_factory=lambda: os.environ.get("ES_TERMINAL_BASE_IMAGE", BASE_IMAGE)
    )
    from_map: dict[str, str] = field(default_factory=lambda: _map_from_env())
    try_pull: bool = field(default_factory=lambda: os.environ.get("ES_TERMINAL_NO_PULL") != "1")


def _map_from_env() -> dict[str, str]:
    raw = os.environ.get("ES_TERMINAL_IMAGE_MAP")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ImageBuildError(f"ES_TERMINAL_IMAGE_MAP is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ImageBuildError("ES_TERMINAL_IMAGE_MAP must be a JSON object {pattern: image}")
    return {str(k): str(v) for k, v in value.items()}


@dataclass
class BuiltImage:
    tag: str
    built: bool  # False when it came from the cache
    seconds: float
    from_image: str
    fell_back: bool = False
    notes: list[str] = field(default_factory=list)


class ImageBuilder:
    """Builds task images; safe to share between threads (one build per recipe at a time)."""

    def __init__(self, client: docker.DockerClient, config: ImageConfig | None = None) -> None:
        self.client = client
        self.config = config or ImageConfig()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._resolved: dict[str, tuple[str, bool]] = {}
        self._resolve_lock = threading.Lock()

    # --- FROM resolution --------------------------------------------------------------
    def base_image_id(self) -> str:
        try:
            return self.client.images.get(self.config.base_image).id
        except docker.errors.ImageNotFound:
            raise ImageBuildError(
                f"base image {self.config.base_image} not found; build it with "
                f"'bash scripts/setup_docker.sh' (as root)"
            ) from None

    def resolve_from(self, ref: str) -> tuple[str, bool]:
        """Return (image to build on, whether it is a fallback to the local base)."""
        with self._resolve_lock:  # one pull attempt and one warning per reference
            return self._resolve_locked(ref)

    def _resolve_locked(self, ref: str) -> tuple[str, bool]:
        if ref in self._resolved:
            return self._resolved[ref]
        for pattern, target in self.config.from_map.items():
            if fnmatch.fnmatchcase(ref, pattern):
                result = (target, target == self.config.base_image)
                break
        else:
            result = self._local_or_pull(ref)
        self._resolved[ref] = result
        return result

    def _local_or_pull(self, ref: str) -> tuple[str, bool]:
        try:
            self.client.images.get(ref)
            return ref, False
        except docker.errors.ImageNotFound:
            pass
        if self.config.try_pull:
            try:
                self.client.images.pull(ref)
                return ref, False
            except docker.errors.APIError as exc:
                reason = str(exc.explanation or exc).splitlines()[0][:160]
            else:  # pragma: no cover - pull returned without error
                reason = ""
        else:
            reason = "pulling is disabled (ES_TERMINAL_NO_PULL=1)"
        log.warning(
            "FROM %s is not available (%s); building on the local base image %s instead",
            ref,
            reason,
            self.config.base_image,
        )
        return self.config.base_image, True

    # --- Dockerfile generation ------------------------------------------------------
    def dockerfile_for(self, task: Task) -> tuple[str, str, bool, list[str]]:
        """Return (Dockerfile text, FROM used, fell back?, notes)."""
        recipe = task.recipe
        if recipe.definition is not None:
            d = recipe.definition
            from_image, fell_back = self.resolve_from(d.from_image)
            on_base = from_image == self.config.base_image
            post, notes = d.post, []
            if on_base:
                post, notes = drop_provided_installs(
                    post, BASE_APT_PACKAGES, BASE_PIP_PACKAGES, task.agent_user
                )
            lines = [f"FROM {from_image}"]
            if post.strip():
                # One RUN, script passed base64-encoded: here-documents survive intact and
                # /bin/sh -e matches Apptainer's %post semantics.
                b64 = base64.b64encode(post.encode()).decode()
                lines.append(
                    f"RUN echo {b64} | base64 -d > /tmp/.es-post.sh && "
                    f"/bin/sh -e /tmp/.es-post.sh && rm -f /tmp/.es-post.sh"
                )
            env = d.environment
            if env:
                b64 = base64.b64encode(env.encode()).decode()
                lines.append(f"RUN mkdir -p /.es && echo {b64} | base64 -d > /.es/environment")
                for key, value in _simple_exports(env):
                    lines.append(f"ENV {key}={json.dumps(value)}")
            lines.append(f"RUN {_NATIVE_EPILOGUE}")
            return "\n".join(lines) + "\n", from_image, fell_back, notes
        assert recipe.dockerfile is not None
        return self._rewrite_froms(recipe.dockerfile)

    def _rewrite_froms(self, dockerfile: str) -> tuple[str, str, bool, list[str]]:
        stages: set[str] = set()
        first_from, any_fallback = "", False
        out = []
        for line in dockerfile.splitlines():
            match = re.match(r"^(\s*FROM\s+)(?:--platform=\S+\s+)?(\S+)(.*)$", line, re.IGNORECASE)
            if match:
                ref, rest = match.group(2), match.group(3)
                alias = re.search(r"\bAS\s+(\S+)", rest, re.IGNORECASE)
                if ref.lower() not in stages:
                    new_ref, fell_back = self.resolve_from(ref)
                    any_fallback |= fell_back
                    line = f"{match.group(1)}{new_ref}{rest}"
                    first_from = first_from or new_ref
                if alias:
                    stages.add(alias.group(1).lower())
            out.append(line)
        return "\n".join(out) + "\n", first_from, any_fallback, []

    # --- building ----------------------------------------------------------------------
    def ensure(self, task: Task) -> BuiltImage:
        """Return the task's image, building it unless an identical recipe was built."""
        start = time.perf_counter()
        dockerfile, from_image, fell_back, notes = self.dockerfile_for(task)
        try:
            from_id = self.client.images.get(from_image).id
        except docker.errors.ImageNotFound:
            if from_image == self.config.base_image:
                self.base_image_id()  # raises the setup hint
            raise ImageBuildError(f"{task.task_id}: image {from_image} not found") from None
        digest = _digest(task.recipe.digest(), dockerfile, from_id)
        tag = f"{TASK_REPO}:{digest[:24]}"
        with self._guard:
            lock = self._locks.setdefault(tag, threading.Lock())
        with lock:
            try:
                self.client.images.get(tag)
                return BuiltImage(
                    tag, False, time.perf_counter() - start, from_image, fell_back, notes
                )
            except docker.errors.ImageNotFound:
                pass
            self._build(task, dockerfile, tag, digest)
        return BuiltImage(tag, True, time.perf_counter() - start, from_image, fell_back, notes)

    def _build(self, task: Task, dockerfile: str, tag: str, digest: str) -> None:
        context = _context_tar(task, dockerfile)
        logs: list[str] = []
        try:
            stream = self.client.api.build(
                fileobj=context,
                custom_context=True,
                tag=tag,
                rm=True,
                forcerm=True,
                decode=True,
                timeout=int(task.limits.build_timeout_s) + 30,
                labels={"es-runner.recipe": digest, "es-runner.task": task.task_id},
            )
            for chunk in stream:
                if "stream" in chunk:
                    logs.append(chunk["stream"])
                if "error" in chunk:
                    tail = "".join(logs).strip().splitlines()[-8:]
                    detail = " | ".join(line.strip() for line in tail if line.strip())
                    raise ImageBuildError(
                        f"{task.task_id}: image build failed: {chunk['error'].strip()}"
                        + (f" (last output: {detail})" if detail else "")
                    )
        except docker.errors.APIError as exc:
            raise ImageBuildError(
                f"{task.task_id}: image build failed: {exc.explanation or exc}"
            ) from None
        except ImageBuildError:
            raise
        except Exception as exc:  # e.g. a read timeout from the engine
            raise ImageBuildError(f"{task.task_id}: image build failed: {exc}") from None


def _digest(*parts: str) -> str:
    import hashlib

    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _simple_exports(env: str) -> list[tuple[str, str]]:
    """``export K=V`` lines with a literal value also become ENV, so plain execs see them."""
    out = []
    for line in env.splitlines():
        match = re.match(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=(\S*)\s*$", line)
        if match and not re.search(r"[$`]", match.group(2)):
            out.append((match.group(1), match.group(2).strip("'\"")))
    return out


def _context_tar(task: Task, dockerfile: str) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        ctx = task.recipe.context_dir
        if ctx is not None:
            for path in sorted(ctx.rglob("*")):
                rel = str(path.relative_to(ctx))
                if rel != "Dockerfile":
                    tar.add(path, arcname=rel, recursive=False)
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf
