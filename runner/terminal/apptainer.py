"""Parse an Apptainer ``container.def`` and turn it into Dockerfile steps.

Upstream Endless Terminals tasks set up their files in ``%post`` (run by ``/bin/sh -e`` as
root on top of ``From: ubuntu:22.04``) and export variables in ``%environment``. Both map
onto Docker directly: the ``%post`` text becomes one ``RUN`` of the same script under
``/bin/sh -e`` (so here-documents and ``echo`` behave exactly as under dash), and
``%environment`` is sourced by every shell the sandbox starts. Sections whose meaning
depends on the host (``%setup``, ``%files``) or bootstrap agents other than docker are
refused with the line that caused it.

Upstream's generator writes ``Bootstrap: localimage`` / ``From: ./ubuntu_22.04.sif`` (a SIF it
pulled from ``docker://ubuntu:22.04``); such a path is read back as the Docker reference it
names (``ubuntu_22.04.sif`` -> ``ubuntu:22.04``) with one warning. Repeated ``%post`` /
``%environment`` sections are concatenated; ``%test`` is kept and run at the end of the build,
as ``apptainer build`` does.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from runner.terminal.errors import DefinitionError

log = logging.getLogger(__name__)

# Sections that only matter for Apptainer's own run/help commands: safe to ignore.
_IGNORED_SECTIONS = {"runscript", "startscript", "help", "labels", "arguments"}
_SUPPORTED_BOOTSTRAPS = {"docker", "library", "docker-daemon", "localimage"}
_SIF_WARNED: set[str] = set()
_SIF_LOCK = threading.Lock()
_HOST_ONLY_VARS = re.compile(r"\$\{?(APPTAINER|SINGULARITY)_(ROOTFS|ENVIRONMENT)\b")
_HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


@dataclass
class Definition:
    """The parts of a container.def the sandbox uses; line numbers are 1-based in the file."""

    bootstrap: str
    from_image: str
    post: str = ""
    post_first_line: int = 0
    environment: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    test: str = ""  # %test: run at the end of the build, as `apptainer build` does
    source_from: str = ""  # the From: header as written (a .sif path for localimage)
    notes: list[str] = field(default_factory=list)


def sif_to_reference(path: str) -> str:
    """The Docker reference a local SIF stands for: ``./ubuntu_22.04.sif`` -> ``ubuntu:22.04``.

    Upstream pulls its base with ``apptainer pull ubuntu_22.04.sif docker://ubuntu:22.04``;
    the file name keeps the reference with ``:`` written as ``_`` (the last ``_`` before a
    version-like tag). A name without such a tag means ``:latest``.
    """
    stem = PurePosixPath(path.strip().strip("'\"")).name
    for suffix in (".sif", ".simg", ".img"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    name, sep, tag = stem.rpartition("_")
    if sep and name and re.fullmatch(r"[0-9][A-Za-z0-9.-]*|latest|[a-z]+[0-9]*", tag):
        return f"{name.lower()}:{tag}"
    return f"{stem.lower()}:latest"


def parse_definition(text: str, where: str) -> Definition:
    """Parse ``text``; ``where`` names the task in error messages."""
    if not text.strip():
        raise DefinitionError(f"{where}: container.def is empty")
    header, sections = _split_sections(text, where)
    bootstrap, from_image, source_from, notes = _base_image(header, where)
    post_lines, post_first = sections.get("post", ([], 0))
    env_lines, _ = sections.get("environment", ([], 0))
    _check_post(post_lines, post_first, where)
    test_lines, test_first = sections.get("test", ([], 0))
    _check_post(test_lines, test_first, where)
    labels = {}
    for line in sections.get("labels", ([], 0))[0]:
        parts = line.strip().split(None, 1)
        if len(parts) == 2:
            labels[parts[0]] = parts[1]
    environment = [line.strip() for line in env_lines if line.strip()]
    return Definition(
        bootstrap=bootstrap,
        from_image=from_image,
        post=_dedent_outside_heredocs(post_lines),
        post_first_line=post_first,
        environment="\n".join(environment) + "\n" if environment else "",
        labels=labels,
        test=_dedent_outside_heredocs(test_lines),
        source_from=source_from,
        notes=notes,
    )


def _split_sections(
    text: str, where: str
) -> tuple[dict[str, tuple[str, int]], dict[str, tuple[list[str], int]]]:
    """The header (key -> (value, line)) and the sections (name -> (lines, first line))."""
    header: dict[str, tuple[str, int]] = {}
    sections: dict[str, tuple[list[str], int]] = {}
    current: str | None = None
    open_doc: str | None = None  # inside a here-document of %post, '%' lines are data
    for lineno, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if open_doc is not None:
            sections[current][0].append(raw)  # type: ignore[index]
            if stripped == open_doc:
                open_doc = None
            continue
        match = re.match(r"^%([A-Za-z]+)\b(.*)$", stripped)
        if match and not raw.startswith((" ", "\t")) or (match and current is None):
            name = match.group(1).lower()
            if name in ("setup", "files"):
                raise DefinitionError(
                    f"{where}: container.def line {lineno}: section %{name} runs on the "
                    f"host and cannot be translated to a Dockerfile: {stripped!r}"
                )
            if name not in ("post", "environment", "test") and name not in _IGNORED_SECTIONS:
                raise DefinitionError(
                    f"{where}: container.def line {lineno}: unknown section %{name}"
                )
            current = name
            # A repeated section continues the first one (upstream files repeat %runscript).
            sections.setdefault(name, ([], lineno + 1))
            continue
        if current is None:
            if not stripped or stripped.startswith("#"):
                continue
            key, sep, value = stripped.partition(":")
            if not sep:
                raise DefinitionError(
                    f"{where}: container.def line {lineno}: expected 'Key: value' header, "
                    f"got {stripped!r}"
                )
            header[key.strip().lower()] = (value.strip(), lineno)
            continue
        sections[current][0].append(raw)
        if current in ("post", "test"):
            docs = list(_HEREDOC.finditer(raw))
            if docs:
                open_doc = docs[-1].group(3)
    return header, sections


def _base_image(header: dict[str, tuple[str, int]], where: str) -> tuple[str, str, str, list[str]]:
    """(bootstrap, the Docker reference to build on, From: as written, notes) of a header."""
    bootstrap, bline = header.get("bootstrap", ("", 0))
    if not bootstrap:
        raise DefinitionError(f"{where}: container.def has no 'Bootstrap:' header")
    if bootstrap.lower() not in _SUPPORTED_BOOTSTRAPS:
        raise DefinitionError(
            f"{where}: container.def line {bline}: Bootstrap {bootstrap!r} is not supported "
            f"(allowed: {', '.join(sorted(_SUPPORTED_BOOTSTRAPS))})"
        )
    from_image = header.get("from", ("", 0))[0]
    if not from_image:
        raise DefinitionError(f"{where}: container.def has no 'From:' header")
    source_from, notes = from_image, []
    if bootstrap.lower() == "localimage":
        from_image = sif_to_reference(source_from)
        note = (
            f"Bootstrap: localimage From: {source_from} is read as FROM {from_image} "
            f"(the image upstream's SIF was pulled from)"
        )
        notes.append(note)
        with _SIF_LOCK:
            if source_from not in _SIF_WARNED:
                _SIF_WARNED.add(source_from)
                log.warning("%s: %s", where, note)
    elif bootstrap.lower() == "library":
        from_image = re.sub(r"^library://", "", from_image)
    elif bootstrap.lower() == "docker-daemon":
        from_image = re.sub(r"^docker-daemon:", "", from_image)
    return bootstrap.lower(), from_image, source_from, notes


def _check_post(lines: list[str], first_line: int, where: str) -> None:
    """Refuse what cannot work inside ``docker build``; name the offending line."""
    open_doc: tuple[str, bool, int] | None = None
    for offset, line in enumerate(lines):
        lineno = first_line + offset
        if open_doc is not None:
            word, strip_tabs, _ = open_doc
            candidate = line.lstrip("\t") if strip_tabs else line
            # Upstream files indent everything; a terminator indented like the body counts.
            if candidate.strip() == word:
                open_doc = None
            continue
        if _HOST_ONLY_VARS.search(line):
            raise DefinitionError(
                f"{where}: container.def line {lineno}: refers to the host-side build "
                f"variables of Apptainer, which have no Docker equivalent: {line.strip()!r}"
            )
        for match in _HEREDOC.finditer(line):
            open_doc = (match.group(3), match.group(1) == "-", lineno)
    if open_doc is not None:
        raise DefinitionError(
            f"{where}: container.def line {open_doc[2]}: here-document '{open_doc[0]}' "
            f"is never terminated"
        )


def _dedent_outside_heredocs(lines: list[str]) -> str:
    """Unindent here-document terminators; keep every other line as written.

    An indented terminator does not end a here-document under ``/bin/sh``; some files
    indent them anyway, so a terminator that matches once stripped is written unindented.
    Shell lines keep their indentation, which can be data: upstream task 9cc1e5be writes a
    log with a multi-line ``echo "..."`` whose lines start with " - ", and its recorded
    successes need those spaces. Here-document bodies are kept byte-exact.
    """
    out: list[str] = []
    open_doc: tuple[str, bool] | None = None
    for line in lines:
        if open_doc is not None:
            word, strip_tabs = open_doc
            candidate = line.lstrip("\t") if strip_tabs else line
            if candidate.strip() == word:
                out.append(word)
                open_doc = None
            else:
                out.append(line)
            continue
        # Shell lines keep their indentation: it can be data (a multi-line quoted string).
        out.append(line.rstrip() if line.strip() else "")
        for match in _HEREDOC.finditer(line):
            open_doc = (match.group(3), match.group(1) == "-")
    return "\n".join(out).strip("\n") + "\n" if any(s.strip() for s in out) else ""
