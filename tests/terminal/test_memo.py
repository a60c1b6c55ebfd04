"""The memo of repeated training episodes (runner.terminal.memo), in real containers: a
repeated episode takes the earlier one's outputs and verdict without a container; one that
diverges replays the shared commands in a real container and goes on there; replays and
audits that differ from the memo are counted, and an audit's verdict is the real one."""

from __future__ import annotations

import pytest

pytest.importorskip("docker")

from runner.terminal.episode import run_episode  # noqa: E402
from runner.terminal.generator.writer import generate_specs  # noqa: E402
from runner.terminal.loaders import load_native  # noqa: E402
from runner.terminal.memo import EpisodeMemo  # noqa: E402
from runner.terminal.protocol import ScriptedAgent  # noqa: E402
from runner.terminal.sandbox import Sandbox  # noqa: E402


@pytest.fixture
def task(tmp_path, builder):
    task_id, spec = generate_specs(1, 11)[0]
    task = load_native(spec.write(tmp_path, task_id))
    builder.ensure(task)
    return task, list(spec.solution)


@pytest.fixture
def starts(monkeypatch):
    """The containers started, counted at the one place every sandbox starts."""
    count = [0]
    start = Sandbox.start

    def counted(self):
        count[0] += 1
        return start(self)

    monkeypatch.setattr(Sandbox, "start", counted)
    return count


def _verdict(rec):
    return rec.passed, rec.graded, rec.verifier_output, rec.error


def test_a_repeated_episode_needs_no_container_and_a_diverging_one_replays(
    docker_client, builder, task, starts, no_leak
):
    task, solution = task
    memo = EpisodeMemo(audit=0.0)

    def episode(commands, memo=memo):
        return run_episode(
            task, ScriptedAgent(commands), client=docker_client, builder=builder, memo=memo
        )

    first = episode(solution)
    assert first.memo == "miss" and first.passed and starts[0] == 1
    again = episode(solution)
    assert again.memo == "hit" and starts[0] == 1 and again.start_s == 0.0
    assert _verdict(again) == _verdict(first)
    assert [t.observation for t in again.transcript] == [t.observation for t in first.transcript]

    # the same commands, then one more that undoes the work: the shared ones are replayed in
    # a container and the new one runs there; its verdict is the one a plain episode gives
    undone = solution + ["rm -f /home/user/*.tar.gz"]
    partial = episode(undone)
    assert partial.memo == "partial" and starts[0] == 2 and not partial.memo_mismatch
    plain = episode(undone, memo=None)
    assert plain.memo == "" and starts[0] == 3
    assert (partial.passed, partial.graded) == (plain.passed, plain.graded)
    assert not partial.passed
    assert memo.counts == {"miss": 1, "hit": 1, "partial": 1, "mismatch": 0}


def test_replays_and_audits_that_differ_are_counted(docker_client, builder, task, starts, no_leak):
    task, solution = task
    memo = EpisodeMemo(audit=1.0)

    def episode(commands):
        return run_episode(
            task, ScriptedAgent(commands), client=docker_client, builder=builder, memo=memo
        )

    # a command whose output differs in every container: the replay shows it
    clock = "date +%s%N"
    assert episode([clock, "echo a"]).memo == "miss"
    diverged = episode([clock, "echo b"])
    assert (diverged.memo, diverged.memo_mismatch) == ("partial", True)

    # every hit is audited (audit 1.0): replayed and verified for real, and it agrees
    solved = episode(solution)
    audited = episode(solution)
    assert (audited.memo, audited.memo_mismatch) == ("audit", False) and starts[0] == 4
    assert (audited.passed, audited.graded) == (solved.passed, solved.graded) == (True, 1.0)
    # a verdict the memo holds wrongly: the audit uses the real one and counts it
    key = (audited.image, task.task_id, "verify", tuple(solution))
    memo._put(key, type(memo._get(key))(passed=False, reward=0.0, exit_code=1, output="x"))
    caught = episode(solution)
    assert (caught.memo, caught.memo_mismatch, caught.passed) == ("audit", True, True)
    assert memo.counts["mismatch"] == 2
