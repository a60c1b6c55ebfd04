"""Update log, replay and checkpoints: any version is base weights + log, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from runner.es import ESOptimizer, UpdateRecord, load_checkpoint, read_checkpoint, save_checkpoint
from runner.models import load_tiny_model

SMALL = {"noise_block": 256, "chunk_size": 512}


def run_updates(opt: ESOptimizer, updates: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(updates):
        seeds = rng.choice(2**62, size=8, replace=False)
        opt.step(
            [
                (int(s), float(r), opt.version)
                for s, r in zip(seeds, rng.normal(size=8), strict=True)
            ]
        )


def masters(opt: ESOptimizer) -> dict[str, torch.Tensor]:
    return {n: m.clone() for n, m in opt.master_parameters()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replay_reproduces_the_master_and_the_working_weights(two_tensors, dtype):
    opt = ESOptimizer(two_tensors(dtype), **SMALL)
    run_updates(opt, 5)
    # A fresh optimizer with another chunking and two threads, fed the log as JSON dicts.
    fresh = ESOptimizer(two_tensors(dtype), noise_block=256, chunk_size=1024, threads=2)
    log = json.loads(json.dumps([r.to_dict() for r in opt.log]))
    assert fresh.replay(log) == 5
    assert_same(masters(fresh), masters(opt))
    for (n, p), (_, q) in zip(
        fresh.model.named_parameters(), opt.model.named_parameters(), strict=True
    ):
        assert torch.equal(p, q), n
    assert fresh.log == opt.log
    fresh.close()


def test_replay_catches_up_incrementally_and_rejects_a_diverged_log(two_tensors):
    opt = ESOptimizer(two_tensors(), **SMALL)
    run_updates(opt, 4)
    worker = ESOptimizer(two_tensors(), **SMALL)
    assert worker.replay(opt.log, upto=2) == 2
    assert worker.replay(opt.log) == 4
    assert_same(masters(worker), masters(opt))
    bad = [*opt.log[:2], UpdateRecord(3, ((1, 0.5),), 0.0015, 0.00075)]
    with pytest.raises(ValueError, match="diverges"):
        worker.replay(bad)
    with pytest.raises(ValueError, match="expected 1"):
        ESOptimizer(two_tensors(), **SMALL).apply(opt.log[1])


@pytest.mark.parametrize("snapshot_at", [None, 3])
def test_checkpoint_roundtrip_loads_every_version_bit_exactly(two_tensors, tmp_path, snapshot_at):
    opt = ESOptimizer(two_tensors(torch.bfloat16), staleness="drop_over:1", **SMALL)
    by_version = {0: masters(opt)}
    for v in range(1, 7):
        run_updates(opt, 1, seed=v)
        by_version[v] = masters(opt)
        if v == snapshot_at:
            save_checkpoint(opt, tmp_path, snapshot=True)
    path = save_checkpoint(opt, tmp_path, base_path="/models/base")
    doc = read_checkpoint(tmp_path)
    assert doc["version"] == 6 and len(doc["log"]) == 6
    assert doc["config"]["staleness"] == "drop_over:1"
    assert path.stat().st_size < 16_000  # kilobytes: 6 updates of 8 seeds
    assert [s["version"] for s in doc["snapshots"]] == ([3] if snapshot_at else [])
    for v in (0, 2, 3, 5, 6):
        loaded = load_checkpoint(two_tensors(torch.bfloat16), tmp_path, version=v, **SMALL)
        assert loaded.version == v and loaded.staleness.spec() == "drop_over:1"
        assert_same(masters(loaded), by_version[v])
    latest = load_checkpoint(two_tensors(torch.bfloat16), tmp_path, **SMALL)
    run_updates(latest, 1, seed=99)  # training continues identically after a resume
    run_updates(opt, 1, seed=99)
    assert_same(masters(latest), masters(opt))


def test_checkpoint_rejects_other_base_weights_and_bad_versions(two_tensors, tmp_path):
    opt = ESOptimizer(two_tensors(), **SMALL)
    run_updates(opt, 2)
    save_checkpoint(opt, tmp_path)
    with pytest.raises(ValueError, match="base-weights hash mismatch"):
        load_checkpoint(two_tensors(seed=1), tmp_path, **SMALL)
    with pytest.raises(ValueError, match="version 5 is not in the checkpoint"):
        load_checkpoint(two_tensors(), tmp_path, version=5, **SMALL)
    with pytest.raises(ValueError, match="no ES checkpoint"):
        read_checkpoint(tmp_path / "missing")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "es_checkpoint.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_checkpoint(tmp_path / "other")
    with pytest.raises(ValueError, match="hash_base=False"):
        save_checkpoint(ESOptimizer(two_tensors(), hash_base=False, **SMALL), tmp_path / "x")


def test_base_hash_is_a_content_hash(two_tensors):
    a = ESOptimizer(two_tensors(), **SMALL).base_hash
    assert a == ESOptimizer(two_tensors(), **SMALL).base_hash
    assert a != ESOptimizer(two_tensors(seed=1), **SMALL).base_hash
    assert a != ESOptimizer(two_tensors(torch.bfloat16), **SMALL).base_hash


def test_checkpoint_of_a_hf_causal_lm(tiny_model_dir, tmp_path):
    model, _ = load_tiny_model(tiny_model_dir, dtype=torch.bfloat16)
    opt = ESOptimizer(model, sigma=0.01, alpha=0.01)
    run_updates(opt, 3)
    save_checkpoint(opt, tmp_path, base_path=str(tiny_model_dir))
    again, _ = load_tiny_model(tiny_model_dir, dtype=torch.bfloat16)
    loaded = load_checkpoint(again, tmp_path)
    assert_same(masters(loaded), masters(opt))
    for (n, p), (_, q) in zip(again.named_parameters(), model.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_snapshots_of_an_abandoned_branch_are_not_reused(two_tensors, tmp_path):
    opt = ESOptimizer(two_tensors(), **SMALL)
    run_updates(opt, 3, seed=1)
    save_checkpoint(opt, tmp_path, snapshot=True)  # snapshot at v3 of branch A
    resumed = load_checkpoint(two_tensors(), tmp_path, version=2, **SMALL)
    run_updates(resumed, 2, seed=2)  # branch B: v3, v4 differ from A's v3
    save_checkpoint(resumed, tmp_path)
    assert read_checkpoint(tmp_path)["snapshots"] == []
    reloaded = load_checkpoint(two_tensors(), tmp_path, version=4, **SMALL)
    assert_same(masters(reloaded), masters(resumed))


def test_params_restricts_es_to_matching_parameters_and_checkpoints_it(tiny_model_dir, tmp_path):
    """``params`` (a regex over parameter names): only matching parameters are perturbed and
    updated, the checkpoint records the pattern, and loading replays onto the same subset."""
    model, _ = load_tiny_model(tiny_model_dir)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = ESOptimizer(model, sigma=0.05, alpha=0.05, params=r"norm", **SMALL)
    names = [n for n, _ in opt.master_parameters()]
    assert names and all("norm" in n for n in names)
    assert (
        opt.num_parameters
        == sum(base[n].numel() for n in names)
        < sum(t.numel() for t in base.values())
    )
    run_updates(opt, 2)
    for name, p in model.named_parameters():
        moved = not torch.equal(p.detach(), base[name])
        assert moved == ("norm" in name), name
    save_checkpoint(opt, tmp_path)
    assert read_checkpoint(tmp_path)["config"]["params"] == "norm"
    fresh, _ = load_tiny_model(tiny_model_dir)
    again = load_checkpoint(fresh, tmp_path)
    assert again.params == "norm"
    assert_same(masters(opt), masters(again))
    for (name, a), b in zip(model.named_parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_params_that_match_nothing_or_do_not_compile_are_refused(two_tensors):
    with pytest.raises(ValueError, match="matches no parameter"):
        ESOptimizer(two_tensors(), params="no_such_layer")
    with pytest.raises(ValueError, match="not a regular expression"):
        ESOptimizer(two_tensors(), params="(")
    with pytest.raises(ValueError, match="not both"):
        ESOptimizer(two_tensors(), params="w", include=lambda n, p: True)
