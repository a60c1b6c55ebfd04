"""The machine a run's process records with its segment (runner/machine.py)."""

from __future__ import annotations

import os

from runner.machine import cpu_model, machine

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
    facts = machine()
    assert facts["cpus"] == os.cpu_count()
    assert facts["usable_cpus"] == len(os.sched_getaffinity(0))
    assert abs(facts["load_1m"] - os.getloadavg()[0]) < 1.0  # the load moves slowly
    assert facts["cpu"] == cpu_model()
    assert isinstance(facts["python"], str) and facts["python"].count(".") == 2
