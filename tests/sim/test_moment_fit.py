"""A measured run's uncontended work under the CPU shared moment by moment (``job.cpu``, the
cores from the run or ``--cores K``): a hand-worked timeline, the fit and the simulation
as inverses on measured runs, the cores a run records, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from staleness_sim.cli import main
from staleness_sim.durations import CpuShare
from staleness_sim.validation import ModelOptions, read_run, validate_run
from staleness_sim.validation.moment_fit import uncontended
from staleness_sim.validation.turn_fit import run_cores

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "examples" / "runs"


def episodes(*rows) -> pd.DataFrame:
    """Episodes of one turn each: (job, start, end, turn start, turn seconds)."""
    out = []
    for job, t0, t1, s, gen in rows:
        out.append({"job_id": job, "turns": 1, "start_time": t0, "end_time": t1,
                    "duration_s": t1 - t0, "generation_s": gen, "container_s": t1 - t0 - gen,
                    "sandbox_start_s": 0.0, "verify_s": 0.0,
                    "turn_start": [s], "turn_gen_s": [gen]})  # fmt: skip
    return pd.DataFrame(out)


def test_a_hand_worked_timeline_on_one_core():
    # one core; the engine one thread wanting it. A: [0, 3), decoding [0, 2); B: [0, 4),
    # decoding [3.5, 4). On [0, 2) B's command and A's decode get half each; on [2, 3) A and
    # B share the core as commands; on [3, 3.5) B has it; on [3.5, 4) B's decode has it.
    eps = episodes((0, 0.0, 3.0, 0.0, 2.0), (0, 0.0, 4.0, 3.5, 0.5))
    cpu = CpuShare(cores=1, engine_demand=1, engine_threads=1)
    out, _ = uncontended(eps, pd.Series({0: 0}), cpu)
    np.testing.assert_allclose(out["generation_s"], [1.0, 0.5])
    np.testing.assert_allclose(out["turn_gen_uncontended_s"].map(lambda x: x[0]), [1.0, 0.5])
    b_rate = (2 * 0.5 + 1 * 0.5 + 0.5 * 1) / 3.5  # B's timed work over its timed time
    np.testing.assert_allclose(out["container_s"], [1.0 * 0.5, 3.5 * b_rate])
    np.testing.assert_allclose(out["duration_s"], [0.5 + 1.0, 2.0 + 0.5])
    np.testing.assert_allclose(out["turn_gen_s"].map(lambda x: x[0]), [2.0, 0.5])  # measured


def test_two_workers_engines_share_the_machine():
    # two workers' engines decode at once on one core, a thread each: half each
    eps = episodes((0, 0.0, 2.0, 0.0, 2.0), (1, 0.0, 2.0, 0.0, 2.0))
    cpu = CpuShare(cores=1, engine_demand=1, engine_threads=1)
    out, _ = uncontended(eps, pd.Series({0: 0, 1: 1}), cpu)
    np.testing.assert_allclose(out["generation_s"], [1.0, 1.0])


CONCURRENCY = RUNS / "across_concurrency_4"
WORKERS = RUNS / "across_workers_12"


@pytest.mark.parametrize(
    "run, within",
    [
        (CONCURRENCY / "C4", 0.02),
        (CONCURRENCY / "C16", 0.02),
        (WORKERS / "C4", 0.02),
        # two workers on 2 cores, a core each: the fit has them share the machine, the
        # simulation gives each its core
        (WORKERS / "G2C4", 0.04),
        (CONCURRENCY / "G2C4", 0.04),
    ],
)
def test_a_run_simulated_from_its_own_fit_gives_its_results_per_hour(run, within):
    # the fit takes the sharing out and the simulation puts it back: the run's own rate
    v = validate_run(run, replicates=3, options=ModelOptions(durations="turns"))
    out = v.to_json()
    assert v.scenario.job.cpu is not None  # the default shares the run's cores
    assert out["results_per_hour_predicted"] == pytest.approx(
        out["results_per_hour_measured"], rel=within
    )


@pytest.mark.parametrize(
    "run, cores",
    [(CONCURRENCY / "C4", 2.0), (WORKERS / "G2C4", 1.0), (RUNS / "cpu_tiny_bounded", None)],
)
def test_a_cpu_runs_cores_per_worker_come_from_its_record(run, cores):
    # meta.json: the run's usable CPUs (2 on the machine these were made on) over its
    # workers; the cpu_tiny runs were made before runs recorded their machine
    segment = json.loads((run / "meta.json").read_text())["segments"][0]
    assert segment.get("machine", {}).get("usable_cpus") == (None if cores is None else 2)
    assert run_cores(read_run(run)) == cores


def test_a_run_without_a_machine_record_or_on_a_gpu_has_no_cores(tmp_path):
    import shutil

    for change in ("no machine", "gpu"):
        copy = tmp_path / change.replace(" ", "_")
        shutil.copytree(CONCURRENCY / "C4", copy)
        meta = json.loads((copy / "meta.json").read_text())
        if change == "no machine":
            for segment in meta["segments"]:
                segment.pop("machine", None)
        else:
            meta["config"]["model"]["device"] = "cuda"
        (copy / "meta.json").write_text(json.dumps(meta))
        assert run_cores(read_run(copy)) is None
        job, what = _fit_job(copy)
        assert "cpu" not in job and "moment by moment" not in what


def _fit_job(run, *flags):
    from staleness_sim.validation.model import model_from_run

    options = ModelOptions(durations="turns", **dict(flags))
    model = model_from_run(read_run(run), options)
    return model.job, model.description


def test_the_fit_names_the_sharing_in_the_job(capsys):
    args = ["fit", str(CONCURRENCY / "C4"), "--durations", "turns", "--json"]
    assert main(args) == 0
    job = json.loads(capsys.readouterr().out)["job"]
    assert job["cpu"] == {"cores": 2.0}
    assert main([*args, "--cores", "off"]) == 0
    assert "cpu" not in json.loads(capsys.readouterr().out)["job"]
    assert main([*args, "--cores", "1.5"]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["cpu"] == {"cores": 1.5}


def test_given_cores_equal_to_the_runs_give_the_same_scenario():
    default, _ = _fit_job(CONCURRENCY / "C4")
    given, _ = _fit_job(CONCURRENCY / "C4", ("cores", 2.0))
    assert default == given


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cores", "two"], "a number of CPUs, run or off"),
        (["--cores", "0"], "cores must be > 0"),
        (["--cores", "2", "--capacity", "1.1"], "give cores (within a worker) or capacity"),
    ],
)
def test_bad_sharing_flags_exit_2(args, message, capsys):
    try:
        code = main(["validate", str(CONCURRENCY / "C4"), "--durations", "turns", *args])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err


def test_cores_without_the_turn_model_exit_2(capsys):
    assert main(["validate", str(CONCURRENCY / "C4"), "--cores", "2"]) == 2
    assert "needs --durations turns" in capsys.readouterr().err


def test_two_workers_engines_wanting_two_cores_each_share_two():
    # each engine two threads wanting a core each, on a 2-core machine: half its demand
    eps = episodes((0, 0.0, 2.0, 0.0, 2.0), (1, 0.0, 2.0, 0.0, 2.0))
    cpu = CpuShare(cores=2, engine_demand=2, engine_threads=2)
    out, _ = uncontended(eps, pd.Series({0: 0, 1: 1}), cpu)
    np.testing.assert_allclose(out["generation_s"], [1.0, 1.0])
