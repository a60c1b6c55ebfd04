"""Loading both layouts, container.def translation and bad task folders (no Docker)."""

import json

import pytest

from runner.terminal.apptainer import parse_definition
from runner.terminal.errors import DefinitionError, TaskLoadError
from runner.terminal.loaders import load_task

DEF = """Bootstrap: docker
From: ubuntu:22.04

%post
    apt-get update && apt-get install -y python3 python3-pip
    pip3 install pytest
    mkdir -p /home/user/data
    cat > /home/user/data/a.txt <<'EOF'
  indented line
%not a section
EOF
    chmod -R 777 /home/user

%environment
    export FOO=bar
    export PATH=$PATH:/opt/x

%runscript
    echo ignored
"""


def write_native(root, definition=DEF, task=None):
    root.mkdir(parents=True, exist_ok=True)
    meta = task or {"name": "t1", "description": "Do it.", "truth": "x"}
    (root / "task.json").write_text(json.dumps(meta))
    (root / "container.def").write_text(definition)
    (root / "test_final_state.py").write_text("def test_x():\n    assert True\n")
    (root / "test_initial_state.py").write_text("def test_y():\n    assert True\n")
    return root


def test_native_layout_loads(tmp_path):
    task = load_task(write_native(tmp_path / "t"))
    assert task.layout == "native" and task.task_id == "t1" and task.instruction == "Do it."
    d = task.recipe.definition
    assert d.from_image == "ubuntu:22.04"
    # Here-document bodies are kept byte-exact, even a line starting with '%'.
    assert "  indented line\n%not a section\nEOF\n" in d.post
    assert "export FOO=bar" in d.environment


def test_upstream_config_block_sets_limits(tmp_path):
    meta = {
        "name": "t",
        "description": "d",
        "config": {
            "agent_timeout_sec": 120,
            "verifier_timeout_sec": 60,
            "environment": {"cpus": 2, "memory_mb": 1024},
        },
    }
    task = load_task(write_native(tmp_path / "t", task=meta))
    assert (task.limits.agent_timeout_s, task.limits.verifier_timeout_s) == (120, 60)
    assert (task.limits.cpus, task.limits.memory_mb) == (2, 1024)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "Bootstrap: docker\nFrom: x\n%setup\n    touch $APPTAINER_ROOTFS/x\n",
            "line 3: section %setup",
        ),
        ("Bootstrap: docker\nFrom: x\n%files\n    a /a\n", "line 3: section %files"),
        ("Bootstrap: yum\nFrom: x\n", "line 1: Bootstrap 'yum' is not supported"),
        ("From: x\n", "no 'Bootstrap:' header"),
        ("Bootstrap: docker\n", "no 'From:' header"),
        (
            "Bootstrap: docker\nFrom: x\n%post\n    cat > f <<END\n    hi\n",
            "line 4: here-document 'END' is never terminated",
        ),
        (
            "Bootstrap: docker\nFrom: x\n%post\n    echo ok\n    cp a $SINGULARITY_ROOTFS/b\n",
            "line 5: refers to the host-side",
        ),
        ("Bootstrap: docker\nFrom: x\n%weird\n", "line 3: unknown section %weird"),
    ],
)
def test_untranslatable_definitions_name_task_and_line(text, needle):
    with pytest.raises(DefinitionError) as err:
        parse_definition(text, "mytask")
    assert str(err.value).startswith("mytask: ")
    assert needle in str(err.value)


def test_missing_files_and_broken_json(tmp_path):
    root = write_native(tmp_path / "t")
    (root / "test_final_state.py").unlink()
    with pytest.raises(TaskLoadError, match=r"missing file\(s\): test_final_state.py"):
        load_task(root)
    root = write_native(tmp_path / "u")
    (root / "task.json").write_text('{"name": "u", "description": ')
    with pytest.raises(TaskLoadError, match=r"task.json is not valid JSON \(line 1"):
        load_task(root)
    with pytest.raises(TaskLoadError, match="not a task folder"):
        load_task(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskLoadError, match="expected task.json"):
        load_task(tmp_path / "empty")


HARBOR_TOML = '[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 30\n[environment]\nmemory = "1G"\ncpus = 2\n'


def write_harbor(root, toml=HARBOR_TOML):
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "solution").mkdir()
    (root / "instruction.md").write_text("Create /app/hello.txt containing hello.\n")
    (root / "task.toml").write_text(toml)
    (root / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:22.04\nWORKDIR /app\nCOPY seed.txt /app/seed.txt\n"
    )
    (root / "environment" / "seed.txt").write_text("seed\n")
    (root / "tests" / "test.sh").write_text(
        '#!/bin/bash\nif [ "$(cat /app/hello.txt)" = hello ]; then echo 1 > /logs/verifier/reward.txt;'
        " else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    (root / "solution" / "solve.sh").write_text("echo hello > /app/hello.txt\n")
    return root


def test_harbor_layout_loads(tmp_path):
    task = load_task(write_harbor(tmp_path / "h"))
    assert task.layout == "harbor" and task.workdir == "/app" and task.agent_user == "root"
    assert task.limits.memory_mb == 1024 and task.limits.cpus == 2
    assert task.limits.agent_timeout_s == 30
    assert task.solution is not None and task.solution.name == "solve.sh"


def test_broken_toml_and_missing_harbor_files(tmp_path):
    with pytest.raises(TaskLoadError, match="task.toml is not valid TOML"):
        load_task(write_harbor(tmp_path / "h", toml="[verifier\ntimeout_sec = 1\n"))
    root = write_harbor(tmp_path / "i")
    (root / "tests" / "test.sh").unlink()
    with pytest.raises(TaskLoadError, match=r"missing file\(s\): tests/test.sh"):
        load_task(root)
    with pytest.raises(TaskLoadError, match="memory = 'lots' is not a size"):
        load_task(write_harbor(tmp_path / "j", toml='[environment]\nmemory = "lots"\n'))
