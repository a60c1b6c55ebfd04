"""What machine a run's process ran on, recorded with each segment in ``meta.json``: a run
measures time, and the same config on another machine (or the same one on another day)
runs at another speed, so timings are only compared between runs on one machine."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's name (Linux's ``model name``), or what ``platform`` knows."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """``(busy, total)`` clock ticks of all the machine's CPUs since boot (Linux's
    ``/proc/stat``; idle and I/O wait are not busy), or None where there is none."""
    try:
        for line in stat.read_text().splitlines():
            fields = line.split()
            if fields and fields[0] == "cpu":
                ticks = [int(f) for f in fields[1:9]]  # user .. steal (guest is in user)
                return sum(ticks) - ticks[3] - ticks[4], sum(ticks)
    except (OSError, ValueError):
        pass
    return None


def busy_cores(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """How many of the machine's CPUs were busy on average between two :func:`cpu_ticks`
    (whatever ran on them, not only this process): a CPU run's cores are its bottleneck
    only where this is near their number."""
    if before is None or after is None or after[1] <= before[1] or not os.cpu_count():
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]) * os.cpu_count(), 3)


CPU_USE_KEYS = ("machine_busy_cores", "process_busy_cores")


class CpuUse:
    """The CPU used from its creation on: by the whole machine (:func:`busy_cores`) and by
    this process's threads alone (the orchestrator and, with local workers, their engines
    and docker clients; Ray workers and the containers run outside it)."""

    def __init__(self) -> None:
        self.ticks, self.cpu, self.wall = cpu_ticks(), time.process_time(), time.monotonic()

    def since(self) -> dict[str, float]:
        """Mean busy cores since creation, as ``CPU_USE_KEYS`` (those that are known)."""
        wall = time.monotonic() - self.wall
        use = {"machine_busy_cores": busy_cores(self.ticks, cpu_ticks())}
        if wall > 0:
            use["process_busy_cores"] = round((time.process_time() - self.cpu) / wall, 3)
        return {k: v for k, v in use.items() if v is not None}


def machine() -> dict[str, Any]:
    """The processor, the CPUs this process may use, the load when it started, the system,
    Python, and the GPUs where torch is already loaded (it is not imported for this)."""
    facts: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "system": platform.platform(),
        "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        facts["torch"] = str(torch.__version__)
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_available():
            facts["gpus"] = [cuda.get_device_name(i) for i in range(cuda.device_count())]
    return facts
