"""Bad sweeps: exit status 2, one line on stderr naming the problem, and an existing results
table left byte-identical (nothing is written before every point has been validated)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import staleness_sim.cli as cli
from staleness_sim.sweeps.run import run_sweep

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]

BAD = {
    "unknown field": (
        {"grid": {"workers": [2], "policy.max_lagg": [1]}},
        "policy.max_lagg: unknown key",
    ),
    "unknown top-level field": ({"grid": {"bogus": [1, 2]}}, "bogus: unknown key"),
    "empty grid": ({"grid": {}}, "grid: empty"),
    "empty axis": ({"grid": {"workers": []}}, "grid.workers: empty"),
    "wrong type": ({"grid": {"workers": ["four"]}}, "workers: Input should be a valid integer"),
    "bad value late in the grid": ({"grid": {"workers": [2, 4, 0]}}, "point 2 (workers=0)"),
    "unequal zip": (
        {"zip": {"workers": [2, 4], "cohort": [3]}},
        "zip: axes must have equal lengths",
    ),
    "bad seeds": ({"seeds": ["a"]}, "seeds:"),
    "too many runs": (
        {"grid": {"workers": list(range(1, 401)), "cohort": list(range(1, 251))}},
        "more than 100,000; pass --yes",
    ),
    "missing base file": ({"base": "nowhere.yaml"}, "base: no such file 'nowhere.yaml'"),
}


@pytest.fixture
def existing(tmp_path, tiny_sweep):
    """An output folder holding a finished sweep; returns (folder, its results bytes)."""
    out = tmp_path / "out"
    run_sweep(tiny_sweep(seeds=[0]), out, jobs=1, progress=False)
    return out, (out / "results.parquet").read_bytes()


def _files(folder):
    return sorted(p.name for p in folder.rglob("*"))


@pytest.mark.parametrize("case", BAD)
def test_bad_sweep_exits_2_with_one_line_and_writes_nothing(
    case, existing, tiny_sweep, write_sweep, capsys
):
    out, before = existing
    files = _files(out)
    overrides, message = BAD[case]
    path = write_sweep(tiny_sweep(**overrides))
    assert cli.main(["sweep", str(path), "--out", str(out), "--jobs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert message in err[0] and err[0].startswith("staleness-sim: error: ")
    assert (out / "results.parquet").read_bytes() == before
    assert _files(out) == files


def test_too_many_runs_is_refused_before_expanding(tiny_sweep):
    # 10^9 points: refused from the sizes alone, without building a single point
    huge = tiny_sweep(grid={k: list(range(1, 1001)) for k in ("workers", "cohort", "updates")})
    with pytest.raises(ValueError, match="pass --yes"):
        run_sweep(huge, "unused", jobs=1)


def test_bad_jobs_and_missing_ray(existing, tiny_sweep, write_sweep, capsys, monkeypatch):
    out, before = existing
    path = write_sweep(tiny_sweep())
    assert cli.main(["sweep", str(path), "--out", str(out), "--jobs", "0"]) == 2
    assert "--jobs: must be at least 1" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    assert cli.main(["sweep", str(path), "--out", str(out), "--placement", "ray"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--placement ray needs Ray" in err[0] and "pip install" in err[0]
    assert (out / "results.parquet").read_bytes() == before
    # --backend, the old name, still works and says the new one (then the same error)
    assert cli.main(["sweep", str(path), "--out", str(out), "--backend", "ray"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "staleness-sim: --backend is now --placement (the old name works for now)"
    assert len(err) == 2 and "--placement ray needs Ray" in err[1]
    args = ["sweep", str(path), "--out", str(out), "--backend", "ray", "--placement", "local"]
    assert cli.main(args) == 2
    assert "give --placement only" in capsys.readouterr().err
    assert (out / "results.parquet").read_bytes() == before


def test_unreadable_results_table_is_not_overwritten(tmp_path, tiny_sweep, write_sweep, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.parquet").write_bytes(b"not parquet")
    assert cli.main(["sweep", str(write_sweep(tiny_sweep())), "--out", str(out)]) == 2
    assert "cannot read the existing results" in capsys.readouterr().err
    assert (out / "results.parquet").read_bytes() == b"not parquet"


def test_real_process_exit_status_and_stderr(tmp_path, tiny_sweep, write_sweep):
    path = write_sweep(tiny_sweep(grid={"policy.max_lagg": [1]}))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "staleness_sim.cli",
            "sweep",
            str(path),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "policy.max_lagg: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()
