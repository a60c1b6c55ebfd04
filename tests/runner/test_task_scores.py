"""Tasks with signal (issue 39): each task's probability of its reference episode
(runner/models/task_scores.py), ``tasks.signal`` and ``common_random_numbers: pair``.

Expected values come from a plain forward pass per turn (no packing, no padding, float64
log-softmax), from a hand-made model whose probabilities are known in closed form, and
from the dispatch events alone (no containers)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import BROKEN_LOAD
from test_run_state import fake_run

from runner import cli as runner_cli
from runner.config import validate_run
from runner.errors import UserError
from runner.models.demonstrations import demonstration
from runner.models.rendering import turn_examples
from runner.models.task_scores import (
    SCORES_FILE,
    Scoring,
    in_band,
    load_split,
    score_tasks,
    signal_task_ids,
)
from runner.seeds import derive_seed
from runner.task_pool import TaskPool
from runner.terminal.task import ImageRecipe, Task

BUDGET = 4096 - 160  # the tiny model's positions: no prompt of the generated tasks is cut


@pytest.fixture(scope="module")
def tiny(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def tasks(task_dir):
    loaded, failed = load_split(task_dir, "train")
    assert [f.split(":")[0] for f in failed] == [BROKEN_LOAD]
    return loaded[:4]


def turns_of(tokenizer, task, budget=BUDGET):
    return turn_examples(tokenizer, demonstration(task), budget)


@pytest.fixture(scope="module")
def plain(tiny, tasks):
    """Per task, per turn: (float64 logits of a plain forward pass over prompt + target
    alone, where the prompt ends, the target)."""
    model, tokenizer = tiny
    out = []
    for task in tasks:
        turns = []
        for prompt, target in turns_of(tokenizer, task):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + target])).logits[0].double()
            turns.append((logits, len(prompt), target))
        out.append(turns)
    return out


def plain_log_p(turns, temperature, count_end):
    """Sum of log p(reply token | everything before it), one turn at a time."""
    total = 0.0
    for logits, start, target in turns:
        reply = target if count_end else target[:-1]  # target ends with the end of turn
        logp = torch.log_softmax(logits / temperature, dim=-1)
        total += sum(float(logp[start + k - 1, t]) for k, t in enumerate(reply))
    return total


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_log_p_is_the_plain_forward_passes_sum(tiny, tasks, plain, temperature):
    model, tokenizer = tiny
    how = Scoring(temperature, context_tokens=4096, max_new_tokens=160)
    expected = [plain_log_p(turns, temperature, count_end=False) for turns in plain]
    for batch_tokens in (1, 8192):  # one sequence a pass; padded batches
        got = score_tasks(model, tokenizer, tasks, how, batch_tokens=batch_tokens)
        assert list(got["task"]) == [t.task_id for t in tasks]
        assert got["log_p"].to_numpy() == pytest.approx(expected, rel=1e-5, abs=1e-3)
        assert np.allclose(got["p"], np.exp(got["log_p"]))
    # without stop strings a reply ends only when the model samples its end of turn
    no_stop = Scoring(temperature, context_tokens=4096, max_new_tokens=160, stop=())
    got = score_tasks(model, tokenizer, tasks, no_stop)
    expected = [plain_log_p(turns, temperature, count_end=True) for turns in plain]
    assert got["log_p"].to_numpy() == pytest.approx(expected, rel=1e-5, abs=1e-3)


class Oracle(torch.nn.Module):
    """Logit ``a`` on the sequence's next token, 0 on the others: at temperature T a
    target token has p = e^(a/T) / (e^(a/T) + V - 1)."""

    def __init__(self, vocab: int, a: float) -> None:
        super().__init__()
        self.vocab, self.a = vocab, a
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # a device for the scorer

    def forward(self, input_ids, attention_mask=None):
        following = torch.roll(input_ids, -1, dims=1)
        return SimpleNamespace(logits=self.a * torch.nn.functional.one_hot(following, self.vocab))


def test_temperature_and_top_p_as_theory_says(tiny, tasks, plain):
    _, tokenizer = tiny
    vocab, a = 512, 3.0
    oracle = Oracle(vocab, a)
    # the tokens a rollout samples: each reply without its end of turn (stops end them)
    n = np.array([sum(len(t) - 1 for _, t in turns_of(tokenizer, task)) for task in tasks])
    for temperature in (0.25, 0.6, 1.0, 4.0):
        got = score_tasks(oracle, tokenizer, tasks, Scoring(temperature))
        per_token = a / temperature - math.log(math.exp(a / temperature) + vocab - 1)
        assert got["log_p"].to_numpy() == pytest.approx(n * per_token, rel=1e-5, abs=1e-3)
        assert list(got["tokens"]) == list(n)
    # T -> infinity: uniform over the vocabulary; T = 0: greedy, every token the argmax
    flat = score_tasks(oracle, tokenizer, tasks, Scoring(1e6))
    assert flat["log_p"].to_numpy() == pytest.approx(-n * math.log(vocab), rel=1e-4)
    assert list(score_tasks(oracle, tokenizer, tasks, Scoring(0.0))["p"]) == [1.0] * len(tasks)
    # top-p below the target's probability keeps the target alone: p = 1
    top = math.exp(a) / (math.exp(a) + vocab - 1)  # at T = 1: 0.038
    got = score_tasks(oracle, tokenizer, tasks, Scoring(1.0, top_p=top * 0.9))
    assert list(got["p"]) == [1.0] * len(tasks)
    # the real model at T = 0: the greedy indicator of the same forward passes
    model, _ = tiny
    greedy = score_tasks(model, tokenizer, tasks, Scoring(0.0, context_tokens=4096))
    for turns, log_p in zip(plain, greedy["log_p"], strict=True):
        hits = [
            int(logits[start + k - 1].argmax()) == t
            for logits, start, target in turns
            for k, t in enumerate(target[:-1])
        ]
        assert log_p == (0.0 if all(hits) else -np.inf)


def test_a_reply_longer_than_max_new_tokens_cannot_happen(tiny, tasks):
    _, tokenizer = tiny
    task = tasks[0]
    longest = max(len(t) - 1 for _, t in turns_of(tokenizer, task, 4096 - 300))
    oracle = Oracle(512, 3.0)
    fits = score_tasks(
        oracle, tokenizer, [task], Scoring(1.0, context_tokens=4096, max_new_tokens=longest)
    )
    cut = score_tasks(
        oracle, tokenizer, [task], Scoring(1.0, context_tokens=4096, max_new_tokens=longest - 1)
    )
    assert np.isfinite(fits["log_p"][0]) and cut["log_p"][0] == -np.inf and cut["p"][0] == 0.0


def test_the_band_keeps_exactly_the_tasks_inside_it():
    scores = pd.DataFrame({"task": list("abcdefg"),
                           "p": [0.0999, 0.1, 0.5, 0.9, 0.9001, np.nan, 0.0]})  # fmt: skip
    assert list(scores["task"][in_band(scores, 0.1, 0.9)]) == ["b", "c", "d"]
    assert list(scores["task"][in_band(scores, 0.0, 0.1)]) == ["a", "b", "g"]


def signal_config(task_dir, tiny_model, band, d=2):
    return validate_run({
        "workers": 1, "cohort": 2, "updates": 1, "policy": {"kind": "sync"},
        "model": {"path": str(tiny_model)}, "episodes_per_job": d, "concurrency": 1,
        "tasks": {"dir": str(task_dir), "split": "train", "signal": band},
        "sampling": {"temperature": 1.0, "max_new_tokens": 160}, "context_tokens": 4096,
    })  # fmt: skip


def test_a_run_scores_its_split_once_and_keeps_the_band(tmp_path, tiny_model, task_dir):
    from runner.run_dir import RunDir

    # the random tiny model's p are tiny; the band from their median up keeps about half
    probe = RunDir.create(tmp_path / "probe", signal_config(task_dir, tiny_model, {"min": 0.0}))
    everything = signal_task_ids(probe, probe.config(), task_dir)
    scores = pd.read_parquet(probe / SCORES_FILE)
    loaded = [t.task_id for t in load_split(task_dir, "train")[0]]
    assert sorted(everything) == sorted(scores["task"]) == sorted(loaded)
    low = float(scores["p"].median())
    config = signal_config(task_dir, tiny_model, {"min": low, "max": 1.0})
    run = RunDir.create(tmp_path / "run", config)
    kept = signal_task_ids(run, config, task_dir)
    stored = pd.read_parquet(run / SCORES_FILE)
    assert np.array_equal(stored["log_p"], scores["log_p"])  # the same scores, run again
    expected = set(stored["task"][(stored["p"] >= low) & (stored["p"] <= 1.0)])
    assert set(kept) == expected == set(stored["task"][stored["in_band"]])
    assert 0 < len(kept) < len(stored)
    # a resumed run reads its scores back, never scores again
    stored["in_band"] = stored["task"].isin(loaded[:3])
    stored.to_parquet(run / SCORES_FILE, index=False)
    assert signal_task_ids(run, config, task_dir) == loaded[:3]
    # fewer in-band tasks than a job's episodes: one line naming the key
    narrow = signal_config(task_dir, tiny_model, {"min": 0.1, "max": 0.9})
    with pytest.raises(UserError) as err:
        signal_task_ids(RunDir.create(tmp_path / "narrow", narrow), narrow, task_dir)
    assert str(err.value).startswith("tasks.signal: 0 of the") and "\n" not in str(err.value)


def test_the_pool_builds_only_the_kept_tasks(engine, task_dir):
    from runner.terminal.images import ImageBuilder

    ids = [t.task_id for t in load_split(task_dir, "train")[0]]
    kept = [ids[3], ids[0]]
    pool = TaskPool.prepare(task_dir, "train", ImageBuilder(engine), only=kept)
    assert sorted(pool.by_id) == sorted(kept) and not pool.skipped


def es_runner(capsys, *args: str) -> tuple[int, str, str]:
    """``es-runner ARGS`` in this process: (exit status, stdout, stderr)."""
    code = runner_cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_tasks_score_command(capsys, tmp_path, tiny_model, task_dir):
    out = tmp_path / "scores.csv"
    code, stdout, stderr = es_runner(
        capsys, "tasks", "score", "--model", tiny_model, "--tasks", task_dir, "--split", "train",
        "--temperature", "1", "--context-tokens", "4096", "--out", out, "--no-progress",
    )  # fmt: skip
    assert code == 0, stderr
    rows = pd.read_csv(out)
    assert list(rows.columns[:4]) == ["task", "category", "log_p", "p"]
    assert len(rows) == len(load_split(task_dir, "train")[0])
    assert "1 task(s) not loaded" in stdout and "\nall " in stdout
    code, _, stderr = es_runner(
        capsys, "tasks", "score", "--model", tiny_model, "--tasks", task_dir, "--band", "0.9", "0.1"
    )
    assert code == 2 and stderr.strip().count("\n") == 0 and "--band" in stderr


@pytest.mark.parametrize(
    ("override", "key"),
    [({"signal": {"min": 0.9, "max": 0.1}}, "tasks.signal"),
     ({"signal": {"min": 1.5}}, "tasks.signal.min"),
     ({"common_random_numbers": "pair"}, "common_random_numbers")],
)  # fmt: skip
def test_a_bad_setting_is_one_line_naming_the_key(capsys, run_config, override, key):
    import yaml

    path = run_config()
    data = yaml.safe_load(path.read_text())
    if "signal" in override:
        data["tasks"]["signal"] = override["signal"]
    else:
        data.update(override, es={**data["es"], "antithetic": False})
    path.write_text(yaml.safe_dump(data))
    code, _, stderr = es_runner(capsys, "train", path, "--no-progress")
    assert code == 2
    assert stderr.strip().count("\n") == 0 and f"{key}: " in stderr, stderr


# -- common_random_numbers: pair --------------------------------------------------------

BASE = {
    "name": "t", "seed": 3, "cohort": 16, "updates": 4, "es": {"antithetic": True},
    "model": {"backend": "hf", "path": "m"}, "tasks": {"dir": "t"},
    "episodes_per_job": 4, "concurrency": 4,
}  # fmt: skip


def dispatches(crn, **over):
    cfg = validate_run({**BASE, "common_random_numbers": crn, **over})
    _, events = fake_run(cfg)
    return [e for e in events if e["e"] == "dispatch"]


def fake_pool(n):
    recipe = ImageRecipe()
    return TaskPool([Task(f"t{i:03d}", Path("."), "native", "", recipe) for i in range(n)], [])


@pytest.mark.parametrize(
    "policy", [{"kind": "sync"}, {"kind": "bounded", "max_lag": 1, "on_stale": "drop"}]
)
def test_pair_gives_each_pair_its_own_tasks(policy):
    events = dispatches("pair", policy=policy, workers=16 if policy["kind"] == "sync" else 5)
    pairs: dict[int, list[dict]] = {}
    for ev in events:
        pairs.setdefault(ev["job"] // 2, []).append(ev)
    whole = [p for p in pairs.values() if len(p) == 2]
    assert len(whole) >= 20
    for a, b in whole:  # the pair: one perturbation, mirrored, on the same tasks and seeds
        assert (a["seed"], a["task_seed"], a["sampling_seed"]) == (
            b["seed"], b["task_seed"], b["sampling_seed"])  # fmt: skip
        assert {a["sign"], b["sign"]} == {1, -1}
    task_seeds = [p[0]["task_seed"] for p in pairs.values()]
    sampling_seeds = [p[0]["sampling_seed"] for p in pairs.values()]
    assert len(set(task_seeds)) == len(pairs) == len(set(sampling_seeds))


def test_pair_has_more_distinct_tasks_per_update_and_true_is_unchanged():
    pool = fake_pool(300)
    for crn, distinct in (("pair", range(8, 33)), (True, [4]), (False, range(8, 65))):
        events = dispatches(crn, policy={"kind": "sync"}, workers=16)
        for version in range(BASE["updates"]):
            batches = [pool.batch(e["task_seed"], 4) for e in events if e["version"] == version]
            assert len({t.task_id for b in batches for t in b}) in distinct
    for ev in dispatches(True, policy={"kind": "sync"}, workers=16):  # as published
        assert ev["task_seed"] == derive_seed(3, "tasks", "version", ev["version"])
        assert ev["sampling_seed"] == derive_seed(3, "sampling", "version", ev["version"])
