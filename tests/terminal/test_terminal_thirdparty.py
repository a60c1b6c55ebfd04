"""Third-party task shapes against a real engine: build, solve, verify, replay, report."""

import json
import shutil
import subprocess
import sys

import pytest

# the docker SDK is the runner extra; without it this module is skipped, with the reason
pytest.importorskip("docker", reason="the docker SDK is not installed (pip install -e .[runner])")

from runner.terminal.check import solution_agent
from runner.terminal.episode import EpisodeConfig, run_episode
from runner.terminal.errors import ImageBuildError
from runner.terminal.loaders import load_task
from runner.terminal.protocol import ScriptedAgent
from runner.terminal.replay import load_recording, replay_recording
from runner.terminal.sandbox import Sandbox

pytestmark = pytest.mark.docker


def _solve(task, docker_client, builder, mode="script", **config):
    agent = solution_agent(task, None, mode)
    cfg = EpisodeConfig(check_initial=True, **config)
    return run_episode(task, agent, client=docker_client, builder=builder, config=cfg)


def test_native_localimage_task_builds_and_solves(docker_client, builder, fixtures_dir, no_leak):
    task = load_task(fixtures_dir / "native_localimage")
    built = builder.ensure(task)
    assert built.fell_back and built.from_image == builder.config.base_image
    notes = "\n".join(built.notes)
    assert "read as FROM ubuntu:22.04" in notes
    assert "python3-pip: not needed" in notes and "'pip3 install pytest': provided" in notes
    rec = _solve(task, docker_client, builder)
    assert rec.error is None and rec.initial_ok is True, rec.initial_output
    assert rec.reward == 1.0 and rec.verifier == "pytest" and rec.turns == 2
    assert rec.build_notes == built.notes or set(built.notes) <= set(rec.build_notes)
    # The agent is uid 1000, the `user` that %post created; %environment ran its chmod.
    probe = run_episode(
        task,
        ScriptedAgent(["id -un; id -u; umask; stat -c '%U %a' /home/user /home/user/inbox"]),
        client=docker_client,
        builder=builder,
    )
    assert probe.transcript[0].observation.split("Output: ")[1].splitlines()[:4] == [
        "user",
        "1000",
        "0002",
        "user 755",
    ]
    # The solution run line by line still works for this one-line solution.
    assert _solve(task, docker_client, builder, mode="lines").reward == 1.0


def test_post_installs_needed_or_not(docker_client, builder, fixtures_dir, tmp_path):
    root = tmp_path / "inst"
    shutil.copytree(fixtures_dir / "native_localimage", root)
    definition = (root / "container.def").read_text()
    # An install nothing uses is dropped when it cannot be had; one the tests use fails.
    (root / "container.def").write_text(
        definition.replace(
            "apt update && apt install -y python3-pip",
            "apt-get update && apt-get install -y es-no-such-tool",
        )
    )
    built = builder.ensure(load_task(root))
    assert any("dropped line 6" in n and "es-no-such-tool" in n for n in built.notes)
    (root / "test_final_state.py").write_text(
        "import subprocess\n\n\ndef test_tool():\n    subprocess.run(['es-no-such-tool'])\n"
    )
    with pytest.raises(ImageBuildError) as err:
        builder.ensure(load_task(root))
    msg = str(err.value)
    assert msg.startswith("fixture_native_localimage: image build failed: container.def line 6:")
    assert "the task uses es-no-such-tool" in msg and "\n" not in msg
    # A failing %test fails the build, as `apptainer build` does.
    (root / "container.def").write_text(definition.replace("test -f /home", "test -d /home"))
    with pytest.raises(ImageBuildError, match=r"container.def %test failed \(exit 1\)"):
        builder.ensure(load_task(root))


def test_recorded_rollouts_replay_and_agree(docker_client, builder, fixtures_dir, no_leak):
    task = load_task(fixtures_dir / "native_recorded")
    rec = load_recording(task.recordings[0])
    report = replay_recording(task, rec, client=docker_client, builder=builder, concurrency=2)
    assert [e["index"] for e in report["replays"]] == [0, 1]
    ok, bad = report["replays"]
    assert (ok["recorded_success"], ok["reward"], ok["agree"]) == (True, 1.0, True)
    assert (bad["recorded_success"], bad["reward"], bad["agree"]) == (False, 0.0, True)
    assert report["agreement"] == 1.0 and ok["exit_code_mismatch_turns"] == []
    # The lead: the successful rollout chowns to `deploy`. Upstream's agent is uid 1000, and
    # %post's first account (deploy) is uid 1000; an agent that is not deploy cannot do it.
    other = load_task(fixtures_dir / "native_recorded")
    other.agent_user = "65534"
    again = replay_recording(other, rec, client=docker_client, builder=builder, indices=[0])
    assert again["replays"][0]["agree"] is False and again["agreement"] == 0.0
    assert again["replays"][0]["exit_code_mismatch_turns"] == [0, 1]


def test_cli_env_check_replay(docker_client, fixtures_dir):
    path = fixtures_dir / "native_recorded"
    summary = path / "solutions" / "fixture-model_summary.json"
    proc = _cli("env", "check", str(path), "--replay", str(summary), "--all")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["agreement"] == 1.0 and len(out["replays"]) == 2
    assert set(out["replays"][0]) >= {"index", "recorded_success", "reward", "agree"}
    proc = _cli("env", "check", str(path), "--replay", str(summary), "--index", "1", "--json")
    one = json.loads(proc.stdout)["replays"]
    assert [(e["index"], e["recorded_success"], e["agree"]) for e in one] == [(1, False, True)]
    proc = _cli("env", "check", str(path), "--replay", str(summary), "--index", "5")
    assert proc.returncode == 2 and "--index 5 is out of range" in proc.stderr


def test_harbor_solve_sh_runs_as_one_script(docker_client, builder, fixtures_dir, no_leak):
    task = load_task(fixtures_dir / "harbor_heredoc")
    rec = _solve(task, docker_client, builder)
    assert rec.error is None and rec.reward == 1.0 and rec.verifier == "test.sh", rec.to_dict()
    assert rec.rewards == {"reward": 1.0} and "[reward.txt: 1]" in rec.verifier_output
    # One command per line breaks the loop and the here-document.
    assert _solve(task, docker_client, builder, mode="lines").reward == 0.0


def test_harbor_user_env_and_reward_json(docker_client, builder, fixtures_dir, no_leak):
    task = load_task(fixtures_dir / "harbor_user")
    probe = run_episode(
        task,
        ScriptedAgent(["echo $(id -un) $PWD $HOME $GREETING"]),
        client=docker_client,
        builder=builder,
    )
    assert probe.transcript[0].observation.split("Output: ")[1].splitlines()[0] == (
        "app /home/app/work /home/app hello"
    )
    assert _solve(task, docker_client, builder).reward == 1.0
    task = load_task(fixtures_dir / "harbor_reward_json")
    rec = _solve(task, docker_client, builder)
    assert rec.rewards == {"correctness": 1.0, "style": 0.5}
    assert rec.reward == 0.75 and not rec.passed and rec.error is None
    assert rec.graded == 0.75  # Harbor's graded reward is the fraction; success stays False


def test_buildkit_only_dockerfile(docker_client, builder, fixtures_dir, no_leak):
    task = load_task(fixtures_dir / "harbor_buildkit")
    built = builder.ensure(task)
    assert built.builder == "buildkit"
    assert any("here-document(s) EOF expanded" in n for n in built.notes)
    rec = _solve(task, docker_client, builder)
    assert rec.error is None and rec.reward == 1.0, rec.verifier_output


def test_verifier_that_needs_network(docker_client, builder, fixtures_dir, no_leak):
    task = load_task(fixtures_dir / "harbor_network_verifier")
    rec = _solve(task, docker_client, builder)
    assert rec.reward == 0.0 and rec.verifier == "test.sh"
    assert rec.verifier_error.startswith("verifier needs network: test.sh ran without a network")
    assert rec.error == f"{task.task_id}: {rec.verifier_error}"
    offline = _solve(task, docker_client, builder, offline_verifier=True)
    assert offline.reward == 1.0 and offline.verifier == "offline-pytest" and offline.error is None
    assert "offline verifier: test_state.py with the image's pytest" in offline.verifier_output


def test_verifier_network_is_only_the_verifiers(docker_client, no_leak):
    from runner.terminal.images import ImageConfig

    with Sandbox(docker_client, ImageConfig().base_image, verifier_network=True) as sb:
        assert sb.run("ls /sys/class/net", 5).output.split() == ["lo"]
        assert sb.connect_network()
        code, out = sb.exec_root(["ls", "/sys/class/net"], timeout=10)
        assert code == 0 and len(out.split()) == 2 and "lo" in out.split()


def test_terminal_bench_1_task(docker_client, builder, fixtures_dir, no_leak):
    task = load_task(fixtures_dir / "tbench1")
    rec = _solve(task, docker_client, builder)
    assert rec.reward == 1.0 and rec.verifier == "run-tests.sh", rec.verifier_output
    assert "[pytest summary: 2/2 passed]" in rec.verifier_output
    bad = run_episode(task, ScriptedAgent([]), client=docker_client, builder=builder)
    assert bad.reward == 0.0 and "[pytest summary: 1/2 passed]" in bad.verifier_output


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True, timeout=600
    )


def test_cli_tasks_check_report(docker_client, fixtures_dir):
    proc = _cli("tasks", "check", str(fixtures_dir), "--solutions", "--concurrency", "3")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    by_task = {line.split()[0]: line for line in lines[:-1]}
    assert len(by_task) == 10
    assert "UNSUPPORTED: harbor_multistep: multi-step task" in by_task["harbor_multistep"]
    assert "sidecar service(s) api" in by_task["harbor_compose"]
    assert "initial=pass  solution=1" in by_task["fixture_native_localimage"]
    assert "replays=2/2 agree" in by_task["fixture_native_recorded"]
    assert (
        "build=built/buildkit" in by_task["harbor_buildkit"]
        or "cached/buildkit" in (by_task["harbor_buildkit"])
    )
    assert "[verifier needs network" in by_task["harbor_network_verifier"]
    assert "solution=0.75 correctness=1,style=0.5" in by_task["harbor_reward_json"]
    assert lines[-1].startswith("10 task(s): 8 loaded (2 unsupported, 0 load errors), 8 built")
    assert "solutions 5/7 solved (1 verifier(s) need network)" in lines[-1]
    proc = _cli("tasks", "check", str(fixtures_dir / "tbench1"), "--json")
    report = json.loads(proc.stdout)
    assert report["summary"]["built"] == 1 and report["tasks"][0]["layout"] == "terminal-bench"
    proc = _cli("tasks", "check", str(fixtures_dir / "nowhere"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
