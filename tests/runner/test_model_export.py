"""es-runner model export: a run's version as a from_pretrained folder whose weights are the
run's (same hash as the run's backend at that version) and whose greedy replies are the
backend's; bad input is one line, exit 2, and leaves no folder behind."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import cli
from copied_run import LOG, copied_run, greedy_replies, with_model

from runner import cli as runner_cli


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model):
    """A copied run (config.yaml and checkpoint, no journal) of two updates of the tiny model."""
    return copied_run(tmp_path_factory.mktemp("export"), tiny_model, LOG)


def export(*args: str, capsys=None) -> tuple[int, str]:
    """``es-runner model export ARGS`` in this process; (exit status, stderr)."""
    code = runner_cli.main(["model", "export", *args])
    return code, capsys.readouterr().err if capsys is not None else ""


def test_export_has_the_runs_weights_and_greedy_replies(run_dir, tmp_path):
    run, config = run_dir
    out = tmp_path / "v1"
    done = cli("model", "export", str(run), "--version", "1", str(out))  # as a user runs it
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "export.json").read_text())
    assert (summary["version"], summary["versions"]) == (1, 2)
    # the run's version, as its own backend computes it: the base plus the first record
    want_hash, want = greedy_replies(config, LOG[:1])
    base_hash, base = greedy_replies(config)
    got_hash, got = greedy_replies(with_model(config, path=str(out)))
    assert got_hash == want_hash == summary["weights_sha256"] != base_hash
    assert got == want and got != base  # greedy replies: the version's, not the base's
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    # the last version by default; an empty folder may be the target
    last = tmp_path / "last"
    last.mkdir()
    assert export(str(run), str(last))[0] == 0
    assert json.loads((last / "export.json").read_text())["version"] == 2


def test_bad_input_is_one_line_and_writes_nothing(run_dir, tmp_path, capsys):
    run, _ = run_dir
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep")
    # a run whose base model is gone (a copy without its base weights)
    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    config = yaml.safe_load((moved / "config.yaml").read_text())
    config["model"]["path"] = str(tmp_path / "no_model")
    (moved / "config.yaml").write_text(yaml.safe_dump(config))
    cases = [
        ((str(tmp_path / "nowhere"), str(tmp_path / "a")), "no such run directory"),
        ((str(run), "--version", "3", str(tmp_path / "b")), "the run has versions 0..2"),
        ((str(run), "--version", "-1", str(tmp_path / "c")), "the run has versions 0..2"),
        ((str(run), str(full)), "exists and is not empty"),
        ((str(tmp_path), str(tmp_path / "d")), "not a run directory"),
        ((str(moved), str(tmp_path / "e")), "base model"),
    ]
    for args, expected in cases:
        code, err = export(*args, capsys=capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and expected in lines[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "moved"]  # nothing written
    assert [p.name for p in full.iterdir()] == ["x"]


@pytest.mark.docker
def test_eval_loads_an_exported_folder(engine, run_dir, task_dir, tmp_path):
    run, _ = run_dir
    out = tmp_path / "model"
    assert export(str(run), str(out))[0] == 0
    done = cli(
        "eval", "--model", str(out), "--tasks", str(task_dir), "--split", "test",
        "--max-tasks", "1", "--max-turns", "1", "--max-new-tokens", "8", "--json", "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["n_tasks"] == 1 and result["episodes"] == 1 and result["errors"] == 0
