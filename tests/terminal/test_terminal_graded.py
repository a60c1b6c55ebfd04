"""The graded reward: the fraction of the verifier's checks that pass, beside pass/fail."""

import subprocess
import sys

import pytest
from test_terminal_tasks import write_native

from runner.terminal.verifier import pytest_counts, pytest_graded

# Three checks, one per file: an agent that writes two of the three files passes 2 of 3.
THREE_CHECKS = """from pathlib import Path


def test_a():
    assert Path('/home/user/a.txt').read_text() == 'a\\n'


def test_b():
    assert Path('/home/user/b.txt').read_text() == 'b\\n'


def test_c():
    assert Path('/home/user/c.txt').read_text() == 'c\\n'
"""
DEFINITION = """Bootstrap: docker
From: ubuntu:22.04

%post
    apt-get update && apt-get install -y python3 python3-pytest
    mkdir -p /home/user
    chmod 777 /home/user
"""


def _pytest_out(tmp_path, source: str) -> tuple[int, str]:
    """The real output of this interpreter's pytest on ``source``, as the verifier runs it."""
    (tmp_path / "test_x.py").write_text(source)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         str(tmp_path / "test_x.py")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_pytest_counts_from_real_pytest_output(tmp_path):
    two_of_three = "def test_a(): pass\ndef test_b(): pass\ndef test_c(): assert 0\n"
    code, out = _pytest_out(tmp_path, two_of_three)
    assert code == 1 and pytest_counts(out) == {"passed": 2, "failed": 1}
    assert pytest_graded(out, passed=False) == pytest.approx(2 / 3)
    # skipped tests and expected failures are not checks; an error in a fixture is a failed one
    mixed = (
        "import pytest\n@pytest.fixture\ndef broken(): raise RuntimeError\n"
        "def test_a(): pass\ndef test_b(broken): pass\n"
        "@pytest.mark.skip\ndef test_c(): pass\n@pytest.mark.xfail\ndef test_d(): assert 0\n"
    )
    code, out = _pytest_out(tmp_path, mixed)
    assert pytest_counts(out) == {"passed": 1, "error": 1, "skipped": 1, "xfailed": 1}
    assert pytest_graded(out, passed=False) == 0.5
    # a file that does not import: no test ran, one error
    code, out = _pytest_out(tmp_path, "import no_such_module_xyz\ndef test_a(): pass\n")
    assert pytest_graded(out, passed=False) == 0.0
    # no summary line at all (a timeout, a missing pytest): the binary outcome
    assert pytest_counts("[verifier timed out after 5 s]") is None
    assert pytest_graded("", passed=True) == 1.0 and pytest_graded("", passed=False) == 0.0


@pytest.mark.docker
def test_two_of_three_checks_is_two_thirds_and_no_success(
    docker_client, builder, tmp_path, no_leak
):
    from runner.terminal.episode import run_episode
    from runner.terminal.loaders import load_task
    from runner.terminal.protocol import ScriptedAgent

    root = write_native(tmp_path / "three", definition=DEFINITION)
    (root / "test_final_state.py").write_text(THREE_CHECKS)
    task = load_task(root)

    def episode(files):
        commands = [f"echo {f} > /home/user/{f}.txt" for f in files]
        return run_episode(task, ScriptedAgent(commands), client=docker_client, builder=builder)

    partial, full, none = episode("ab"), episode("abc"), episode("")
    assert partial.error is None and partial.verifier == "pytest"
    assert partial.graded == pytest.approx(2 / 3)
    assert partial.passed is False and partial.reward == 0.0  # success stays pass/fail
    assert (full.graded, full.passed, full.reward) == (1.0, True, 1.0)
    assert (none.graded, none.passed, none.reward) == (0.0, False, 0.0)
