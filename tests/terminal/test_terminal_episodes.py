"""Episodes, generated categories, Harbor tasks, build failures and the CLI (real Docker)."""

import json
import logging
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

# the docker SDK is the runner extra; without it this module is skipped, with the reason
pytest.importorskip("docker", reason="the docker SDK is not installed (pip install -e .[runner])")
from test_terminal_tasks import write_harbor, write_native

from runner.terminal.episode import EpisodeConfig, run_episode, run_episodes
from runner.terminal.errors import ImageBuildError
from runner.terminal.generator.categories import CATEGORIES
from runner.terminal.loaders import load_task
from runner.terminal.protocol import PARSE_ERROR_OBSERVATION, ScriptedAgent
from runner.terminal.sandbox import Sandbox
from runner.terminal.verifier import check_initial, pytest_counts, verify_final

pytestmark = pytest.mark.docker


def _check_category(docker_client, builder, path):
    """Initial test passes, final test fails before and passes after the solution."""
    task = load_task(path)
    image = builder.ensure(task).tag
    with Sandbox(docker_client, image, task_id=task.task_id, limits=task.limits) as sb:
        initial = check_initial(sb, task)
        before = verify_final(sb, task)
        outs = [sb.run(cmd, 10) for cmd in ScriptedAgent.from_file(task.solution).commands]
        after = verify_final(sb, task)
    return task.category, initial, before, outs, after


def test_every_category_initial_before_after(docker_client, builder, generated, no_leak):
    assert set(generated) == set(CATEGORIES)
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda p: _check_category(docker_client, builder, p), generated.values())
        )
    for category, initial, before, outs, after in results:
        assert initial.passed, f"{category}: initial state test failed:\n{initial.output}"
        assert not before.passed, f"{category}: final test passes before the solution"
        assert all(o.exit_code == 0 for o in outs), f"{category}: {[o.output for o in outs]}"
        assert after.passed, f"{category}: final test fails after the solution:\n{after.output}"
        # the partial checks: all pass after the solution (they are implied by the full
        # check), not all before it, and there are several checks to grade by
        checks = pytest_counts(after.output)
        assert after.graded == 1.0 and checks["passed"] >= 2, (category, checks)
        assert before.graded < 1.0, (category, before.output)


def test_image_cache_and_from_fallback(docker_client, builder, generated):
    task = load_task(generated["dedupe_sort"])
    first = builder.ensure(task)
    again = builder.ensure(task)
    assert again.tag == first.tag and not again.built
    assert again.fell_back and again.from_image == builder.config.base_image
    # The container.def's 'apt-get install -y python3 python3-pytest' became a no-op.
    dockerfile = builder.dockerfile_for(task)[0]
    assert dockerfile.startswith(f"FROM {builder.config.base_image}\n")


def test_a_missing_from_is_said_once_per_run(docker_client, caplog, monkeypatch):
    """A FROM that cannot be had falls back to the base image: one short warning for the
    whole run (which has several builders: the task pool's, each worker's), and each
    reference with the engine's error at info level, for the run's log."""
    from runner.terminal import images

    monkeypatch.setattr(images, "_fallback_said", False)  # as at the start of a run
    caplog.set_level(logging.INFO, logger=images.__name__)
    refs = ["es-runner-test/absent:1", "es-runner-test/absent:2"]  # neither exists anywhere
    for _ in range(2):
        builder = images.ImageBuilder(docker_client, images.ImageConfig(from_map={}, try_pull=True))
        for ref in refs:
            assert builder.resolve_from(ref) == (builder.config.base_image, True)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "\n" not in warned[0] and len(warned[0]) < 200
    assert warned[0].startswith(f"FROM {refs[0]} is not available; building on the local base")
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert [i.split()[1] for i in infos] == refs * 2
    assert all(i.split(" is not available (")[1].split(")")[0].strip() for i in infos)


def test_concurrent_episodes_with_scripted_solutions(docker_client, builder, generated, no_leak):
    paths = list(generated.values())[:6]
    jobs = [(load_task(p), ScriptedAgent.from_file(p / "solution.sh")) for p in paths]
    records = run_episodes(jobs, concurrency=4, client=docker_client, builder=builder)
    assert [r.task_id for r in records] == [t.task_id for t, _ in jobs]
    for r in records:
        assert r.error is None and r.reward == 1.0 and r.done, r.to_dict()
        assert (
            r.turns
            == len(ScriptedAgent.from_file(paths[records.index(r)] / "solution.sh").commands) + 1
        )
        json.loads(r.to_json())  # the record is JSON-serialisable


def test_wrong_answer_parse_error_and_turn_limit(docker_client, builder, generated, no_leak):
    task = load_task(generated["text_search"])
    agent = lambda msgs: "I think the answer is 3"  # noqa: E731 - never follows the protocol
    rec = run_episode(
        task, agent, client=docker_client, builder=builder, config=EpisodeConfig(max_turns=3)
    )
    assert rec.turns == 3 and not rec.done and rec.reward == 0.0 and rec.error is None
    assert all(t.observation == PARSE_ERROR_OBSERVATION for t in rec.transcript)
    assert "failed" in rec.verifier_output


def test_timed_out_episode_gets_zero(docker_client, builder, generated, no_leak):
    path = generated["dedupe_sort"]
    task = load_task(path)
    solution = ScriptedAgent.from_file(path / "solution.sh").commands
    agent = ScriptedAgent([*solution, "sleep 60"])
    rec = run_episode(
        task,
        agent,
        client=docker_client,
        builder=builder,
        config=EpisodeConfig(episode_timeout_s=3, command_timeout_s=120),
    )
    assert rec.timed_out and rec.reward == 0.0 and "timed out" in rec.verifier_output
    # the episode's deadline, not the command's 120 s, cut the last command: without it the
    # sleep would have ended by itself after 60 s, not timed out (no claim on speed here)
    assert rec.transcript[-1].timed_out and rec.agent_s < 60


def test_harbor_task_end_to_end(docker_client, builder, tmp_path, no_leak):
    task = load_task(write_harbor(tmp_path / "harbor"))
    good = run_episode(
        task, ScriptedAgent.from_file(task.solution), client=docker_client, builder=builder
    )
    assert good.error is None and good.reward == 1.0 and "[reward.txt: 1]" in good.verifier_output
    bad = run_episode(task, ScriptedAgent(["ls /app"]), client=docker_client, builder=builder)
    assert bad.reward == 0.0 and "[reward.txt: 0]" in bad.verifier_output
    # The seed file from the build context made it into the image, and /tests was not
    # visible to the agent.
    assert (
        "seed.txt" in bad.transcript[0].observation
        and "/tests" not in bad.transcript[0].observation
    )


def test_failing_post_is_a_clear_build_error(docker_client, builder, tmp_path, no_leak):
    definition = (
        "Bootstrap: docker\nFrom: ubuntu:22.04\n%post\n    echo preparing\n"
        "    false_command_xyz --flag\n    echo never\n"
    )
    task = load_task(write_native(tmp_path / "badpost", definition=definition))
    with pytest.raises(ImageBuildError) as err:
        builder.ensure(task)
    msg = str(err.value)
    assert msg.startswith("t1: image build failed:") and "false_command_xyz" in msg
    rec = run_episode(task, ScriptedAgent([]), client=docker_client, builder=builder)
    assert rec.error and rec.error.startswith("t1: image build failed") and rec.reward == 0.0


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_env_check(docker_client, generated, tmp_path):
    path = generated["json_filter"]
    proc = _cli("env", "check", str(path), "--solution", str(path / "solution.sh"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["initial_ok"] is True and out["reward"] == 1.0 and out["turns"] == 2
    assert out["task_id"] == path.name and out["duration_s"] > 0 and out["graded"] == 1.0
    # Without a solution the check still ran: exit 0, reward 0; the output file's partial
    # check (it exists) fails too, so nothing is graded.
    proc = _cli("env", "check", str(path))
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["reward"] == 0.0 and out["graded"] == 0.0
    # A task that cannot be loaded: non-zero, one line, no traceback.
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    (broken / "task.json").write_text("{not json")
    proc = _cli("env", "check", str(broken))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "task.json is not valid JSON" in proc.stderr


def test_ctrl_c_during_run_episodes_leaves_no_container(docker_client, generated, no_leak):
    import os
    import signal
    import textwrap
    import time

    paths = [str(p) for p in list(generated.values())[:4]]
    code = textwrap.dedent(f"""
        from runner.terminal.episode import EpisodeConfig, run_episodes
        from runner.terminal.loaders import load_task
        from runner.terminal.protocol import ScriptedAgent
        jobs = [(load_task(p), ScriptedAgent(["echo started", "sleep 300"])) for p in {paths!r}]
        run_episodes(jobs, concurrency=2, config=EpisodeConfig(command_timeout_s=120))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    from runner.terminal.reaper import count_ours

    deadline = time.monotonic() + 120
    while count_ours(docker_client) < no_leak + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert count_ours(docker_client) == no_leak + 2
    time.sleep(1.5)  # both episodes are now inside 'sleep 300'
    os.kill(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr.read()
    # no_leak then checks that the engine holds no container of ours beyond the baseline.
