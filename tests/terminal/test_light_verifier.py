"""The light verifier equals pytest: verdict and graded score, on the same container state.

Every native fixture and one generated task per category, at every prefix of its reference
solution (so failing, partly passing and passing states), and final states of real
episodes of the warm-start model (commands recorded by a training run, whose pytest
verdicts are stored beside them) replayed in fresh containers: each state is judged by
both runners, one after the other, in one container.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("docker")

from runner.terminal.generator.writer import generate_specs  # noqa: E402
from runner.terminal.light_verifier import needs_pytest  # noqa: E402
from runner.terminal.loaders import load_native  # noqa: E402
from runner.terminal.protocol import parse_action  # noqa: E402
from runner.terminal.sandbox import Sandbox  # noqa: E402
from runner.terminal.verifier import check_initial, verify_final  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = Path(__file__).parent / "data" / "recorded_episodes.json"


def _both(sandbox, task, initial=False):
    run = check_initial if initial else verify_final
    light, full = run(sandbox, task, verifier="light"), run(sandbox, task, verifier="pytest")
    assert full.verifier == "pytest"
    return light, full


def _same(light, full, where):
    assert light.verifier == "light", (where, light.output[-500:])
    assert (light.passed, light.graded, light.reward) == (full.passed, full.graded, full.reward), (
        where,
        light.output[-800:],
        full.output[-800:],
    )


def _states(builder, docker_client, task, commands):
    """(light, pytest) at the initial state and after each command, in one container."""
    built = builder.ensure(task)
    pairs = []
    with Sandbox.for_task(docker_client, built.tag, task) as sandbox:
        if task.initial_test:
            pairs.append(("initial check", *_both(sandbox, task, initial=True)))
        pairs.append(("before any command", *_both(sandbox, task)))
        for i, command in enumerate(commands):
            sandbox.run(command, 20)
            pairs.append((f"after command {i + 1}", *_both(sandbox, task)))
    return pairs


def test_rules_read_from_the_source():
    plain = "from pathlib import Path\n\n\ndef test_a():\n    assert Path('/x').exists()\n"
    assert needs_pytest(plain) is None
    assert needs_pytest("def test_a(tmp_path):\n    pass\n") is None
    assert needs_pytest("def helper(x):\n    pass\n") is None  # not a test
    refused = {
        "import pytest\n": "pytest",
        "def test_a(capsys):\n    pass\n": "capsys",
        "def test_a(tmp_path, x=1):\n    pass\n": "parameters",
        "@deco\ndef test_a():\n    pass\n": "decorated",
        "async def test_a():\n    pass\n": "async",
        "def test_a():\n    yield 1\n": "generator",
        "class TestA:\n    def test_b(self):\n        pass\n": "test class",
        "def setup_module():\n    pass\n": "xunit",
        "import unittest\n": "unittest",
        "def test_a(:\n": "parse",
    }
    for source, word in refused.items():
        why = needs_pytest(source)
        assert why is not None and word in why, (source, why)


def test_equal_on_every_generated_category_at_each_solution_step(tmp_path, docker_client, builder):
    specs, seen = [], set()
    for task_id, spec in generate_specs(14, 7):  # one per category, categories in rotation
        assert spec.category not in seen
        seen.add(spec.category)
        specs.append((load_native(spec.write(tmp_path, task_id)), spec.solution))
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda ts: _states(builder, docker_client, *ts), specs))
    graded = set()
    for (task, _), pairs in zip(specs, results, strict=True):
        for where, light, full in pairs:
            _same(light, full, f"{task.task_id} {where}")
            graded.add(round(full.graded, 3))
        assert pairs[-1][2].passed, task.task_id  # the reference solution passes
    assert 0.0 in graded and 1.0 in graded and len(graded) >= 4, graded  # partly right too


def test_equal_on_the_native_fixtures(docker_client, builder):
    localimage = load_native(FIXTURES / "native_localimage")
    recorded = load_native(FIXTURES / "native_recorded")
    summary = json.loads(
        next((FIXTURES / "native_recorded" / "solutions").glob("*.json")).read_text()
    )
    replies = [m["content"] for m in summary["results"][0]["messages"] if m["role"] == "assistant"]
    recorded_commands = [a.command for a in map(parse_action, replies) if a.kind == "command"]
    solution = localimage.solution.read_text().strip().splitlines()
    for task, commands in ((localimage, solution), (recorded, recorded_commands)):
        pairs = _states(builder, docker_client, task, commands)
        for where, light, full in pairs:
            _same(light, full, f"{task.task_id} {where}")
        assert not pairs[1][2].passed  # before the agent's commands the final check fails


def test_equal_on_recorded_final_states_of_real_episodes(tmp_path, docker_client, builder):
    doc = json.loads(RECORDED.read_text())
    specs = dict(generate_specs(doc["tasks"]["n"], doc["tasks"]["seed"]))
    # one episode per recorded (category, graded score): failing, partial and passing states
    chosen, keys = [], set()
    for episode in doc["episodes"]:
        key = (specs[episode["task_id"]].category, round(episode["graded"], 3))
        if key not in keys and not episode["any_timed_out"]:
            keys.add(key)
            chosen.append(episode)
    chosen = chosen[:12]
    assert len({round(e["graded"], 3) for e in chosen}) >= 5

    def final_state(episode):
        task = load_native(specs[episode["task_id"]].write(tmp_path, episode["task_id"]))
        built = builder.ensure(task)
        with Sandbox.for_task(docker_client, built.tag, task) as sandbox:
            for command in episode["commands"]:
                sandbox.run(command, 10)
            return _both(sandbox, task)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(final_state, chosen))
    for episode, (light, full) in zip(chosen, results, strict=True):
        where = f"{episode['task_id']} (recorded {episode['passed']}, {episode['graded']:.3f})"
        _same(light, full, where)
        # the replay reached the recorded state: pytest judges it as it did in the run
        assert (full.passed, round(full.graded, 6)) == (
            episode["passed"],
            round(episode["graded"], 6),
        ), where


def test_pytest_where_the_file_or_the_task_or_the_image_needs_it(tmp_path, docker_client, builder):
    task_id, spec = generate_specs(1, 3)[0]
    folder = spec.write(tmp_path, task_id)
    task = load_native(folder)
    built = builder.ensure(task)
    with Sandbox.for_task(docker_client, built.tag, task) as sandbox:
        assert verify_final(sandbox, task, verifier="light").verifier == "light"
        # a conftest.py that pytest would read for the file: the harness hands over to pytest
        sandbox.exec_root(["sh", "-c", "echo 'X = 1' > /conftest.py"], timeout=10)
        handed = verify_final(sandbox, task, verifier="light")
        assert handed.verifier == "pytest" and "/conftest.py exists" in handed.output
        sandbox.exec_root(["rm", "/conftest.py"], timeout=10)
        # a fixture the harness does not give: pytest, decided from the source
        task.final_test = task.final_test + "\n\ndef test_extra(capsys):\n    pass\n"
        assert verify_final(sandbox, task, verifier="light").verifier == "pytest"
        # a task whose task.json asks for pytest
        meta = json.loads((folder / "task.json").read_text())
        (folder / "task.json").write_text(json.dumps({**meta, "verifier": "pytest"}))
        pinned = load_native(folder)
        assert pinned.verifier == "pytest"
        assert verify_final(sandbox, pinned, verifier="light").verifier == "pytest"
