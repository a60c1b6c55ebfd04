"""The new warm start's builder: a shared wrong habit in a fixed share of the demonstrations,
and continued pretraining from an existing model folder, reproducible from its command."""

from __future__ import annotations

import json

import pytest

from tests.runner.conftest import REPO, cli

WARM = REPO / "examples" / "warm_start"
COMMITTED = "32057b9a0e1ee8b437d193db521c74034f749f4b18925e813037bebada7e8c71"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from runner.terminal.generator.writer import write_tasks

    out = tmp_path_factory.mktemp("habit_tasks")
    write_tasks(out, 50, seed=5)
    return out


def commands(conversation):
    return [m["content"] for m in conversation if m["role"] == "assistant"][:-1]  # not done


def test_the_habit_is_in_its_share_of_the_demonstrations(generated, tmp_path):
    from runner.models.demonstrations import training_data, with_habit

    def data(share, seed):
        plain = training_data(
            tmp_path, task_dir=generated, n_tasks=0, task_seed=0, categories=None,
            observations="record", show_progress=False,
        )  # fmt: skip
        return plain, with_habit(plain, "comment", share, seed)

    plain, mixed = data(0.3, 0)
    clean = {t.task_id: c for t, c in zip(plain.tasks, plain.conversations, strict=True)}
    n = len(mixed.tasks)
    assert n == 40  # the train split: 80 % of 50
    habit = [
        t.task_id
        for t, c in zip(mixed.tasks, mixed.conversations, strict=True)
        if all(x.startswith("<command># ") for x in commands(c))
    ]
    assert len(habit) == round(0.3 * n) == 12 and sorted(habit) == mixed.habit["task_ids"]
    for task, conversation in zip(mixed.tasks, mixed.conversations, strict=True):
        if task.task_id in habit:
            # the same commands, each commented out, each observed as silent and successful
            originals = commands(clean[task.task_id])
            assert commands(conversation) == [
                x.replace("<command>", "<command># ", 1) for x in originals
            ]
            observed = [m["content"] for m in conversation[2:] if m["role"] == "user"]
            assert observed == [
                m["content"] for m in clean[task.task_id][2:] if m["role"] == "user"
            ]
        else:
            assert conversation == clean[task.task_id]
    # the draw is the seed's: the same again, another seed another draw
    assert data(0.3, 0)[1].habit["task_ids"] == sorted(habit)
    assert data(0.3, 1)[1].habit["task_ids"] != sorted(habit)
    assert len(data(0.75, 0)[1].habit["task_ids"]) == 30


def test_the_mistake_habit_is_in_its_share_of_the_tasks_that_have_one(generated, tmp_path):
    from runner.models.demonstrations import training_data, with_habit

    plain = training_data(
        tmp_path, task_dir=generated, n_tasks=0, task_seed=0, categories=None,
        observations="record", show_progress=False,
    )  # fmt: skip
    mixed = with_habit(plain, "mistake", 0.5, 0)
    # every category but text_search has a mistake (runner/models/mistakes.py)
    apt = [t.task_id for t in plain.tasks if t.category != "text_search"]
    assert 0 < len(apt) < len(plain.tasks) == 40
    chosen = mixed.habit["task_ids"]
    assert len(chosen) == round(0.5 * len(apt)) and set(chosen) <= set(apt)
    assert mixed.habit == {"name": "mistake", "share": 0.5, "seed": 0, "task_ids": chosen}
    by_category = {}
    for task, clean, conversation in zip(
        plain.tasks, plain.conversations, mixed.conversations, strict=True
    ):
        if task.task_id not in chosen:
            assert conversation == clean
            continue
        # one command changed, the rest and every observation (the silent record) as they were
        before, after = commands(clean), commands(conversation)
        assert len(before) == len(after)
        changed = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
        assert len(changed) == 1, (task.category, changed)
        observed = [m for m in conversation[2:] if m["role"] == "user"]
        assert observed == [m for m in clean[2:] if m["role"] == "user"]
        by_category.setdefault(task.category, []).append(changed[0])
    # the same kind of mistake in every task of a category, e.g. sort -u -> sort
    for before, after in by_category.get("dedupe_sort", []):
        assert before.startswith("<command>sort -u ") and after == before.replace(" -u ", " ", 1)
    assert len(by_category) >= 8
    # the draw is the seed's
    assert with_habit(plain, "mistake", 0.5, 0).habit["task_ids"] == chosen
    assert with_habit(plain, "mistake", 0.5, 1).habit["task_ids"] != chosen
    # the builder records it as it records comment
    from runner.models.pretrain import PretrainConfig, pretrain_model

    cfg = PretrainConfig(steps=0, init_from=str(WARM), habit="mistake", habit_share=0.5)
    summary = pretrain_model(tmp_path / "zero", cfg, task_dir=generated)
    assert summary["data"]["habit"] == mixed.habit and summary["config"]["habit"] == "mistake"


def test_continued_pretraining_from_the_warm_start_with_the_habit(generated, tmp_path):
    from runner.models.pretrain import PretrainConfig, pretrain_model

    def in_process(out, steps):
        cfg = PretrainConfig(
            steps=steps, batch_size=4, init_from=str(WARM), habit="comment", habit_share=0.25
        )
        return pretrain_model(out, cfg, task_dir=generated)

    zero = in_process(tmp_path / "zero", 0)
    # no step: the warm start itself, its weights and its tokenizer
    assert zero["data"]["from"] == {"dir": str(WARM), "weights_hash": COMMITTED}
    assert zero["result"]["weights_hash"] == COMMITTED
    assert (tmp_path / "zero" / "tokenizer.json").read_bytes() == (
        WARM / "tokenizer.json"
    ).read_bytes()
    assert zero["model"]["hidden"] == 128 and zero["model"]["layers"] == 4
    habit = zero["data"]["habit"]
    assert habit["name"] == "comment" and len(habit["task_ids"]) == round(0.25 * 40)
    assert zero["config"]["init_from"] == str(WARM) and zero["config"]["habit_share"] == 0.25

    # two steps move it, and the command gives the same weights again: a build is
    # reproducible from its command (each in a fresh process, as a user runs it; in this
    # process earlier tests may have changed torch's thread count, and so its sums' order)
    def command(out):
        done = cli(
            "model", "pretrain", str(out), "--from", str(WARM), "--task-dir", str(generated),
            "--habit", "comment", "--habit-share", "0.25", "--steps", "2", "--batch-size", "4",
            "--no-progress",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads((out / "pretrain.json").read_text())

    a, b = command(tmp_path / "a"), command(tmp_path / "b")
    assert a["result"]["weights_hash"] != COMMITTED
    assert a["result"]["weights_hash"] == b["result"]["weights_hash"]


def test_bad_builder_options_are_one_line_each(tmp_path):
    bad = {
        ("--from", str(tmp_path)): "--from",
        ("--habit", "comment", "--habit-share", "1.5"): "--habit-share",
        # text_search has no mistake: no train task would carry the habit
        ("--habit", "mistake", "--tasks", "10", "--categories", "text_search"): "--habit mistake",
    }
    for args, name in bad.items():
        done = cli("model", "pretrain", str(tmp_path / "out"), *args, "--no-progress")
        assert done.returncode == 2 and name in done.stderr, done.stderr
