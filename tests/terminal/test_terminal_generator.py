import json
import subprocess
import sys

from runner.terminal.apptainer import parse_definition
from runner.terminal.generator.categories import CATEGORIES
from runner.terminal.generator.writer import generate_specs
from runner.terminal.loaders import load_task


def test_at_least_ten_categories_and_thousands_distinct():
    assert len(CATEGORIES) >= 10
    specs = generate_specs(3000, seed=5)
    ids = [task_id for task_id, _ in specs]
    assert len(set(ids)) == 3000
    assert len({s.description for _, s in specs}) > 2000


def test_same_seed_same_tasks_other_seed_other_tasks():
    a = [(t, s.container_def()) for t, s in generate_specs(30, seed=1)]
    b = [(t, s.container_def()) for t, s in generate_specs(30, seed=1)]
    c = [(t, s.container_def()) for t, s in generate_specs(30, seed=2)]
    assert a == b and a != c


def test_container_defs_are_upstream_style_and_parse():
    for task_id, spec in generate_specs(len(CATEGORIES), seed=3):
        text = spec.container_def()
        assert text.startswith("Bootstrap: docker\nFrom: ubuntu:22.04\n")
        d = parse_definition(text, task_id)
        assert "%environment" in text and d.environment


def test_cli_generate_writes_native_layout_and_splits(tmp_path):
    out = tmp_path / "tasks"
    cmd = [sys.executable, "-m", "runner.cli", "tasks", "generate", "--n", "40", "--seed", "9"]
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tasks"] == 40
    split_ids = []
    for name in ("train", "validation", "test"):
        split_ids += (out / f"{name}.txt").read_text().split()
    assert len(split_ids) == len(set(split_ids)) == 40
    assert len((out / "train.txt").read_text().split()) == 32
    for task_id in split_ids[:5]:
        task = load_task(out / task_id)
        meta = json.loads((out / task_id / "task.json").read_text())
        assert meta["category"] in CATEGORIES and meta["difficulty"] in ("easy", "medium")
        assert task.initial_test and task.final_test and task.solution is not None


def test_cli_reports_bad_input_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "runner.cli", "tasks", "generate", "--n", "2"]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path), "--categories", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("es-runner: error: unknown categories ['nope']")
    assert "Traceback" not in proc.stderr


def test_partial_checks_leave_ids_and_splits_as_they_were():
    # The ids of generate_specs(28, 0) before partial checks were added (recorded then):
    # the partial checks change no id, so no split and no warm start's training set.
    before = ["gen_archive_create_9de21f5fe7", "gen_archive_extract_02ed0e1388",
              "gen_text_search_20bbed6d14", "gen_csv_aggregate_627c55bab3",
              "gen_json_filter_1e8a00d213", "gen_log_analysis_adc8de81cc",
              "gen_permissions_d2ee6c5706", "gen_find_files_85e4730564",
              "gen_sed_config_ecf6e5ff35", "gen_awk_columns_1f72690b20",
              "gen_script_writing_4a97b85a39", "gen_processes_9893f7ac51",
              "gen_symlinks_7a94029109", "gen_dedupe_sort_de6b86f00e"]  # fmt: skip
    specs = generate_specs(28, 0)
    assert [t for t, _ in specs][:14] == before
    for _, spec in specs:  # every category has partial checks, written after the full one
        test = spec.final_test()
        assert spec.partial_checks and test.count("\ndef test_partial_") == len(spec.partial_checks)
        assert test.index(spec.final_checks) < test.index("def test_partial_")
        compile(test, "test_final_state.py", "exec")
