"""The machine a run's process records with its segment (runner/machine.py)."""

from __future__ import annotations

import os
import resource
import time

from runner.machine import CpuUse, busy_cores, cpu_model, cpu_ticks, machine

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
"""


def test_the_cpu_model_is_linux_model_name(tmp_path):
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    assert cpu_model(tmp_path / "cpuinfo") == "Intel(R) Xeon(R) Platinum 8480+"


def test_without_proc_cpuinfo_the_cpu_model_is_still_a_name(tmp_path):
    name = cpu_model(tmp_path / "absent")
    assert isinstance(name, str) and name


def test_the_facts_are_this_process_s():
    before = os.getloadavg()[0]
    facts = machine()
    after = os.getloadavg()[0]
    assert facts["cpus"] == os.cpu_count()
    assert facts["usable_cpus"] == len(os.sched_getaffinity(0))
    # the kernel updates the load every 5 s: read between two reads, it is one of them
    assert min(before, after) - 0.005 <= facts["load_1m"] <= max(before, after) + 0.005
    assert facts["cpu"] == cpu_model()
    assert isinstance(facts["python"], str) and facts["python"].count(".") == 2


STAT = """cpu  100 5 50 800 40 3 2 10 7 0
cpu0 50 2 25 400 20 1 1 5 3 0
intr 12345
"""


def test_cpu_ticks_count_all_but_idle_and_io_wait_as_busy(tmp_path):
    (tmp_path / "stat").write_text(STAT)
    # user 100 + nice 5 + system 50 + irq 3 + softirq 2 + steal 10 (guest is within user)
    assert cpu_ticks(tmp_path / "stat") == (170, 1010)
    assert cpu_ticks(tmp_path / "absent") is None


def test_busy_cores_are_the_busy_share_of_the_ticks_times_the_cpus():
    n = os.cpu_count()
    assert busy_cores((100, 400), (400, 800)) == round(0.75 * n, 3)
    assert busy_cores(None, (400, 800)) is None
    assert busy_cores((100, 400), (100, 400)) is None  # no time passed


def _own_cpu_seconds() -> float:
    """This process's CPU time as the kernel's resource accounting has it (a reference
    read apart from ``time.process_time``, which ``CpuUse`` uses)."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def _busy_loop(seconds: float) -> float:
    """Spin for ``seconds`` of wall time; return this process's mean CPU share meanwhile,
    measured around the loop. On a busy machine it is below one core: the tests compare
    against it rather than against an idle core they cannot count on."""
    cpu, wall = _own_cpu_seconds(), time.monotonic()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return (_own_cpu_seconds() - cpu) / (time.monotonic() - wall)


def test_the_machine_is_at_least_as_busy_as_this_process_s_busy_loop():
    before = cpu_ticks()
    share = _busy_loop(1.0)
    assert share > 0
    # the loop's CPU is part of the machine's; anything else running only adds (ticks are
    # counted in hundredths of a second per CPU: 0.1 core leaves room for that rounding)
    assert share - 0.1 <= busy_cores(before, cpu_ticks()) <= os.cpu_count()


def test_cpu_use_tells_this_process_s_busy_loop_from_the_machine_s():
    use = CpuUse()
    share = _busy_loop(1.0)
    got = use.since()
    # the process's share is the loop's, however much of a core the machine gave it
    assert abs(got["process_busy_cores"] - share) <= 0.05, (got, share)
    assert got["process_busy_cores"] - 0.1 <= got["machine_busy_cores"] <= os.cpu_count()
