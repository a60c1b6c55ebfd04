"""The light verifier's harness: run one test file's test functions in this process, as
pytest 7 would collect and judge them, and end with pytest's summary line and exit status.

It runs inside the task's container (any python3 >= 3.6, standard library only), started
as ``python3 light_harness.py TEST_FILE`` by :mod:`runner.terminal.light_verifier`, which
uploads it only for files whose source it has checked needs nothing of pytest (no
fixtures, marks, classes, hooks; see ``light_verifier.needs_pytest``). What the source
cannot show is checked here, at run time, and hands the run to pytest itself in the same
process (``os.execv``): a pytest configuration or ``conftest.py`` that pytest would read
for this file, ``PYTEST_ADDOPTS`` / ``PYTEST_PLUGINS``, or a pytest plugin installed in
the image.

Mirrored from pytest (``python3 -m pytest -q -p no:cacheprovider -o addopts= FILE``):
sys.path is [the file's folder, the working directory, ...]; the module is imported under
its base name; the test functions are the module's functions whose names start with
``test``, in the module's definition order; ``tmp_path`` (the one fixture it gives) is a fresh empty
directory (0700, removed after the test); a test passes when it returns and fails on any exception (SystemExit included); a module
that cannot be imported is one error. Exit status 0 (all passed), 1 (a test failed), 2
(the import failed), 5 (no tests).
"""

import os
import pathlib
import shutil
import sys
import tempfile
import time
import traceback
import types

PYTEST_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def why_pytest(test_file):
    """A reason to run pytest instead, or None."""
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        if os.environ.get(name):
            return name + " is set"
    folder = os.path.dirname(os.path.abspath(test_file))
    # pytest reads a configuration file in the test's folder or above it, and every
    # conftest.py on the way down to it (no configuration file: no cut-off)
    while True:
        for name in PYTEST_FILES + ("conftest.py",):
            if os.path.exists(os.path.join(folder, name)):
                return os.path.join(folder, name) + " exists"
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    # a plugin installed in the image (an entry point in group pytest11), found by reading
    # the installed distributions' entry_points.txt (importlib.metadata costs more than
    # the tests)
    for folder in sys.path:
        try:
            names = os.listdir(folder or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith((".dist-info", ".egg-info")):
                points = os.path.join(folder, name, "entry_points.txt")
                try:
                    with open(points, encoding="utf-8") as f:
                        if "[pytest11]" in f.read():
                            return "a pytest plugin is installed (" + name + ")"
                except OSError:
                    continue
    return None


HANDED_TO_PYTEST = "[light verifier: ran pytest instead: "


def run_pytest(test_file, why):
    print(HANDED_TO_PYTEST + why + "]", flush=True)
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", test_file]
    os.execv(sys.executable, [sys.executable] + args)


def summary(counts, seconds):
    parts = [f"{n} {kind}" for kind, n in counts if n]
    return f"{', '.join(parts) or 'no tests ran'} in {seconds:.2f}s"


def main(test_file):
    why = why_pytest(test_file)
    if why is not None:
        run_pytest(test_file, why)
    t0 = time.time()
    # as `python3 -m pytest` (the working directory first) with pytest's prepend import
    sys.path[0] = os.getcwd()
    sys.path.insert(0, os.path.dirname(os.path.abspath(test_file)))
    name = os.path.splitext(os.path.basename(test_file))[0]
    try:
        module = __import__(name)
    except BaseException:  # noqa: BLE001 - pytest reports any import failure as an error
        print(f"ERROR collecting {test_file}")
        traceback.print_exc(file=sys.stdout)
        print(summary([("error", 1)], time.time() - t0))
        return 2
    tests = [
        (key, value)
        for key, value in list(vars(module).items())
        if key.startswith("test") and isinstance(value, types.FunctionType)
    ]
    passed = failed = 0
    for key, test in tests:
        scratch = tempfile.mkdtemp(prefix="es-light-") if test.__code__.co_argcount else None
        try:
            test(pathlib.Path(scratch)) if scratch else test()
        except KeyboardInterrupt:
            raise
        except BaseException:  # noqa: BLE001 - a test's failure, whatever it raised
            failed += 1
            print(f"FAILED {os.path.basename(test_file)}::{key}")
            traceback.print_exc(file=sys.stdout)
        else:
            passed += 1
        finally:
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
    print(summary([("failed", failed), ("passed", passed)], time.time() - t0))
    if not tests:
        return 5
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
