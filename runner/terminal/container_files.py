"""The files of a sandboxed container: what goes in (a tar for the engine's put_archive)
and how much the agent wrote to its writable layer."""

from __future__ import annotations

import io
import os
import tarfile


def tar_archive(files: dict[str, bytes], mode: int = 0o644) -> bytes:
    """A tar of ``files`` (relative name -> bytes) as root-owned entries: folders 0755,
    ``*.sh`` 0755, the rest ``mode``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs: set[str] = set()
        for name, data in files.items():
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name.endswith(".sh") else mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def disk_usage(path: str, stop_above: int) -> int:
    """Bytes allocated under ``path`` (not following links), counted until past
    ``stop_above`` (an agent's million files need not all be seen to end its episode)."""
    total = 0
    stack = [path]
    while stack and total <= stop_above:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return total
