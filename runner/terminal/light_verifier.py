"""The light verifier: a native task's test file run by a small harness instead of pytest.

pytest's start-up (importing pytest and its plugins, configuration, collection, reporting)
costs about ten times what a generated task's test functions do. The light verifier
uploads the test file with :mod:`runner.terminal.light_harness` and runs it in one exec in
the same container, as the same user, from the same working directory, with the same
environment and timeout as pytest; the harness prints pytest's summary line and exits
with pytest's status, so ``passed`` (exit status 0) and ``graded`` (passed / (passed +
failed + errors), :func:`runner.terminal.verifier.pytest_graded`) are read exactly as
pytest's are.

Which files it takes (:func:`needs_pytest`, from the source alone; anything else goes to
pytest): the file parses; its text never names ``pytest``, ``unittest`` or
``__test__``; it defines no class whose name starts with ``Test``; no xunit / nose hook
(``setup_module``, ``teardown_module``, ``setup_function``, ``teardown_function``,
``setup``, ``teardown``); and every function whose name starts with ``test`` is a plain
``def`` (not ``async``, not a generator, no decorator) whose parameters are none or
``tmp_path`` alone. What the source cannot show (a pytest configuration file or a
``conftest.py`` that pytest would read, ``PYTEST_ADDOPTS`` / ``PYTEST_PLUGINS``, a pytest
plugin installed in the image) the harness checks at run time, and then runs pytest
itself in the same exec (the output says so).
"""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).with_name("light_harness.py")
HARNESS_NAME = "es_light_harness.py"
HANDED_TO_PYTEST = "[light verifier: ran pytest instead: "  # as the harness prints it
FIXTURES = frozenset({"tmp_path"})  # the only fixture the harness gives
_WORDS = ("pytest", "unittest", "__test__")
_HOOKS = frozenset(
    {"setup_module", "teardown_module", "setup_function", "teardown_function", "setup", "teardown"}
)


def needs_pytest(source: str) -> str | None:
    """Why this test file needs pytest (one line), or None when the harness can run it."""
    for word in _WORDS:
        if word in source:
            return f"the file names {word}"
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"the file does not parse here ({exc.msg})"
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            return f"a test class ({node.name})"
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if node.name in _HOOKS:
            return f"an xunit hook ({node.name})"
        if not node.name.startswith("test"):
            continue
        why = _test_function(node)
        if why:
            return f"{node.name}: {why}"
    return None


def _test_function(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    if isinstance(node, ast.AsyncFunctionDef):
        return "async"
    if node.decorator_list:
        return "decorated"
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if a.vararg or a.kwarg or a.defaults or a.kw_defaults or a.posonlyargs or a.kwonlyargs:
        return "parameters other than plain fixtures"
    unknown = [n for n in names if n not in FIXTURES]
    if unknown:
        return f"fixtures {', '.join(unknown)}"
    if any(isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(node)):
        return "a generator"
    return None


def harness_source() -> bytes:
    return HARNESS.read_bytes()
