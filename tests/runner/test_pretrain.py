"""The warm start (``es-runner model pretrain``): its data, its rendering, and its effect.

The learning test trains a small model for a few hundred steps on one task category,
then plays real episodes in containers: the warm start must lower the loss, solve a
held-out task that the random model fails; a cohort of perturbations of it must score
unequally, so ES takes a non-zero step.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.runner.conftest import WARM_CATEGORIES as CATEGORIES
from tests.runner.conftest import cli

pytestmark = pytest.mark.docker


# -- data and rendering (no container) -------------------------------------------------------


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from runner.terminal.generator.writer import write_tasks

    out = tmp_path_factory.mktemp("pretrain_tasks")
    write_tasks(out, 42, seed=3)
    return out


def test_demonstration_is_the_episode_loops_conversation(generated):
    """Opening, one command per turn with its observation, then done: what an episode sees."""
    from runner.models.pretrain import demonstration, solution_commands
    from runner.terminal.loaders import load_task
    from runner.terminal.protocol import SYSTEM_PROMPT, observation, parse_action

    task = load_task(generated / (generated / "train.txt").read_text().split()[0])
    commands = solution_commands(task)
    messages = demonstration(task, [(f"out{i}", i) for i in range(len(commands))])
    assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert task.instruction in messages[1]["content"]
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    assert [parse_action(r).command for r in replies[:-1]] == commands
    assert parse_action(replies[-1]).kind == "done"
    observations = [m["content"] for m in messages[2:] if m["role"] == "user"]
    assert observations == [observation(f"out{i}", i) for i in range(len(commands))]


def test_examples_hold_the_prompts_the_backend_renders(generated, tiny_model):
    """Each assistant turn is learned after exactly the prompt the hf backend would build,
    with the rolling-context cut, and only assistant tokens (and the end of turn) have mask 1."""
    from transformers import AutoTokenizer

    from runner.backends.context import fit_prompt
    from runner.models.pretrain import conversation_examples, demonstration
    from runner.terminal.loaders import load_task

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    names = (generated / "train.txt").read_text().split()
    task = max((load_task(generated / n) for n in names), key=lambda t: len(t.instruction))
    messages = demonstration(task)
    full = len(fit_prompt(tokenizer, messages[:-1], 10**6)[0])
    for budget, expect_cut in ((10**6, False), (full - 40, True)):
        examples = conversation_examples(tokenizer, messages, budget + 50, 50)
        flat = [(e.ids, e.mask) for e in examples]
        turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        cut = False
        for k in turns:
            prompt, was_cut = fit_prompt(tokenizer, messages[:k], budget)
            cut |= was_cut
            target = tokenizer.encode(messages[k]["content"], add_special_tokens=False)
            target.append(tokenizer.eos_token_id)
            hits = [
                (ids, mask)
                for ids, mask in flat
                for s in range(len(ids) - len(prompt) - len(target) + 1)
                if ids[s : s + len(prompt) + len(target)] == prompt + target
                and set(mask[s + len(prompt) : s + len(prompt) + len(target)]) == {1}
                and set(mask[s : s + len(prompt)]) <= {0, 1}
            ]
            assert hits, f"turn {k} is not learned after its rollout prompt (budget {budget})"
        assert cut == expect_cut
        learned = sum(sum(m) for _, m in flat)
        replies = sum(
            len(tokenizer.encode(messages[k]["content"], add_special_tokens=False)) + 1
            for k in turns
        )
        assert learned == replies


def test_recorded_observations_match_the_sandbox(generated, engine):
    """The default record (every reference command prints nothing, exit 0) is what the
    solutions really print in their containers, and every one passes its verifier."""
    from runner.models.pretrain import demonstration, load_train_tasks, sandbox_demonstrations
    from runner.terminal.images import ImageBuilder

    tasks, skipped = load_train_tasks(generated)
    assert not skipped
    by_category = {}
    for t in tasks:
        by_category.setdefault(t.category, t)
    sample = list(by_category.values())[:6]
    good, bad = sandbox_demonstrations(sample, client=engine, builder=ImageBuilder(engine))
    assert not bad
    for t in sample:
        assert good[t.task_id] == demonstration(t), t.task_id


# -- the warm start and what it does (containers) ---------------------------------------------


def evaluate(model, tasks, tmp_path, name):
    out = tmp_path / f"{name}.parquet"
    done = cli(
        "eval", "--model", str(model), "--tasks", str(tasks), "--split", "test",
        "--temperature", "0", "--max-turns", "4", "--max-new-tokens", "96",
        "--context-tokens", "640", "--concurrency", "4", "--json", "--out", str(out),
        "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), pd.read_parquet(out)


def test_warm_start_lowers_the_loss_and_solves_held_out_tasks(warm, tiny_model, engine, tmp_path):
    model, meta = warm
    result = meta["result"]
    assert result["last_loss_mean"] < result["first_loss"] / 5
    assert meta["data"]["split"] == "train"
    tasks = model / "tasks"
    test_ids = set((tasks / "test.txt").read_text().split())
    assert test_ids and not test_ids & set(meta["data"]["train_task_ids"])

    summary, rows = evaluate(model, tasks, tmp_path, "warm")
    _, random_rows = evaluate(tiny_model, tasks, tmp_path, "random")
    assert set(summary["per_category"]) == set(CATEGORIES)
    assert summary["seen_in_training"] == 0
    solved = set(rows.loc[rows["passed"], "task"])
    failed_by_random = set(random_rows.loc[~random_rows["passed"], "task"])
    assert solved & failed_by_random, (summary, rows[["task", "reward", "turns", "error"]])
    assert summary["success"] == pytest.approx(rows["reward"].mean())


def test_es_from_the_warm_start_sees_unequal_rewards_and_steps(warm, engine, run_config, tmp_path):
    """One ES update from the warm start on its train split: the cohort's rewards differ
    (the random model's are all 0), so the update's coefficients are non-zero and replaying
    the checkpoint moves the weights. Greedy decoding: this small model's successes do not
    survive sampling at temperature 0.3 (all 8 members scored 0), and sigma 0.03 breaks it
    (all 0 too); at sigma 0.01 members differ (measured: 0, 0.25 and 0.5 in one cohort)."""
    from transformers import AutoModelForCausalLM

    from runner.es.checkpoint import load_checkpoint

    model, _ = warm
    config = run_config(
        **{
            "model.path": str(model),
            "tasks.dir": str(model / "tasks"),
            "tasks.split": "train",
            "cohort": 8,
            "updates": 1,
            "episodes_per_job": 4,
            "concurrency": 4,
            "max_turns": 4,
            "sampling.max_new_tokens": 96,
            "sampling.temperature": 0.0,
            "context_tokens": 640,
            "policy": {"kind": "sync"},
            "es": {"sigma": 0.01, "alpha": 0.01, "shaping": "zscore", "antithetic": True},
        }
    )
    out = tmp_path / "es"
    done = cli("train", str(config), "--out", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = pd.read_parquet(out / "jobs.parquet")
    rewards = jobs.loc[jobs["verdict"] == "accepted", "reward"]
    assert len(rewards) == 8 and rewards.nunique() > 1, jobs[["job_id", "sign", "reward"]]
    update = pd.read_parquet(out / "updates.parquet").iloc[0]
    assert not update["zero_update"] and update["reward_std"] > 0

    base = AutoModelForCausalLM.from_pretrained(model)
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    opt = load_checkpoint(base, out / "checkpoint")
    assert opt.version == 1
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in base.named_parameters())
    assert moved > 1e-4
