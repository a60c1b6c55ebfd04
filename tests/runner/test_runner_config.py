"""Bad input: one line naming the problem, exit status 2, nothing created."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO, cli

from runner import cli as runner_cli


@pytest.fixture
def run_cli(capsys):
    """``es-runner ARGS`` in this process (fast); returns (exit status, stdout, stderr)."""

    def run(*args: str):
        code = runner_cli.main(list(args))
        out = capsys.readouterr()
        return _Done(code, out.out, out.err)

    return run


class _Done:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def write(tmp_path, data, name="bad.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def base(tiny_model) -> dict:
    data = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
    data["model"]["path"] = str(tiny_model)
    return data


def one_error_line(done) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_unknown_key_names_the_field_and_the_allowed_ones(tmp_path, tiny_model, run_cli):
    data = base(tiny_model)
    data["es"]["sigmaa"] = 0.1
    line = one_error_line(
        run_cli("train", str(write(tmp_path, data)), "--out", str(tmp_path / "r"))
    )
    assert "es.sigmaa: unknown key" in line and "sigma" in line and "antithetic" in line
    assert not (tmp_path / "r").exists()


def test_wrong_types_and_values(tmp_path, tiny_model, run_cli):
    cases = {
        "workers": ("two", "workers"),
        "policy": ({"kind": "bounded"}, "policy.max_lag: required field is missing"),
        "sampling": ({"top_p": 1.5}, "sampling.top_p"),
        "context_tokens": (16, "must exceed sampling.max_new_tokens"),
        "placement": ("slurm", "placement"),
    }
    for key, (value, expected) in cases.items():
        data = base(tiny_model)
        data[key] = value
        line = one_error_line(run_cli("train", str(write(tmp_path, data))))
        assert expected in line, (key, line)
    data = base(tiny_model)
    data["es"]["staleness"] = "drop_over:x"
    assert "es.staleness" in one_error_line(run_cli("train", str(write(tmp_path, data))))
    data = base(tiny_model)
    data["es"]["noise"] = "mersenne"
    line = one_error_line(run_cli("train", str(write(tmp_path, data))))
    assert "es.noise" in line and "philox-v2" in line
    data["es"]["noise"] = "lowrank-v1-r0"  # a rank must be >= 1
    line = one_error_line(run_cli("train", str(write(tmp_path, data))))
    assert "es.noise" in line and "lowrank-v1-r<R>" in line
    data = base(tiny_model)
    data["es"]["reward"] = "partial"
    line = one_error_line(run_cli("train", str(write(tmp_path, data))))
    assert "es.reward" in line and "graded" in line and "binary" in line
    data = base(tiny_model)
    data["es"]["params"] = "layers.(0"
    line = one_error_line(run_cli("train", str(write(tmp_path, data))))
    assert "es.params" in line and "not a regular expression" in line
    data = base(tiny_model)
    data["tasks"] = {"dir": "x", "generate": {"n": 3}}
    assert "exactly one of tasks.dir and tasks.generate" in one_error_line(
        run_cli("train", str(write(tmp_path, data)))
    )
    data = base(tiny_model)
    data["policy"] = {"kind": "controlled_delay", "fraction": 0.9, "delay": 2}
    data["cohort"] = 1
    assert "policy:" in one_error_line(run_cli("train", str(write(tmp_path, data))))


def test_the_old_name_backend_still_works_and_names_placement(tmp_path, capsys):
    """``backend: local|ray`` was renamed ``placement`` (``model.backend`` keeps hf|vllm)."""
    from runner.config import config_yaml, load_run_config, validate_run

    data = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
    assert data["placement"] == "local"
    old = {k if k != "placement" else "backend": v for k, v in data.items()}
    old["backend"] = "ray"
    path = write(tmp_path, old)
    config = load_run_config(path)
    assert config.placement == "ray" and config.model.backend == "hf"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{path}: 'backend' is now called 'placement' (the old name works for now)"]
    # an override by the old name replaces the file's new key, and says so too
    config = load_run_config(write(tmp_path, data, "new.yaml"), ["backend=ray"])
    assert config.placement == "ray"
    assert "'backend' is now called 'placement'" in capsys.readouterr().err
    # the new name alone: silent; a recorded run's config (validate_run): silent
    assert load_run_config(write(tmp_path, data, "new.yaml")).placement == "local"
    assert validate_run(old).placement == "ray"
    assert capsys.readouterr().err == ""
    assert "placement: ray" in config_yaml(config) and "backend: ray" not in config_yaml(config)


def test_old_and_new_name_together_is_one_clear_error(tmp_path, tiny_model, run_cli):
    data = base(tiny_model)
    data["backend"] = "ray"
    line = one_error_line(run_cli("train", str(write(tmp_path, data))))
    assert "backend: renamed to placement; give placement only" in line


def test_set_overrides_are_validated_too(tmp_path, tiny_model, run_cli):
    path = write(tmp_path, base(tiny_model))
    line = one_error_line(run_cli("train", str(path), "--set", "policy.max_lag=-1"))
    assert "policy.max_lag" in line
    line = one_error_line(run_cli("train", str(path), "--set", "nonsense"))
    assert "expected KEY=VALUE" in line


def test_missing_model_says_what_to_run(tmp_path):
    data = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
    data["model"]["path"] = str(tmp_path / "nowhere")
    line = one_error_line(cli("train", str(write(tmp_path, data)), "--out", str(tmp_path / "r")))
    assert f"es-runner model make-tiny {tmp_path / 'nowhere'}" in line
    assert not (tmp_path / "r").exists()


def test_resume_errors(tmp_path, tiny_model, run_cli):
    line = one_error_line(run_cli("train", "--resume", str(tmp_path / "none")))
    assert "no such run directory" in line
    (tmp_path / "empty").mkdir()
    assert "not a run directory" in one_error_line(
        run_cli("train", "--resume", str(tmp_path / "empty"))
    )
    path = write(tmp_path, base(tiny_model))
    line = one_error_line(run_cli("train", str(path), "--resume", str(tmp_path / "empty")))
    assert "a resumed run keeps its config" in line
    assert "give a CONFIG" in one_error_line(run_cli("train"))


def test_missing_config_file(tmp_path, run_cli):
    assert "no such file" in one_error_line(run_cli("train", str(tmp_path / "nope.yaml")))


def test_make_tiny_builds_a_model_that_loads_through_from_pretrained(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "m"
    done = cli(
        "model",
        "make-tiny",
        str(out),
        "--layers",
        "3",
        "--hidden",
        "32",
        "--vocab",
        "400",
        "--seed",
        "7",
    )
    assert done.returncode == 0, done.stderr
    cfg = AutoConfig.from_pretrained(out)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size) == ("qwen2", 3, 32)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert len(AutoTokenizer.from_pretrained(out)) == model.config.vocab_size <= 400
    again = cli("model", "make-tiny", str(out))
    assert again.returncode == 2 and "not empty" in again.stderr
    assert "multiple of 16" in one_error_line(
        cli("model", "make-tiny", str(tmp_path / "x"), "--hidden", "20")
    )
