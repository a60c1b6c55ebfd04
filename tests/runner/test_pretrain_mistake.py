"""The ``mistake`` habit in real containers: for one generated task of every category that
has a mistake, the mistaken solution prints nothing and exits 0 at every command (so its
demonstration's silent record is true) and fails the task's checks, with some partial
checks still passing, while the reference solution passes."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def one_per_category(tmp_path_factory):
    from runner.terminal.generator.categories import CATEGORIES
    from runner.terminal.generator.writer import write_tasks
    from runner.terminal.loaders import load_task

    out = tmp_path_factory.mktemp("mistake_tasks")
    tasks = [load_task(p) for p in write_tasks(out, len(CATEGORIES), seed=11)]
    assert sorted(t.category for t in tasks) == sorted(CATEGORIES)  # categories in rotation
    return tasks


def test_each_mistake_is_silent_and_fails_where_the_reference_passes(one_per_category, engine):
    from runner.models.demonstrations import (
        demonstration,
        habit_commands,
        solution_commands,
        transcript_messages,
    )
    from runner.models.mistakes import MISTAKES
    from runner.terminal.episode import EpisodeConfig, run_episodes
    from runner.terminal.images import ImageBuilder
    from runner.terminal.protocol import ScriptedAgent

    tasks = [t for t in one_per_category if habit_commands(t, "mistake") is not None]
    assert sorted(t.category for t in tasks) == sorted(MISTAKES)
    assert {t.category for t in one_per_category} - set(MISTAKES) == {"text_search"}
    jobs = [(t, ScriptedAgent(solution_commands(t))) for t in tasks]
    jobs += [(t, ScriptedAgent(habit_commands(t, "mistake"))) for t in tasks]
    records = run_episodes(
        jobs,
        concurrency=4,
        config=EpisodeConfig(max_turns=8),
        client=engine,
        builder=ImageBuilder(engine),
    )
    reference, mistaken = records[: len(tasks)], records[len(tasks) :]
    for task, ref, bad in zip(tasks, reference, mistaken, strict=True):
        name = task.category
        assert ref.error is None and bad.error is None, (name, ref.error, bad.error)
        assert ref.passed and ref.graded == 1.0, (name, ref.verifier_output[-1500:])
        # every command printed nothing and exited 0: the conversation is the demonstration
        assert transcript_messages(task, bad) == demonstration(task, habit="mistake"), name
        assert [turn.exit_code for turn in bad.transcript[:-1]] == [0] * (len(bad.transcript) - 1)
        assert not bad.passed, (name, bad.verifier_output[-1500:])
        assert 0.0 < bad.graded < 1.0, (name, bad.graded)
