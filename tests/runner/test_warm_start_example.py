"""The committed warm starts: where `model pretrain` writes them, that a build is
reproducible, and that every example learning run's checkpoint replays onto its warm start."""

from __future__ import annotations

import hashlib
import json

import yaml
from conftest import REPO

from runner.cli import build_parser

WARM = REPO / "examples" / "warm_start"
HABIT = REPO / "examples" / "warm_start_habit"
# the schedule table's runs (scripts/learn_on_laptop.sh): <schedule>_s<seed>
LEARN = sorted((REPO / "examples" / "runs" / "learn").glob("*_s[0-9]*"))


def test_pretrain_writes_where_the_examples_and_cpu_learn_expect_it():
    # the default output is the committed warm start; the habit one continues from it
    args = build_parser().parse_args(["model", "pretrain"])
    assert (REPO / args.out).resolve() == WARM
    habit = json.loads((HABIT / "pretrain.json").read_text())["config"]
    assert (habit["init_from"], habit["habit"], habit["habit_share"]) == (
        "examples/warm_start",
        "comment",
        0.5,
    )
    learn = yaml.safe_load((REPO / "configs/runner/cpu_learn.yaml").read_text())
    named = {learn["model"]["path"]} | {
        yaml.safe_load((run / "config.yaml").read_text())["model"]["path"] for run in LEARN
    }
    assert named == {"examples/warm_start_habit"}


def test_a_pretrain_rebuilds_bit_for_bit(tmp_path):
    from runner.models.pretrain import PretrainConfig, pretrain_model

    cfg = PretrainConfig(steps=3, batch_size=4, vocab_size=320, hidden_size=32, num_layers=1,
                         num_heads=1, num_kv_heads=1, intermediate_size=64, context_tokens=640,
                         max_new_tokens=96)  # fmt: skip
    digests = []
    for name in ("a", "b"):
        pretrain_model(tmp_path / name, cfg, n_tasks=20, categories=["find_files"])
        digests.append([
            hashlib.sha256((tmp_path / name / f).read_bytes()).hexdigest()
            for f in ("model.safetensors", "tokenizer.json")
        ])  # fmt: skip
    assert digests[0] == digests[1]


# The committed warm start's weights (runner.es weights hash), rebuilt 2026-12-04 with the
# documented settings; the habit warm start continues from it.
COMMITTED = "32057b9a0e1ee8b437d193db521c74034f749f4b18925e813037bebada7e8c71"


def test_the_committed_warm_start():
    from runner.backends.hf import load_model
    from runner.es import ESOptimizer

    model, _ = load_model(WARM)
    opt = ESOptimizer(model)
    assert opt.base_hash == COMMITTED
    opt.close()


HABIT_HASH = "01499da0ae95d425f6a679a5a5dd2be327002f16064adc746821e82f6b237455"  # pretrain.json


def test_the_habit_warm_start_and_its_example_checkpoints():
    assert json.loads((HABIT / "pretrain.json").read_text())["result"]["weights_hash"] == (
        HABIT_HASH
    )
    assert len(LEARN) >= 3
    _weights_and_runs(HABIT, HABIT_HASH, LEARN)


def _weights_and_runs(base, weights_hash: str, runs) -> None:
    """The warm start's weights hash is ``weights_hash``, and every run's final ES checkpoint
    replays onto it (version 30)."""
    from runner.backends.hf import load_model
    from runner.es import ESOptimizer, load_checkpoint, read_checkpoint

    opt = ESOptimizer(load_model(base)[0])
    assert opt.base_hash == weights_hash
    opt.close()
    for run in runs:
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert REPO / config["model"]["path"] == base
        doc = read_checkpoint(run / "checkpoint")
        # load_checkpoint refuses a base whose hash (over the searched es.params) differs
        replayed = load_checkpoint(load_model(base)[0], run / "checkpoint")
        assert replayed.version == doc["version"] == 30
        replayed.close()


MISTAKE = REPO / "examples" / "warm_start_mistake"
MISTAKE_HASH = "a98863f782276450592b2288dfed489f8785e80c0763c3cffc8460c38b1c64c9"  # pretrain.json


# ES from it under sync (scripts/learn_on_laptop.sh with MODEL=examples/warm_start_mistake)
LEARN_MISTAKE = sorted((REPO / "examples" / "runs" / "learn_mistake").glob("sync_s[0-9]*"))


def test_the_mistake_warm_start_and_its_example_checkpoints():
    record = json.loads((MISTAKE / "pretrain.json").read_text())
    assert record["result"]["weights_hash"] == MISTAKE_HASH
    assert (record["config"]["init_from"], record["config"]["habit"]) == (
        "examples/warm_start",
        "mistake",
    )
    assert len(LEARN_MISTAKE) >= 3
    _weights_and_runs(MISTAKE, MISTAKE_HASH, LEARN_MISTAKE)
