"""Images: the offline base image, task images cached by recipe hash, FROM fallback.

The base image is built by ``scripts/setup_docker.sh`` (debootstrap + docker import) where
no registry answers. A task image's tag is derived from the hash of its recipe and of the
image it is built on, so an unchanged task is never rebuilt and a rebuilt base invalidates
every task image built on it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import logging
import os
import re
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass, field

import docker
import docker.errors

from runner.terminal import dockerfile as dockerfile_mod
from runner.terminal import reaper
from runner.terminal.buildkit import buildkit_cli
from runner.terminal.errors import ImageBuildError
from runner.terminal.installs import FAIL_MARKER, NOTE_PREFIX
from runner.terminal.native_image import native_dockerfile
from runner.terminal.output import strip_ansi
from runner.terminal.task import Task

log = logging.getLogger(__name__)

BASE_IMAGE = "es-runner/terminal-base:bookworm"
TASK_REPO = "es-runner/task"


@dataclass
class ImageConfig:
    """Where images come from. ``from_map`` maps FROM patterns (fnmatch) to local images."""

    base_image: str = field(
        default_factory=lambda: os.environ.get("ES_TERMINAL_BASE_IMAGE", BASE_IMAGE)
    )
    from_map: dict[str, str] = field(default_factory=lambda: _map_from_env())
    try_pull: bool = field(default_factory=lambda: os.environ.get("ES_TERMINAL_NO_PULL") != "1")
    # Native tasks: hand what %post created as root to uid 1000 (upstream's unprivileged
    # builds); ES_TERMINAL_NATIVE_HANDOVER=0 keeps Docker's root-owned files instead.
    native_handover: bool = field(
        default_factory=lambda: os.environ.get("ES_TERMINAL_NATIVE_HANDOVER") != "0"
    )


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
    builder: str = "classic"  # classic | buildkit


_fallback_said = False
_fallback_lock = threading.Lock()


def say_fallback(ref: str, reason: str, base_image: str) -> None:
    """Log a FROM that falls back to the local base image: once per process (a run) in one
    short warning; each reference with the engine's error at info level (the run's log)."""
    global _fallback_said
    log.info("FROM %s is not available (%s); building on %s instead", ref, reason, base_image)
    with _fallback_lock:
        if _fallback_said:
            return
        _fallback_said = True
    log.warning(
        "FROM %s is not available; building on the local base image %s "
        "(likewise any other missing FROM; -v or the run's log says why)",
        ref,
        base_image,
    )


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
                reason = str(exc.explanation or exc)
            else:  # pragma: no cover - pull returned without error
                reason = ""
        else:
            reason = "pulling is disabled (ES_TERMINAL_NO_PULL=1)"
        say_fallback(ref, reason, self.config.base_image)
        return self.config.base_image, True

    # --- Dockerfile generation ------------------------------------------------------
    def dockerfile_for(self, task: Task) -> tuple[str, str, bool, list[str]]:
        """Return (Dockerfile text, FROM used, fell back?, notes)."""
        text, from_image, fell_back, notes, _ = self._plan(task)
        return text, from_image, fell_back, notes

    def _plan(self, task: Task) -> tuple[str, str, bool, list[str], str | None]:
        """(Dockerfile, FROM used, fell back?, notes, why BuildKit is needed or None)."""
        recipe = task.recipe
        if recipe.definition is not None:
            return (*self._native_dockerfile(task), None)
        if recipe.dockerfile is None and recipe.docker_image:
            new_ref, fell_back = self.resolve_from(recipe.docker_image)
            return f"FROM {new_ref}\n", new_ref, fell_back, [], None
        assert recipe.dockerfile is not None
        prepared = dockerfile_mod.prepare(recipe.dockerfile, task.task_id)
        text, first_from, fell_back, _ = self._rewrite_froms(prepared.text)
        return text, first_from, fell_back, prepared.notes, prepared.buildkit_reason

    def _native_dockerfile(self, task: Task) -> tuple[str, str, bool, list[str]]:
        d = task.recipe.definition
        assert d is not None
        from_image, fell_back = self.resolve_from(d.from_image)
        text, notes = native_dockerfile(
            task, from_image, from_image == self.config.base_image, self.config.native_handover
        )
        return text, from_image, fell_back, notes

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
        dockerfile, from_image, fell_back, notes, buildkit_reason = self._plan(task)
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
            kind = "buildkit" if buildkit_reason else "classic"
            try:
                image = self.client.images.get(tag)
                notes = notes + [n for n in _stored_notes(image) if n not in notes]
                return BuiltImage(
                    tag, False, time.perf_counter() - start, from_image, fell_back, notes, kind
                )
            except docker.errors.ImageNotFound:
                pass
            if buildkit_reason:
                log_notes = self._build_buildkit(task, dockerfile, tag, digest, buildkit_reason)
            else:
                log_notes = self._build(task, dockerfile, tag, digest)
        if task.recipe.definition is not None:  # what the build wrote down, besides its log
            with contextlib.suppress(docker.errors.APIError):
                log_notes += [
                    n for n in _stored_notes(self.client.images.get(tag)) if n not in log_notes
                ]
        fresh = [n for n in log_notes if n not in notes and f"%post {n}" not in notes]
        return BuiltImage(
            tag, True, time.perf_counter() - start, from_image, fell_back, notes + fresh, kind
        )

    def _build(self, task: Task, dockerfile: str, tag: str, digest: str) -> list[str]:
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
                labels={
                    "es-runner.recipe": digest,
                    "es-runner.task": task.task_id[:200],
                    "es-runner.native": "1" if task.recipe.definition is not None else "0",
                },
            )
            for chunk in stream:
                if "stream" in chunk:
                    logs.append(chunk["stream"])
                if "error" in chunk:
                    raise _build_error(task, chunk["error"].strip(), "".join(logs))
        except docker.errors.APIError as exc:
            raise ImageBuildError(
                f"{task.task_id}: image build failed: {exc.explanation or exc}"
            ) from None
        except ImageBuildError:
            raise
        except Exception as exc:  # e.g. a read timeout from the engine
            raise ImageBuildError(f"{task.task_id}: image build failed: {exc}") from None
        return _log_notes("".join(logs))

    def _build_buildkit(
        self, task: Task, dockerfile: str, tag: str, digest: str, reason: str
    ) -> list[str]:
        """Build with the engine's BuildKit through a docker CLI (the SDK cannot)."""
        cli = buildkit_cli()
        if cli is None:
            raise ImageBuildError(
                f"{task.task_id}: the Dockerfile needs BuildKit ({reason}) and no docker CLI "
                f"here can use it; install Debian's docker.io (or docker-buildx) with "
                f"'bash scripts/setup_docker.sh'"
            )
        cmd, env = cli
        args = [*cmd, "--progress=plain", "-t", tag, "--label", f"es-runner.recipe={digest}"]
        args += ["--label", f"es-runner.task={task.task_id[:200]}", "-"]
        try:
            proc = subprocess.run(
                args,
                input=_context_tar(task, dockerfile).getvalue(),
                capture_output=True,
                timeout=task.limits.build_timeout_s + 30,
                env={**os.environ, **env},
            )
        except subprocess.TimeoutExpired:
            raise ImageBuildError(
                f"{task.task_id}: image build (BuildKit) timed out after "
                f"{task.limits.build_timeout_s:g} s"
            ) from None
        out = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
        if proc.returncode != 0:
            lines = [ln for ln in out.splitlines() if ln.strip()]
            error = next(
                (ln for ln in reversed(lines) if re.search(r"error|failed", ln, re.I)),
                lines[-1] if lines else "unknown error",
            )
            raise _build_error(task, f"(BuildKit) {error.strip()}", out)
        return _log_notes(out)


def _build_error(task: Task, error: str, log_text: str) -> ImageBuildError:
    lines = [ln.strip() for ln in strip_ansi(log_text).splitlines() if ln.strip()]
    marker = next((ln for ln in lines if FAIL_MARKER in ln), None)
    if marker is not None:
        detail = marker.split(FAIL_MARKER, 1)[1].strip()
        return ImageBuildError(
            f"{task.task_id}: image build failed: container.def {detail}, which cannot be "
            f"installed here"
        )
    failed_test = next((ln for ln in lines if ln.startswith("%test failed")), None)
    if failed_test is not None:
        return ImageBuildError(f"{task.task_id}: image build failed: container.def {failed_test}")
    # The engine quotes the whole failing command (for %post, a long base64 script): say
    # only its exit code, and keep the task's own last output lines, each cut short.
    code = re.search(r"returned a non-zero code: (\d+)", error)
    if code is not None:
        error = f"a build step exited with code {code.group(1)}"
    tail = [
        ln if len(ln) <= 200 else ln[:200] + "..."
        for ln in lines
        if not ln.startswith(("#", "Step ", "---> ", "Removing intermediate")) or "ERROR" in ln
    ][-8:]
    detail = " | ".join(tail)
    return ImageBuildError(
        f"{task.task_id}: image build failed: {error}"
        + (f" (last output: {detail})" if detail else "")
    )


def _log_notes(log_text: str) -> list[str]:
    notes = []
    for line in log_text.splitlines():
        at = line.find(NOTE_PREFIX)
        if at >= 0 and "echo" not in line[:at]:
            note = line[at + len(NOTE_PREFIX) :].strip()
            if note and note not in notes:
                notes.append(note)
    return notes


_NOTES_CACHE: dict[str, list[str]] = {}


def _stored_notes(image: docker.models.images.Image) -> list[str]:
    """Notes a cached image's build wrote to /.es/build-notes (read once per process).

    Reading a file of an image takes a container (created, never started); it carries the
    owner label and is registered, so a SIGKILL between create and remove leaves it to the
    next start-up's reaper rather than behind forever.
    """
    if image.id in _NOTES_CACHE:
        return _NOTES_CACHE[image.id]
    notes: list[str] = []
    if image.labels.get("es-runner.native") == "1":
        try:
            container = image.client.containers.create(
                image.id, ["true"], labels=reaper.owned_labels(), network_disabled=True
            )
            reaper.register(container)
            try:
                stream, _ = container.get_archive("/.es/build-notes")
                data = b"".join(stream)
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    member = tar.next()
                    f = tar.extractfile(member) if member else None
                    if f is not None:
                        notes = [ln for ln in f.read().decode().splitlines() if ln.strip()]
            finally:
                reaper.force_remove(image.client.api, container.id)
                reaper.unregister(container.id)
        except docker.errors.APIError:
            pass
    _NOTES_CACHE[image.id] = notes
    return notes


def _digest(*parts: str) -> str:
    import hashlib

    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _context_tar(task: Task, dockerfile: str) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        ctx = task.recipe.context_dir
        if ctx is not None:
            for path in sorted(ctx.rglob("*")):
                rel = str(path.relative_to(ctx))
                if rel != "Dockerfile" and rel.split("/")[0] != ".git":
                    tar.add(path, arcname=rel, recursive=False)
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf
