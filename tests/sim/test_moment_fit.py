"""A measured run's uncontended work under the CPU shared moment by moment
(``--cores K --cpu-share moment``): a hand-worked timeline, the fit and the simulation as
inverses on measured runs, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from staleness_sim.cli import main
from staleness_sim.durations import CpuShare
from staleness_sim.validation import validate_run
from staleness_sim.validation.moment_fit import fair_levels, uncontended

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
    cpu = CpuShare(cores=1, share="moment", engine_demand=1, engine_threads=1)
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
    cpu = CpuShare(cores=1, share="moment", engine_demand=1, engine_threads=1)
    out, _ = uncontended(eps, pd.Series({0: 0, 1: 1}), cpu)
    np.testing.assert_allclose(out["generation_s"], [1.0, 1.0])


@pytest.mark.parametrize(
    "wants, cores, level",
    [([1, 1, 1], 2, 2 / 3), ([0.2, 1, 1], 1.2, 0.5), ([0.5, 0.5], 2, np.inf), ([3], 2, 2)],
)
def test_the_fair_level(wants, cores, level):
    one_row = lambda x: np.asarray([x], float)  # noqa: E731
    got = fair_levels(one_row(wants), one_row([1] * len(wants)), cores)[0]
    assert got == pytest.approx(level)


@pytest.mark.parametrize(
    "run, cores, within",
    [
        ("across_concurrency/C4", 2, 0.02),
        ("across_concurrency_2/C4b", 2, 0.02),
        ("across_concurrency_3/C4", 2, 0.02),
        # two workers on 2 cores, a core each: the fit has them share the machine, the
        # simulation gives each its core
        ("across_concurrency/G2C4", 1, 0.04),
        ("across_concurrency_2/G2C4", 1, 0.04),
    ],
)
def test_a_run_simulated_from_its_own_fit_gives_its_results_per_hour(run, cores, within):
    # the fit takes the sharing out and the simulation puts it back: the run's own rate
    v = validate_run(RUNS / run, replicates=3, durations="turns", cores=cores, cpu_share="moment")
    out = v.to_json()
    assert out["results_per_hour_predicted"] == pytest.approx(
        out["results_per_hour_measured"], rel=within
    )


def test_the_fit_names_the_sharing_in_the_job(capsys):
    run = RUNS / "across_concurrency_3" / "C4"
    args = ["fit", str(run), "--durations", "turns", "--cores", "2", "--cpu-share", "moment"]
    assert main([*args, "--json"]) == 0
    job = json.loads(capsys.readouterr().out)["job"]
    assert job["cpu"] == {"cores": 2.0, "share": "moment"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cpu-share", "moment"], "--cpu-share moment needs --cores K"),
        (["--cores", "2", "--cpu-share", "moments"], "invalid choice"),
    ],
)
def test_bad_sharing_flags_exit_2(args, message, capsys):
    run = RUNS / "across_concurrency_3" / "C4"
    try:
        code = main(["fit", str(run), "--durations", "turns", *args])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err


def test_two_workers_engines_wanting_two_cores_each_share_two():
    # each engine two threads wanting a core each, on a 2-core machine: half its demand
    eps = episodes((0, 0.0, 2.0, 0.0, 2.0), (1, 0.0, 2.0, 0.0, 2.0))
    cpu = CpuShare(cores=2, share="moment", engine_demand=2, engine_threads=2)
    out, _ = uncontended(eps, pd.Series({0: 0, 1: 1}), cpu)
    np.testing.assert_allclose(out["generation_s"], [1.0, 1.0])


def _fit_job(run, *flags, capsys):
    args = ["fit", str(run), "--durations", "turns", "--cpu-share", "moment", *flags]
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["job"]


def test_the_engines_own_cpu_is_kept_in_the_job_whatever_the_cores(tmp_path, capsys):
    # the default is an engine wanting all of a worker's cores, one thread a core: given
    # as the engine's own CPU it fits the same job, and the job's cpu then keeps it
    run = RUNS / "across_workers_6" / "C4"
    spec = tmp_path / "engine_cpu.yaml"
    spec.write_text("engine_demand: 2\nengine_threads: 2\n")
    default = _fit_job(run, "--cores", "2", capsys=capsys)
    given = _fit_job(run, "--cores", "2", "--engine-cpu", str(spec), capsys=capsys)
    assert given["cpu"] == {"cores": 2.0, "share": "moment", "engine_demand": 2.0,
                            "engine_threads": 2}  # fmt: skip
    assert given["turns"] == default["turns"] and given["engine"] == default["engine"]
    # two workers' engines each wanting 2 of the machine's 2 cores, not 1 (the default at
    # --cores 1): each had less of its demand, so its uncontended decode is faster
    run2 = RUNS / "across_workers_6" / "G2C4"
    default2 = _fit_job(run2, "--cores", "1", capsys=capsys)
    given2 = _fit_job(run2, "--cores", "1", "--engine-cpu", str(spec), capsys=capsys)
    step = lambda job: job["engine"]["curve"]["step_s"]  # noqa: E731
    assert all(a < b for a, b in zip(step(given2), step(default2), strict=True))


def test_a_what_if_at_fewer_cores_slows_an_engine_that_wants_its_own(tmp_path, capsys):
    run = RUNS / "across_workers_6" / "C4"
    spec = tmp_path / "engine_cpu.yaml"
    spec.write_text("engine_cores: {batch: [1, 4], cores: [1.1, 1.4]}\nengine_threads: 2\n")
    rate = {}
    for name, extra in (("default", []), ("own", ["--engine-cpu", str(spec)])):
        args = ["run", "--from-run", str(run), "--durations", "turns", "--cores", "2",
                "--cpu-share", "moment", *extra, "--set", "job.cpu.cores=1", "--json"]  # fmt: skip
        assert main(args) == 0
        rate[name] = json.loads(capsys.readouterr().out)["results_per_hour"]
    # on 1 core an engine wanting 1.4 decodes at most 1 / 1.4 as fast; by default it wants 1
    assert rate["own"] < 0.95 * rate["default"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("engine_thread: 2\n", "engine_thread: not an engine CPU field"),
        ("engine_threads: 0\n", "engine_threads: Input should be greater than or equal to 1"),
        ("engine_cores: {batch: [1, 4], cores: [1.1]}\n", "batch has 2 values, cores 1"),
        ("3\n", "expected a mapping of engine_demand, engine_threads, engine_cores"),
        ("a: [\n", "not YAML"),
    ],
)
def test_a_bad_engine_cpu_file_exits_2_naming_it(text, message, tmp_path, capsys):
    spec = tmp_path / "engine_cpu.yaml"
    spec.write_text(text)
    run = RUNS / "across_workers_6" / "C4"
    args = ["--cores", "2", "--engine-cpu", str(spec)]
    assert main(["fit", str(run), "--durations", "turns", "--cpu-share", "moment", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--engine-cpu {spec}" in err and message in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--engine-cpu", "X"], "the engine's CPU (--engine-cpu) goes with --cores"),
        (
            ["--cores", "2", "--cpu-share", "job", "--engine-cpu", "X"],
            "goes with --cpu-share moment",
        ),
    ],
)
def test_engine_cpu_flags_that_do_not_go_together_exit_2(args, message, tmp_path, capsys):
    spec = tmp_path / "engine_cpu.yaml"
    spec.write_text("engine_threads: 2\nengine_demand: 1.4\n")
    args = [str(spec) if a == "X" else a for a in args]
    run = RUNS / "across_workers_6" / "C4"
    assert main(["run", "--from-run", str(run), "--durations", "turns", *args]) == 2
    assert message in capsys.readouterr().err
