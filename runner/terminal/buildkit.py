"""A docker CLI that drives the engine's BuildKit (for Dockerfiles the classic builder
refuses: RUN --mount, COPY --chmod), found once per process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading

_BUILDKIT: list[tuple[list[str], dict[str, str]] | None] = []
_BUILDKIT_LOCK = threading.Lock()


def buildkit_cli() -> tuple[list[str], dict[str, str]] | None:
    """A docker CLI that drives the engine's BuildKit: (build command, extra environment).

    ``docker buildx`` where the plugin is installed (Debian's docker-buildx package), else a
    CLI from before 23.0 (Debian bookworm's docker.io is 20.10), which builds with
    BuildKit itself when ``DOCKER_BUILDKIT=1``. None when there is neither.
    """
    with _BUILDKIT_LOCK:
        if _BUILDKIT:
            return _BUILDKIT[0]
        found = None
        exes = []
        for exe in (shutil.which("docker"), "/usr/bin/docker", "/usr/local/bin/docker"):
            if (
                exe
                and os.path.exists(exe)
                and os.path.realpath(exe) not in map(os.path.realpath, exes)
            ):
                exes.append(exe)
        for exe in exes:
            if _rc([exe, "buildx", "version"]) == 0:
                found = ([exe, "buildx", "build", "--load"], {})
                break
        if found is None:
            for exe in exes:
                try:
                    out = subprocess.run(
                        [exe, "--version"], capture_output=True, text=True, timeout=20
                    ).stdout
                except (OSError, subprocess.TimeoutExpired):
                    continue
                match = re.search(r"version (\d+)\.", out)
                if match and int(match.group(1)) < 23:
                    found = ([exe, "build"], {"DOCKER_BUILDKIT": "1"})
                    break
        _BUILDKIT.append(found)
        return found


def _rc(cmd: list[str]) -> int:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=20).returncode
    except (OSError, subprocess.TimeoutExpired):
        return -1
