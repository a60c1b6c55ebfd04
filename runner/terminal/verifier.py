"""Run a task's tests inside its container: initial state before, final state after."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runner.terminal.sandbox import Sandbox
from runner.terminal.task import Task

_NATIVE_DIR = "/.es-verify"
_PYTEST = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]


@dataclass
class VerifierResult:
    passed: bool
    reward: float
    exit_code: int
    output: str


def _pytest_in(
    sandbox: Sandbox, task: Task, name: str, source: str, timeout: float
) -> VerifierResult:
    # The tests are copied in only when they run, so the agent never sees them.
    sandbox.put_files(_NATIVE_DIR, {name: source.encode()})
    code, out = sandbox.exec_root(
        [
            "/bin/sh",
            "-c",
            '[ -r /.es/environment ] && . /.es/environment; exec "$@"',
            "sh",
            *_PYTEST,
            f"{_NATIVE_DIR}/{name}",
        ],
        timeout=timeout,
        user=task.agent_user,
        workdir=task.workdir,
    )
    sandbox.exec_root(["rm", "-rf", _NATIVE_DIR], timeout=10)
    if code == 124:
        out += f"\n[verifier timed out after {timeout:g} s]"
    return VerifierResult(code == 0, 1.0 if code == 0 else 0.0, code, out)


def check_initial(sandbox: Sandbox, task: Task) -> VerifierResult | None:
    """Run test_initial_state.py (native tasks that have one); None when there is none."""
    if task.layout != "native" or not task.initial_test:
        return None
    return _pytest_in(
        sandbox, task, "test_initial_state.py", task.initial_test, task.limits.verifier_timeout_s
    )


def verify_final(sandbox: Sandbox, task: Task) -> VerifierResult:
    if task.layout == "native":
        assert task.final_test is not None
        return _pytest_in(
            sandbox, task, "test_final_state.py", task.final_test, task.limits.verifier_timeout_s
        )
    return _verify_harbor(sandbox, task)


def _verify_harbor(sandbox: Sandbox, task: Task) -> VerifierResult:
    assert task.tests_dir is not None
    files = {
        str(p.relative_to(task.tests_dir)): p.read_bytes()
        for p in sorted(Path(task.tests_dir).rglob("*"))
        if p.is_file()
    }
    sandbox.put_files("/tests", files)
    sandbox.exec_root(
        ["/bin/sh", "-c", "mkdir -p /logs/verifier && chmod 777 /logs /logs/verifier"], timeout=10
    )
    code, out = sandbox.exec_root(
        ["bash", "/tests/test.sh"], timeout=task.limits.verifier_timeout_s, workdir=task.workdir
    )
    rcode, text = sandbox.exec_root(["cat", "/logs/verifier/reward.txt"], timeout=10)
    if rcode != 0:
        return VerifierResult(
            False, 0.0, code, out + "\n[no /logs/verifier/reward.txt was written]"
        )
    try:
        value = float(text.strip())
    except ValueError:
        return VerifierResult(
            False, 0.0, code, out + f"\n[reward.txt is not a number: {text[:80]!r}]"
        )
    passed = value >= 1.0
    return VerifierResult(passed, 1.0 if passed else 0.0, code, out + f"\n[reward.txt: {value:g}]")
