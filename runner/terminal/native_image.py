"""Native (Endless Terminals, Apptainer) tasks as Dockerfiles: the base image's packages,
the %post script on it, upstream's unprivileged build (files %post created handed to uid
1000), %environment and %test."""

from __future__ import annotations

import base64
import contextlib
import json
import re

from runner.terminal.installs import plan_installs
from runner.terminal.task import Task

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

# The account upstream's agent is: the user who ran `apptainer`, uid 1000 on upstream's
# machines. The base image's own `user` (uid 1000) is removed before %post so that the
# first account %post creates gets uid 1000, exactly as on ubuntu:22.04.
NATIVE_UID = 1000
_NATIVE_PROLOGUE_ON_BASE = (
    'if [ "$(id -u user 2>/dev/null)" = 1000 ]; then userdel -r user >/dev/null 2>&1 '
    "|| userdel user; fi; "
)
_NATIVE_PROLOGUE = (
    "mkdir -p /.es && (find / -xdev -path /proc -prune -o -print > /.es/before 2>/dev/null || true)"
)
# Files %post created as root are handed to the agent: upstream builds the image without
# root (fakeroot), so everything %post writes belongs to the invoking user, uid 1000.
_HANDOVER_PY = r"""
import os, pwd
uid = %(uid)d
gid = pwd.getpwuid(uid).pw_gid
before = set(open("/.es/before", encoding="utf-8", errors="surrogateescape").read().split("\n"))
prune = {"/proc", "/sys", "/dev", "/usr", "/var/lib", "/var/cache", "/var/log/apt", "/.es",
         "/tmp", "/var/tmp", "/run", "/boot", "/etc/ssl", "/etc/alternatives"}
skip = {"/etc/" + n + s for n in ("passwd", "shadow", "group", "gshadow", "subuid", "subgid")
        for s in ("", "-")} | {"/etc/ld.so.cache"}
import fnmatch
keep = [ln for ln in open("/.es/keep-root").read().split("\n") if ln] if os.path.exists("/.es/keep-root") else []

def kept(path):
    return any(fnmatch.fnmatch(path, k) or path.startswith(k.rstrip("/") + "/") for k in keep)

count = 0
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in prune
               and not os.path.ismount(os.path.join(root, d))]
    for name in dirs + files:
        path = os.path.join(root, name)
        if path in before or path in skip or kept(path):
            continue
        try:
            st = os.lstat(path)
            if st.st_uid == 0:
                os.lchown(path, uid, gid)
                count += 1
        except OSError:
            pass
msg = "handed %%d file(s) that %%%%post created as root to uid %%d" %% (count, uid)
print("[es-runner] " + msg)
with open("/.es/build-notes", "a") as f:
    f.write(msg + "\n")
"""
_NATIVE_EPILOGUE = (
    "if ! getent passwd 1000 >/dev/null; then "
    "if id user >/dev/null 2>&1; then name=agent; else name=user; fi; "
    "useradd -u 1000 -M -d /home/user -s /bin/bash $name 2>/dev/null "
    "|| useradd -u 1000 -M -d /home/user $name; fi; "
    "mkdir -p /home/user /.es && "
    "if command -v python3 >/dev/null && [ -f /.es/handover.py ]; then python3 /.es/handover.py; fi; "
    "rm -f /.es/before /.es/handover.py /.es/keep-root; "
    "getent passwd 1000 | cut -d: -f1 > /.es/agent-user; "
    "rm -rf /.es/home-seed && cp -a /home/user /.es/home-seed"
)


def native_dockerfile(
    task: Task, from_image: str, on_base: bool, handover: bool
) -> tuple[str, list[str]]:
    """The Dockerfile of a native (Apptainer) task: %post on ``from_image`` (on the base
    image, installs it already has are dropped), %environment, the hand-over of what
    %post created as root to uid 1000 (``handover``), then %test."""
    d = task.recipe.definition
    assert d is not None
    notes = list(d.notes)
    post = d.post
    if on_base:
        plan = plan_installs(
            post,
            first_line=d.post_first_line,
            provided_apt=BASE_APT_PACKAGES,
            provided_pip=BASE_PIP_PACKAGES,
            task_text=_task_text(task),
        )
        post = plan.script
        notes += [f"%post {n}" for n in plan.notes]
        notes += [f"%post: will try {t}" for t in plan.tried]
    lines = [f"FROM {from_image}"]
    prologue = (_NATIVE_PROLOGUE_ON_BASE if on_base else "") + _NATIVE_PROLOGUE
    lines.append(f"RUN {prologue}")
    if post.strip():
        # One RUN, script passed base64-encoded: here-documents survive intact and
        # /bin/sh -e matches Apptainer's %post semantics.
        lines.append(_run_script(post, "/tmp/.es-post.sh", "/bin/sh -e"))
    env = d.environment
    if env:
        b64 = base64.b64encode(env.encode()).decode()
        lines.append(f"RUN mkdir -p /.es && echo {b64} | base64 -d > /.es/environment")
        for key, value in _simple_exports(env):
            lines.append(f"ENV {key}={json.dumps(value)}")
    if handover:
        py = _HANDOVER_PY % {"uid": NATIVE_UID}
        b64 = base64.b64encode(py.encode()).decode()
        keep = "".join(p + "\n" for p in explicit_root_paths(d.post))
        keep_b64 = base64.b64encode(keep.encode()).decode()
        lines.append(
            f"RUN echo {b64} | base64 -d > /.es/handover.py && "
            f"echo {keep_b64} | base64 -d > /.es/keep-root"
        )
    lines.append(f"RUN {_NATIVE_EPILOGUE}")
    if d.test.strip():
        # `apptainer build` runs %test last (with /bin/sh) and fails the build on error.
        lines.append(_run_script(d.test, "/tmp/.es-test.sh", "/bin/sh", tag="%test"))
    return "\n".join(lines) + "\n", notes


def explicit_root_paths(post: str) -> list[str]:
    """Paths %post explicitly gives to root (`chown [-R] root[:group] PATH...`): kept root's.

    Upstream ran its initial-state tests with --fakeroot, where such files read as root's;
    a task that says so (7ccae1fb: `chown root:root /var/log/syslog`) tests for it.
    """
    import shlex

    paths: list[str] = []
    for line in post.replace("\\\n", " ").splitlines():
        for part in re.split(r"&&|;|\|\|", line):
            try:
                tokens = shlex.split(part)
            except ValueError:
                continue
            if tokens[:1] == ["sudo"]:
                tokens = tokens[1:]
            if not tokens or tokens[0] != "chown":
                continue
            args = [t for t in tokens[1:] if not t.startswith("-")]
            if len(args) >= 2 and re.fullmatch(r"(root|0)([:.](root|0)?)?", args[0]):
                paths += [a for a in args[1:] if a.startswith("/") and "$" not in a]
    return paths


def _task_text(task: Task) -> str:
    """What a native task runs besides %post: evidence of which installed packages it uses."""
    d = task.recipe.definition
    parts = [task.initial_test or "", task.final_test or "", d.environment if d else ""]
    parts.append(d.test if d else "")
    if task.solution is not None and task.solution.is_file():
        with contextlib.suppress(OSError):
            parts.append(task.solution.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def _run_script(script: str, path: str, shell: str, tag: str = "") -> str:
    b64 = base64.b64encode(script.encode()).decode()
    run = f"{shell} {path}"
    if tag:  # name the section in the build log when it fails
        run = f'{run} || {{ echo "{tag} failed (exit $?)"; exit 1; }}'
    return f"RUN echo {b64} | base64 -d > {path} && {run} && rm -f {path}"


def _simple_exports(env: str) -> list[tuple[str, str]]:
    """``export K=V`` lines with a literal value also become ENV, so plain execs see them."""
    out = []
    for line in env.splitlines():
        match = re.match(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=(\S*)\s*$", line)
        if match and not re.search(r"[$`]", match.group(2)):
            out.append((match.group(1), match.group(2).strip("'\"")))
    return out
