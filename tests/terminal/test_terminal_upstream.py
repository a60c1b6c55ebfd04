"""Third-party task shapes without Docker: parsing, install planning, Dockerfile rewriting,
loaders and their refusals, recorded rollouts, the report's lines."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from runner.terminal.apptainer import parse_definition, sif_to_reference
from runner.terminal.dockerfile import prepare
from runner.terminal.errors import DefinitionError, TaskLoadError, UnsupportedTaskError
from runner.terminal.installs import plan_installs, uses
from runner.terminal.loaders import find_tasks, load_task
from runner.terminal.protocol import parse_action

FIX = Path(__file__).parent / "fixtures"

# Pure tests of functions in modules that import the docker SDK (images, replay, verifier,
# check): they import them inside, and are skipped with the reason where it is missing.
needs_docker_sdk = pytest.mark.skipif(
    importlib.util.find_spec("docker") is None,
    reason="imports a runner module that needs the docker SDK (pip install -e .[runner])",
)


@pytest.mark.parametrize(
    ("path", "ref"),
    [
        ("./ubuntu_22.04.sif", "ubuntu:22.04"),
        ("/data/x/ubuntu_22.04.sif", "ubuntu:22.04"),
        ("debian_bookworm.sif", "debian:bookworm"),
        ("python_3.11-slim.sif", "python:3.11-slim"),
        ("alpine.sif", "alpine:latest"),
    ],
)
def test_sif_names_map_to_the_reference_they_were_pulled_from(path, ref):
    assert sif_to_reference(path) == ref


def test_localimage_definition_upstream_shape():
    d = parse_definition((FIX / "native_localimage" / "container.def").read_text(), "t")
    assert (d.bootstrap, d.from_image, d.source_from) == (
        "localimage",
        "ubuntu:22.04",
        "./ubuntu_22.04.sif",
    )
    assert d.notes and "read as FROM ubuntu:22.04" in d.notes[0]
    # %environment commands are kept as written (sourced by every shell), %test is kept,
    # the duplicated %runscript and %labels are accepted.
    assert "chmod 755 /home/user" in d.environment and "export INBOX" in d.environment
    assert "test -f /home/user/inbox/c.txt" in d.test
    assert d.labels == {"author": "fixture"}
    assert "first\nsecond\nthird\nDATA\n" in d.post


def test_empty_definition_says_so():
    with pytest.raises(DefinitionError, match=r"^t: container.def is empty$"):
        parse_definition("\n\n", "t")


def _plan(script, task_text=""):
    from runner.terminal.native_image import BASE_APT_PACKAGES, BASE_PIP_PACKAGES

    return plan_installs(
        script,
        first_line=5,
        provided_apt=BASE_APT_PACKAGES,
        provided_pip=BASE_PIP_PACKAGES,
        task_text=task_text,
    )


@needs_docker_sdk
def test_install_plan_drops_provided_and_pip_toolchain_tries_the_rest():
    plan = _plan("apt update && apt install -y python3-pip git\npip3 install pytest\necho ok\n")
    commands = [
        ln
        for ln in plan.script.split("return 0\n}\n")[-1].splitlines()
        if not ln.startswith("echo '[es-runner]")
    ]
    assert commands == [
        "es_apt_update apt update && es_install 5 '' apt apt-get install -y git",
        "true",
        "echo ok",
    ]
    assert any("python3-pip: not needed" in n for n in plan.notes)
    assert any("'pip3 install pytest': provided by the base image" in n for n in plan.notes)
    assert plan.tried == ["line 5: apt-get install git"]


@needs_docker_sdk
def test_install_plan_marks_packages_the_task_uses():
    test = "import subprocess\nsubprocess.run(['git', 'log'])\n"
    plan = _plan("apt-get update\napt-get install -y git tree\n", task_text=test)
    assert "es_install 6 git apt apt-get install -y git tree" in plan.script
    # a pip install that is not provided keeps python3-pip
    plan = _plan("apt-get install -y python3-pip\npip3 install requests\n", "import requests")
    assert "es_install 5 '' apt apt-get install -y python3-pip" in plan.script
    assert "es_install 6 requests pip pip3 install requests" in plan.script
    # nothing left to install: the apt-get update goes too
    plan = _plan("apt-get update && apt-get install -y python3 python3-pytest\n")
    assert plan.script.endswith("true && true\n")
    assert uses("run `git status`", "git", "apt") and not uses("see github.com", "git", "apt")


def test_dockerfile_heredocs_and_buildkit_flags():
    text = (FIX / "harbor_buildkit" / "environment" / "Dockerfile").read_text()
    out = prepare(text, "t")
    assert out.buildkit_reason == "RUN --mount at line 4"
    lines = out.text.splitlines()
    assert lines[0].startswith("# (es-runner) syntax=")
    runs = [ln for ln in lines if ln.startswith("RUN [") or ln.startswith("RUN --mount")]
    heredoc_run = json.loads(next(ln for ln in lines if ln.startswith("RUN [")).split(" ", 1)[1])
    assert heredoc_run[:2] == ["/bin/sh", "-c"] and "mode=fast" in heredoc_run[2]
    copy = json.loads(lines[-1].split(" ", 1)[1])
    assert copy[:2] == ["/bin/sh", "-ec"] and "chmod 755 /usr/local/bin/greet" in copy[2]
    assert not any(ln.strip() == "EOF" for ln in lines) and len(runs) >= 2
    assert any("syntax=docker/dockerfile:1.4" in n for n in out.notes)
    # a plain Dockerfile is left alone and needs no BuildKit
    plain = "FROM ubuntu:24.04\nRUN echo hi \\\n  && echo there\n"
    assert prepare(plain, "t").text == plain and prepare(plain, "t").buildkit_reason is None


def test_unterminated_dockerfile_heredoc_is_named():
    with pytest.raises(Exception, match="line 2: here-document 'EOF' is never terminated"):
        prepare("FROM x\nRUN <<EOF\necho hi\n", "t")


def test_harbor_user_workdir_and_env(monkeypatch):
    task = load_task(FIX / "harbor_user")
    assert (task.agent_user, task.workdir, task.verifier_user) == ("app", "/home/app/work", "app")
    assert task.env == {"GREETING": "hello"} and task.verifier_env == {"EXPECTED": "app hello"}
    assert task.allow_internet is False and task.solution_dir.name == "solution"
    monkeypatch.setenv("ES_FIXTURE_GREETING", "hey")
    assert load_task(FIX / "harbor_user").env == {"GREETING": "hey"}


def test_harbor_agent_user_and_workdir_from_task_toml(tmp_path):
    root = tmp_path / "t"
    shutil.copytree(FIX / "harbor_user", root)
    toml = (root / "task.toml").read_text()
    toml = toml.replace("[agent]\n", '[agent]\nuser = "root"\n').replace(
        "[environment]\n", '[environment]\nworkdir = "/srv"\n'
    )
    (root / "task.toml").write_text(toml.replace("${ES_FIXTURE_GREETING:-hello}", "${NOPE_X}"))
    with pytest.raises(TaskLoadError, match=r"GREETING uses \$\{NOPE_X\}, which is not set"):
        load_task(root)
    (root / "task.toml").write_text(toml)
    task = load_task(root)
    assert (task.agent_user, task.workdir, task.verifier_user) == ("root", "/srv", "app")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("harbor_multistep", r"^harbor_multistep: multi-step task \(\[\[steps\]\], 2 step"),
        ("harbor_compose", r"docker-compose.yaml declares sidecar service\(s\) api"),
    ],
)
def test_unsupported_harbor_features_are_refused_by_name(name, message):
    with pytest.raises(UnsupportedTaskError, match=message) as err:
        load_task(FIX / name)
    assert "\n" not in str(err.value) and "missing" not in str(err.value)


def test_separate_verifier_refused(tmp_path):
    root = tmp_path / "sep"
    shutil.copytree(FIX / "harbor_heredoc", root)
    text = (
        (root / "task.toml")
        .read_text()
        .replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    )
    (root / "task.toml").write_text(text)
    with pytest.raises(UnsupportedTaskError, match="separate-verifier mode"):
        load_task(root)


def test_harbor_prebuilt_image_without_dockerfile(tmp_path):
    root = tmp_path / "img"
    shutil.copytree(FIX / "harbor_heredoc", root)
    (root / "environment" / "Dockerfile").unlink()
    with pytest.raises(TaskLoadError, match="environment/Dockerfile"):
        load_task(root)
    text = (root / "task.toml").read_text() + 'docker_image = "ubuntu:24.04"\n'
    (root / "task.toml").write_text(text)
    assert load_task(root).recipe.docker_image == "ubuntu:24.04"


def test_terminal_bench_1_layout():
    task = load_task(FIX / "tbench1")
    assert task.layout == "terminal-bench" and task.workdir == "/app"
    assert task.instruction.startswith("Reverse the order")
    assert task.test_script.name == "run-tests.sh" and task.solution.name == "solution.sh"
    assert task.limits.agent_timeout_s == 120 and task.limits.verifier_timeout_s == 60
    assert task.notes == ["docker-compose.yaml only configures the task's own container; ignored"]


def test_find_tasks_and_native_recordings():
    names = [p.name for p in find_tasks(FIX)]
    assert "native_recorded" in names and "tbench1" in names and "steps" not in names
    task = load_task(FIX / "native_recorded")
    assert task.agent_user == "1000" and task.umask == "0002"
    assert [p.name for p in task.recordings] == ["fixture-model_summary.json"]


@needs_docker_sdk
def test_recording_and_replay_agent():
    from runner.terminal.replay import ReplayAgent, load_recording

    rec = load_recording(FIX / "native_recorded" / "solutions" / "fixture-model_summary.json")
    assert (rec.num_runs, rec.num_success) == (2, 1)
    ok, bad = rec.rollouts
    assert (ok.success, ok.reward, bad.success) == (True, 1.0, False)
    assert ok.recorded_exit_codes() == [0, 0, None]
    agent = ReplayAgent(ok)
    msgs = [{"role": "user", "content": "task"}]
    replies = []
    for _ in range(4):
        replies.append(agent(msgs))
        msgs += [{"role": "assistant", "content": replies[-1]}, {"role": "user", "content": "o"}]
    assert replies[:3] == ok.replies and replies[3] == "<action>done</action>"


@needs_docker_sdk
def test_bad_recordings_name_the_problem(tmp_path):
    from runner.terminal.replay import load_recording

    (tmp_path / "a.json").write_text("{")
    with pytest.raises(TaskLoadError, match="a.json: recorded rollouts are not valid JSON"):
        load_recording(tmp_path / "a.json")
    (tmp_path / "b.json").write_text('{"num_runs": 1}')
    with pytest.raises(TaskLoadError, match="not an upstream summary"):
        load_recording(tmp_path / "b.json")
    with pytest.raises(TaskLoadError, match="not found"):
        load_recording(tmp_path / "c.json")


@needs_docker_sdk
def test_upstream_parse_differs_from_ours_inside_think():
    from runner.terminal.replay import upstream_action

    text = "<think>maybe <action>done</action></think><command>ls</command>"
    assert upstream_action(text) == ("done", "")
    assert parse_action(text).command == "ls"
    assert upstream_action("<command> done </command>") == ("done", "")


@needs_docker_sdk
def test_pytest_summary_and_network_failure_lines():
    from runner.terminal.verifier import _network_failure, _pytest_summary

    out = "x\n=== short test summary info ===\nPASSED t.py::a\nFAILED t.py::b - boom\n"
    assert _pytest_summary(out) == (False, "[pytest summary: 1/2 passed]", 0.5)
    assert _pytest_summary("no summary")[0] is None
    trace = (
        '  File "/usr/lib/python3.11/socket.py", line 962, in getaddrinfo\n'
        "    for res in getaddrinfo(host, port):\n"
        "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>\n"
    )
    assert _network_failure(trace).startswith("urllib.error.URLError")
    assert _network_failure("1 failed in 0.1s") is None


@needs_docker_sdk
def test_report_lines_and_summary():
    from runner.terminal.check import format_row, format_summary, summarize

    rows = [
        {
            "task_id": "a",
            "layout": "native",
            "load": "ok",
            "build": "built",
            "fallback": True,
            "initial_ok": True,
            "solution": 1.0,
            "rewards": {"reward": 1.0},
            "replay_counts": [3, 4],
            "build_notes": ["x"],
        },
        {"task_id": "b", "layout": "harbor", "load": "unsupported", "error": "b: multi-step"},
        {"task_id": "c", "layout": "harbor", "load": "ok", "build": "FAIL", "error": "c: boom"},
        {
            "task_id": "d",
            "layout": "harbor",
            "load": "ok",
            "build": "cached",
            "builder": "buildkit",
            "initial_ok": None,
            "solution": 0.0,
            "rewards": {"x": 0.0, "y": 0.0},
            "verifier_error": "verifier needs network: test.sh ran without a network (...)",
        },
    ]
    lines = [format_row(r) for r in rows]
    assert lines[0] == (
        "a  native  build=built (FROM fallback)  initial=pass  solution=1  replays=3/4 agree  notes=1"
    )
    assert lines[1] == "b  harbor  UNSUPPORTED: b: multi-step"
    assert lines[2] == "c  harbor  build=FAIL: c: boom"
    assert lines[3].startswith("d  harbor  build=cached/buildkit  initial=-  solution=0 x=0,y=0 [")
    summary = summarize(rows, True, 0.0)
    assert (summary["tasks"], summary["loaded"], summary["built"], summary["solved"]) == (
        4,
        3,
        2,
        1,
    )
    assert summary["verifier_needs_network"] == 1 and summary["replay_agreement"] == 0.75
    assert "replay agreement 0.750 over 4 rollouts" in format_summary(summary)


def test_post_keeps_indentation_of_multiline_strings():
    # Upstream task 9cc1e5be writes a log whose lines start with " - " from a multi-line
    # echo; its recorded successes depend on those spaces surviving the build.
    text = 'Bootstrap: docker\nFrom: x\n%post\n    echo "head\n - item\n" > /log\n    cat <<E > /f\n  body\n    E\n'
    d = parse_definition(text, "t")
    assert '    echo "head\n - item\n" > /log\n' in d.post
    assert "  body\nE\n" in d.post  # an indented terminator is unindented


def test_command_done_is_done_as_upstream_reads_it():
    assert parse_action("<command> done </command>").kind == "done"
    assert parse_action("<command>done_script.sh</command>").kind == "command"


@needs_docker_sdk
def test_explicit_chown_to_root_is_kept_root():
    from runner.terminal.native_image import explicit_root_paths

    post = "mkdir -p /var/log && chown root:root /var/log/syslog\nchown -R user:user /home/user\n"
    assert explicit_root_paths(post) == ["/var/log/syslog"]
    assert explicit_root_paths("sudo chown -R 0:0 /opt/a /opt/b*\nchown root $X\n") == [
        "/opt/a",
        "/opt/b*",
    ]
