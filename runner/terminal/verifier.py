"""Run a task's tests inside its container: initial state before, final state after.

- Native: ``test_final_state.py`` with the image's pytest, as the agent (upstream runs it in
  the agent's own shell); or, with ``verifier="light"``, by the light verifier's harness
  (:mod:`runner.terminal.light_verifier`: the same checks without pytest's start-up, for
  the files it can run; pytest for the others and for tasks whose ``task.json`` says
  ``"verifier": "pytest"``).
- Harbor: ``tests/`` uploaded to ``/tests``, ``bash /tests/test.sh`` run from the working
  directory as the verifier user with ``[environment].env`` + ``[verifier].env``; the reward
  is ``/logs/verifier/reward.json`` (every numeric entry kept, as Harbor does) or else
  ``reward.txt``.
- Terminal-Bench 1: ``run-tests.sh`` and ``tests/`` uploaded to ``/tests``, run with
  ``TEST_DIR=/tests``; passed when pytest's summary shows every test passed.

Besides pass/fail, every result carries ``graded``: the fraction of the verifier's checks
that passed (pytest's per-test outcomes for native tasks, Terminal-Bench and the offline
verifier; Harbor's scalar reward, clipped to [0, 1], which is the fraction when the task
writes one). Without per-check outcomes it is the binary reward. ``passed`` stays the
success; ``graded`` is a finer fitness for ES (``es.reward: graded``).

A verifier that fails because it needs a network it cannot use (the usual ``test.sh``
installs ``uv`` or ``curl`` from the internet) is reported as ``verifier needs network``
instead of a silent 0. The opt-in offline verifier then runs the task's own pytest files
with the image's pytest, and the result says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from runner.terminal import light_verifier
from runner.terminal.sandbox import Sandbox
from runner.terminal.task import Task

_NATIVE_DIR = "/.es-verify"
_PYTEST = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
VERIFIERS = ("light", "pytest")  # how a native task's test file is run
NEEDS_NETWORK = "verifier needs network"
# What a download that cannot reach its host prints (curl, apt, pip, uv, git, python).
_NETWORK_FAILURE = re.compile(
    r"Could not resolve host|Temporary failure in name resolution|Temporary failure resolving|"
    r"Network is unreachable|Failed to establish a new connection|Name or service not known|"
    r"No address associated with hostname|Could not connect to|curl: \((?:5|6|7|28|35|60)\)|"
    r"unable to access 'https?://|getaddrinfo|Failed to fetch https?://|"
    r"Unable to locate package|CERTIFICATE_VERIFY_FAILED|SSL certificate problem|"
    r"error sending request for url|dns error|failed to lookup address|"
    r"Connection timed out|No route to host",
    re.IGNORECASE,
)


@dataclass
class VerifierResult:
    passed: bool
    reward: float
    exit_code: int
    output: str
    rewards: dict[str, float] = field(default_factory=dict)
    verifier: str = ""  # light | pytest | test.sh | run-tests.sh | offline-pytest
    error: str | None = None  # e.g. "verifier needs network: ..."
    graded: float | None = None  # fraction of checks passed; None: the binary reward

    def __post_init__(self) -> None:
        if self.graded is None:
            self.graded = 1.0 if self.passed else 0.0


# The counts of pytest's last summary line, e.g. "1 failed, 2 passed, 1 warning in 0.05s".
_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")
_PYTEST_FINAL = re.compile(r"^=*\s*(?:\d+ \w+(?:, )?)+ in [\d.]+ ?s(?:econds)?\b.*$", re.M)


def pytest_counts(out: str) -> dict[str, int] | None:
    """Outcome counts of pytest's final summary line (``error`` for errors), or None."""
    lines = _PYTEST_FINAL.findall(out)
    if not lines:
        return None
    counts: dict[str, int] = {}
    for n, kind in _PYTEST_COUNT.findall(lines[-1]):
        kind = "error" if kind.startswith("error") else kind
        counts[kind] = counts.get(kind, 0) + int(n)
    return counts


def graded_fraction(passed: int, checks: int, fallback: bool) -> float:
    """passed / checks; with no checks counted, the binary outcome."""
    return passed / checks if checks else (1.0 if fallback else 0.0)


def pytest_graded(out: str, passed: bool) -> float:
    """Fraction of pytest's tests that passed (failed and errored ones count as checks;
    skipped and expected failures do not)."""
    c = pytest_counts(out) or {}
    return graded_fraction(
        c.get("passed", 0), c.get("passed", 0) + c.get("failed", 0) + c.get("error", 0), passed
    )


def _pytest_in(
    sandbox: Sandbox, task: Task, name: str, source: str, timeout: float, verifier: str
) -> VerifierResult:
    light = verifier == "light" and task.verifier != "pytest"
    light = light and light_verifier.needs_pytest(source) is None
    files = {name: source.encode()}
    if light:
        files[light_verifier.HARNESS_NAME] = light_verifier.harness_source()
        command = ["python3", f"{_NATIVE_DIR}/{light_verifier.HARNESS_NAME}"]
    else:
        command = list(_PYTEST)
    # The tests are copied in only when they run, so the agent never sees them.
    sandbox.put_files(_NATIVE_DIR, files)
    code, out = sandbox.exec_root(
        [
            "/bin/sh",
            "-c",
            '[ -r /.es/environment ] && . /.es/environment; exec "$@"',
            "sh",
            *command,
            f"{_NATIVE_DIR}/{name}",
        ],
        timeout=timeout,
        user=task.agent_user,
        workdir=task.workdir,
        env=_home_env(task),
    )
    sandbox.exec_root(["rm", "-rf", _NATIVE_DIR], timeout=10)
    if code == 124:
        out += f"\n[verifier timed out after {timeout:g} s]"
    reward = 1.0 if code == 0 else 0.0
    ran = "light" if light and light_verifier.HANDED_TO_PYTEST not in out else "pytest"
    return VerifierResult(
        code == 0, reward, code, out, {"reward": reward}, ran,
        graded=pytest_graded(out, code == 0),
    )  # fmt: skip


def _home_env(task: Task) -> dict[str, str]:
    return {"HOME": task.home} if task.home and task.agent_user not in ("root", "0") else {}


def check_initial(
    sandbox: Sandbox, task: Task, *, verifier: str = "pytest"
) -> VerifierResult | None:
    """Run test_initial_state.py (native tasks that have one); None when there is none."""
    if task.layout != "native" or not task.initial_test:
        return None
    timeout = task.limits.verifier_timeout_s
    return _pytest_in(sandbox, task, "test_initial_state.py", task.initial_test, timeout, verifier)


def verify_final(
    sandbox: Sandbox, task: Task, *, offline_fallback: bool = False, verifier: str = "pytest"
) -> VerifierResult:
    """The task's verifier; with ``offline_fallback`` a verifier that needs a network it
    cannot use is replaced by :func:`verify_offline` (recorded as ``offline-pytest``);
    ``verifier`` (``light`` or ``pytest``) says how a native task's test file runs."""
    if task.layout == "native":
        assert task.final_test is not None
        timeout = task.limits.verifier_timeout_s
        return _pytest_in(sandbox, task, "test_final_state.py", task.final_test, timeout, verifier)
    result = _verify_script(sandbox, task)
    if result.error and result.error.startswith(NEEDS_NETWORK) and offline_fallback:
        offline = verify_offline(sandbox, task)
        offline.output = (
            f"[{result.error}; ran the offline verifier instead]\n"
            + offline.output
            + "\n--- output of the task's own verifier ---\n"
            + result.output[-4000:]
        )
        return offline
    return result


def _test_files(task: Task) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    if task.tests_dir is not None and Path(task.tests_dir).is_dir():
        for p in sorted(Path(task.tests_dir).rglob("*")):
            if p.is_file():
                files[str(p.relative_to(task.tests_dir))] = p.read_bytes()
    if task.layout == "terminal-bench" and task.test_script is not None:
        files["run-tests.sh"] = task.test_script.read_bytes()
    return files


def _verify_script(sandbox: Sandbox, task: Task) -> VerifierResult:
    sandbox.put_files("/tests", _test_files(task))
    sandbox.exec_root(
        [
            "/bin/sh",
            "-c",
            "rm -rf /logs/verifier && mkdir -p /logs/verifier /logs/agent && "
            "chmod 777 /logs /logs/verifier /logs/agent",
        ],
        timeout=10,
    )
    network = sandbox.connect_network()  # False where the verifier gets no network
    env = {**task.env, **task.verifier_env}
    user = task.verifier_user or task.agent_user
    if task.layout == "terminal-bench":
        if task.test_script is None:
            return verify_offline(sandbox, task, name="pytest")
        env = {"TEST_DIR": "/tests", "T_BENCH_TEST_DIR": "/tests", **env}
        script, kind = "/tests/run-tests.sh", "run-tests.sh"
    else:
        script, kind = "/tests/test.sh", "test.sh"
    code, out = sandbox.exec_root(
        ["bash", script],
        timeout=task.limits.verifier_timeout_s,
        user=user,
        workdir=task.workdir,
        env=env,
    )
    if code == 124:
        out += f"\n[verifier timed out after {task.limits.verifier_timeout_s:g} s]"
    if kind == "run-tests.sh":
        passed, summary, graded = _pytest_summary(out)
        if passed is None:  # no pytest summary: judge by the exit code
            passed, summary = code == 0, f"[run-tests.sh exit code {code}]"
        reward = 1.0 if passed else 0.0
        result = VerifierResult(
            passed, reward, code, out + "\n" + summary, {"reward": reward}, kind, graded=graded
        )
    else:
        result = _read_rewards(sandbox, code, out)
    if not result.passed and result.reward == 0.0:
        cause = _network_failure(out)
        if cause is not None:
            where = "without a network" if not network else "and its downloads failed"
            result.error = f"{NEEDS_NETWORK}: {kind} ran {where} ({cause})"
            result.output += f"\n[{result.error}]"
    return result


def _read_rewards(sandbox: Sandbox, code: int, out: str) -> VerifierResult:
    rcode, text = sandbox.exec_root(["cat", "/logs/verifier/reward.json"], timeout=10)
    rewards: dict[str, float] = {}
    note = ""
    if rcode == 0 and text.strip():
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            return VerifierResult(
                False,
                0.0,
                code,
                out + f"\n[reward.json is not a JSON object: {text[:80]!r}]",
                verifier="test.sh",
            )
        rewards = {
            str(k): float(v)
            for k, v in parsed.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        note = f"[reward.json: {json.dumps(rewards, sort_keys=True)}]"
    tcode, ttext = sandbox.exec_root(["cat", "/logs/verifier/reward.txt"], timeout=10)
    if "reward" not in rewards and tcode == 0 and ttext.strip():
        try:
            rewards["reward"] = float(ttext.strip())
            note += ("\n" if note else "") + f"[reward.txt: {rewards['reward']:g}]"
        except ValueError:
            if not rewards:
                return VerifierResult(
                    False,
                    0.0,
                    code,
                    out + f"\n[reward.txt is not a number: {ttext[:80]!r}]",
                    verifier="test.sh",
                )
    if not rewards:
        return VerifierResult(
            False,
            0.0,
            code,
            out + "\n[no /logs/verifier/reward.txt or reward.json was written]",
            verifier="test.sh",
        )
    # The scalar: Harbor's "reward" entry; for reward.json without one, the mean of its entries.
    reward = rewards["reward"] if "reward" in rewards else sum(rewards.values()) / len(rewards)
    return VerifierResult(
        reward >= 1.0, reward, code, out + "\n" + note, rewards, "test.sh",
        graded=min(1.0, max(0.0, reward)),
    )  # fmt: skip


def _pytest_summary(out: str) -> tuple[bool | None, str, float | None]:
    """Terminal-Bench's pytest parser: every test in the short summary PASSED; with the
    graded fraction (PASSED over PASSED, FAILED and ERROR)."""
    if "short test summary info" not in out:
        return None, "", None
    section = out.split("short test summary info", 1)[1]
    statuses = re.findall(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\b", section, re.M)
    if not statuses:
        return None, "", None
    ok = all(s in ("PASSED", "XFAIL", "SKIPPED") for s in statuses) and "PASSED" in statuses
    n_pass = statuses.count("PASSED")
    checks = n_pass + statuses.count("FAILED") + statuses.count("ERROR")
    return (
        ok,
        f"[pytest summary: {n_pass}/{len(statuses)} passed]",
        graded_fraction(n_pass, checks, ok),
    )


def _network_failure(out: str) -> str | None:
    """The last line that shows a download failing (a traceback ends with its cause)."""
    found = None
    for line in out.splitlines():
        if _NETWORK_FAILURE.search(line) and not line.lstrip().startswith(("File ", "for ")):
            found = line.strip()[:160]
    return found


def verify_offline(sandbox: Sandbox, task: Task, name: str = "offline-pytest") -> VerifierResult:
    """Run the task's pytest files (tests/test_*.py) with the image's own pytest."""
    files = _test_files(task)
    tests = sorted(f"/tests/{n}" for n in files if re.search(r"(^|/)test_[^/]*\.py$|_test\.py$", n))
    if not tests:
        return VerifierResult(
            False,
            0.0,
            -1,
            "[offline verifier: the task has no tests/test_*.py files]",
            verifier=name,
            error="offline verifier: no pytest files in tests/",
        )
    sandbox.put_files("/tests", files)
    code, out = sandbox.exec_root(
        [*_PYTEST, "-rA", *tests],
        timeout=task.limits.verifier_timeout_s,
        user=task.verifier_user or task.agent_user,
        workdir=task.workdir,
        env={**task.env, **task.verifier_env, "TEST_DIR": "/tests"},
    )
    if "No module named pytest" in out:
        return VerifierResult(
            False, 0.0, code, out, verifier=name, error="offline verifier: the image has no pytest"
        )
    reward = 1.0 if code == 0 else 0.0
    shown = ", ".join(t[len("/tests/") :] for t in tests)
    return VerifierResult(
        code == 0,
        reward,
        code,
        out + f"\n[offline verifier: {shown} with the image's pytest; exit code {code}]",
        {"reward": reward},
        name,
        graded=pytest_graded(out, code == 0),
    )
