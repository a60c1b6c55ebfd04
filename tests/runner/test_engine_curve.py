"""benchmarks/engine_curve.py: its fit recovers a known engine from turns timed as that
engine would run them (sessions that start together with equal turns end together, so
each turn saw the whole batch and the batch's whole context)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_benchmark

from staleness_sim.durations.engine_model import Engine, EngineSpec

engine_curve = load_benchmark("engine_curve")

A, S, K = 0.004, 0.0015, 3e-6  # s at batch 1, s per extra sequence, s per token held


def timed_turns(batches=(1, 2, 4, 8), turns=3, prompt=350, growth=150, out=64):
    rows = []
    for b in batches:
        t = 0.0
        for turn in range(turns):
            tokens_in = prompt + growth * turn
            step = A + S * (b - 1) + K * b * (tokens_in + out / 2)
            for _ in range(b):
                rows.append({"batch": b, "round": 0, "start": t, "gen_s": out * step,
                             "tokens_in": tokens_in, "tokens_out": out})  # fmt: skip
            t += out * step
    return rows


def test_the_fit_recovers_the_engine_that_timed_the_turns():
    spec = engine_curve.fit(engine_curve.turn_table(timed_turns()), top=8)
    assert spec["curve"]["batch"] == [1, 8]
    assert spec["curve"]["step_s"][0] == pytest.approx(A, rel=1e-6)
    assert spec["curve"]["step_s"][1] == pytest.approx(A + 7 * S, rel=1e-6)
    assert spec["context_s_per_token"] == pytest.approx(K, rel=1e-6)
    # and the simulator's engine gives the step it was measured at
    engine = Engine(EngineSpec.model_validate(spec))
    held = 4 * (500 + 32)
    assert engine.step_s([4], [held])[0] == pytest.approx(A + 3 * S + K * held, rel=1e-6)


def test_one_batch_size_alone_cannot_tell_a_slope_and_gives_none():
    spec = engine_curve.fit(engine_curve.turn_table(timed_turns(batches=(1,))), top=2)
    # at batch 1 only, a + k * held fits every turn: no cost per extra sequence is seen
    assert spec["curve"]["step_s"][1] == pytest.approx(spec["curve"]["step_s"][0])


def test_a_config_with_a_wrong_key_exits_2_naming_it(capsys):
    cfg = Path(__file__).resolve().parents[2] / "configs" / "runner" / "cpu_tiny.yaml"
    assert engine_curve.main([str(cfg), "--set", "model.pth=x"]) == 2
    assert "model.pth: unknown key" in capsys.readouterr().err


def test_saved_turns_are_fitted_again_without_a_model(tmp_path, capsys):
    import json

    (tmp_path / "turns.json").write_text(json.dumps(timed_turns()))
    out = tmp_path / "engine.yaml"
    assert engine_curve.main(["--from", str(tmp_path / "turns.json"), "--out", str(out)]) == 0
    spec = EngineSpec.model_validate(__import__("yaml").safe_load(out.read_text()))
    assert spec.curve.batch == [1, 8] and spec.context_s_per_token == pytest.approx(K, rel=1e-6)
