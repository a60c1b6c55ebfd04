"""What a timed part and the engine want, fitted to the busy cores a run recorded
(``--cpu-share measured``, ``job.cpu.timed_demand``): the shares with a timed part wanting
less than a core, hand-worked timelines the fit must invert exactly, a saturated machine
that keeps the given wants, a measured run, and runs that recorded nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from staleness_sim.cli import main
from staleness_sim.core.trace import TraceError
from staleness_sim.durations import CpuShare
from staleness_sim.validation import read_run, validate_run
from staleness_sim.validation.moment_fit import RunPieces, fair_levels, fit_wants, recorded_busy

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "examples" / "runs"
BUSY_RUN = RUNS / "across_workers_9" / "busy_after_2" / "C4"  # recorded 1.283 and 0.802


def one_turn_episodes(*rows) -> pd.DataFrame:
    """Episodes of one turn each: (job, start, end, turn start, turn seconds)."""
    return pd.DataFrame(
        [{"job_id": job, "turns": 1, "start_time": t0, "end_time": t1,
          "turn_start": [s], "turn_gen_s": [gen]} for job, t0, t1, s, gen in rows]
    )  # fmt: skip


def fair_level(wants: np.ndarray, cores: float) -> float:
    """The water level thread by thread: the smallest wants met first while the even share
    of what is left covers them (inf where all are met)."""
    left, m = cores, len(wants)
    for i, want in enumerate(np.sort(wants)):
        if want > left / (m - i):
            return left / (m - i)
        left -= want
    return np.inf


def test_the_levels_of_groups_are_the_levels_of_their_threads():
    rng = np.random.default_rng(7)
    wants = rng.uniform(0.05, 2.0, (400, 3))
    counts = rng.integers(0, 4, (400, 3))
    cores = 2.0
    levels = fair_levels(wants, counts, cores)
    for w, c, got in zip(wants, counts, levels, strict=True):
        assert got == pytest.approx(fair_level(np.repeat(w, c), cores))


def test_timed_parts_wanting_half_a_core_share_two_cores():
    # one engine-free timeline: 5 sessions in timed parts on 2 cores, each wanting 0.5:
    # 2.5 wanted, so each gets 0.4, 0.8 of its want; 3 sessions (1.5 wanted) run in full
    eps = one_turn_episodes(*[(0, 0.0, 10.0, 10.0, 0.0)] * 5)
    for n, rate in ((5, 0.8), (3, 1.0)):
        p = RunPieces(eps.iloc[:n], pd.Series({0: 0}))
        cpu = CpuShare(cores=2, share="moment", timed_demand=0.5)
        rate_t, _, used_t, _ = p.shares(cpu)
        np.testing.assert_allclose(rate_t, rate)
        np.testing.assert_allclose(used_t, min(2.0, 0.5 * n))


def test_a_job_of_half_core_parts_slows_by_their_ratio():
    # in the simulator: 5 sessions, a 1 s timed part each, wanting half a core of 2 cores:
    # each at 0.8 of its want, 1.25 s; wanting a whole core each, 2.5 s
    from test_moment_kernel import job_of, rows

    for part, seconds in ((0.5, 1.25), (1.0, 2.5)):
        cpu = {"cores": 2, "share": "moment", "timed_demand": part}
        job = job_of(rows((1, 0)), cpu, episodes=5, concurrency=5)
        np.testing.assert_allclose(job.sample(np.random.default_rng(0), 2), seconds, rtol=1e-12)


def test_as_a_mean_per_job_a_timed_part_wants_its_timed_demand():
    # 4 session-seconds of timed parts and 1 s of decoding in 1 s on 2 cores: the engine
    # wanting 2, a timed part 0.5 -> (0.5 * 4 + 2 * 1) / 1 = 4 cores wanted, slowed 2x
    cpu = CpuShare(cores=2, engine_demand=2, timed_demand=0.5)
    got = cpu.slowdown(np.array([4.0]), np.array([1.0]), np.array([1.0]))
    np.testing.assert_allclose(got, 2.0)


def _timeline():
    # one worker on a 2-core machine, its engine two threads wanting 2 cores by default:
    # A decodes [0, 4) then runs a command [4, 10); B runs a command [0, 10) and decodes
    # [10, 12) (its end). The engine alone never wants more than 2 with A and B's parts.
    eps = one_turn_episodes((0, 0.0, 10.0, 0.0, 4.0), (0, 0.0, 12.0, 10.0, 2.0))
    return RunPieces(eps, pd.Series({0: 0})), CpuShare(cores=2, share="moment")


def test_an_unsaturated_run_gives_back_the_wants_that_used_its_cores():
    # true wants: a timed part 0.3 of a core, the engine 0.8 cores (0.4 of its 2). Over
    # [0, 12): the engine decodes 6 s -> 4.8 core-seconds; timed parts 6 + 10 = 16
    # session-seconds -> 4.8 core-seconds; nowhere above 2 cores (0.8 + 0.3 = 1.1 at
    # most), so each uses what it wants. Recorded: the process 4.8 / 12 = 0.4, the
    # machine 9.6 / 12 = 0.8.
    pieces, cpu = _timeline()
    fitted, what = fit_wants(pieces, cpu, np.array([[0.0, 12.0, 0.8, 0.4]]))
    assert fitted.timed_demand == pytest.approx(0.3, rel=1e-6)
    assert fitted.engine_demand == pytest.approx(0.8, rel=1e-6)
    assert fitted.engine_threads == 2 and fitted.share == "moment"
    assert "the machine 0.80 (fitted 0.80), the run's process 0.40 (fitted 0.40)" in what


def test_a_saturated_run_keeps_the_given_wants():
    # with the given wants (a core a timed part, the engine 2 on 2 threads) the machine is
    # saturated throughout: on [0, 4) B's part and the engine's two threads share 2 cores,
    # 2/3 each; on [4, 10) A and B a core each; on [10, 12) the engine has both. The
    # engines use 4/3 * 4 + 2 * 2 = 28/3 core-seconds, the timed parts 2/3 * 4 + 12 = 44/3;
    # any lower want leaves a core idle somewhere, so only the given wants use them.
    pieces, cpu = _timeline()
    fitted, _ = fit_wants(pieces, cpu, np.array([[0.0, 12.0, 2.0, 28 / 3 / 12]]))
    assert fitted.timed_demand == pytest.approx(1.0, rel=1e-6)
    assert fitted.engine_demand == pytest.approx(2.0, rel=1e-6)
    # recorded busier than even the given wants could be: they stay at the given ones
    fitted, _ = fit_wants(pieces, cpu, np.array([[0.0, 12.0, 2.0, 0.9]]))
    assert fitted.engine_demand == 2.0


def test_an_engine_curve_is_scaled_whole():
    pieces, _ = _timeline()
    cpu = CpuShare(cores=2, share="moment", engine_threads=2,
                   engine_cores={"batch": [1, 4], "cores": [1.6, 2.0]})  # fmt: skip
    # at batch 1 the engine wants 1.6; using 0.8 of a core while it decodes is half of it
    fitted, _ = fit_wants(pieces, cpu, np.array([[0.0, 12.0, 0.8, 0.4]]))
    assert fitted.engine_cores.cores == pytest.approx([0.8, 1.0], rel=1e-6)
    assert fitted.engine_cores.batch == [1, 4]


def test_a_measured_run_fitted_gives_back_its_busy_cores_and_results(capsys):
    args = ["fit", str(BUSY_RUN), "--durations", "turns", "--cores", "2"]
    assert main([*args, "--cpu-share", "measured", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cpu = out["job"]["cpu"]
    # the machine was 64 % busy: both wants below the defaults (a core; 2 cores)
    assert cpu["share"] == "moment" and cpu["cores"] == 2.0 and cpu["engine_threads"] == 2
    assert 0 < cpu["timed_demand"] < 1 and 0 < cpu["engine_demand"] < 2
    assert (
        "the machine 1.28 (fitted 1.28), the run's process 0.80 (fitted 0.80)"
        in (out["description"])
    )
    v = validate_run(BUSY_RUN, replicates=3, durations="turns", cores=2, cpu_share="measured")
    got = v.to_json()
    assert got["results_per_hour_predicted"] == pytest.approx(
        got["results_per_hour_measured"], rel=0.04
    )


def test_a_run_that_recorded_no_busy_cores_exits_2_saying_so(capsys):
    run = RUNS / "across_workers_9" / "C4"  # made before runs recorded them
    args = ["fit", str(run), "--durations", "turns", "--cores", "2", "--cpu-share", "measured"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "machine_busy_cores and process_busy_cores" in err and str(run) in err


def test_a_run_of_ray_workers_is_refused(tmp_path):
    # their engines ran in processes of their own: the run's process was not them
    run = tmp_path / "C4"
    shutil.copytree(BUSY_RUN, run)
    meta = json.loads((run / "meta.json").read_text())
    meta["config"]["backend"] = "ray"
    (run / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TraceError, match="needs backend: local"):
        recorded_busy(read_run(run))


def test_a_killed_segment_is_left_out_and_the_others_kept():
    run = read_run(BUSY_RUN)
    segments = run.trace.meta["segments"]
    first = dict(segments[0])
    killed = {k: v for k, v in first.items() if not k.endswith("busy_cores")} | {"t": 0.0}
    later = first | {"t": 50.0}
    run.trace.meta["segments"] = [killed, later]
    rows = recorded_busy(run)
    assert rows.shape == (1, 4) and rows[0, 0] == 50.0
    assert rows[0, 2:] == pytest.approx([1.283, 0.802])


@pytest.mark.parametrize(
    "args, message",
    [
        (["fit", str(BUSY_RUN), "--durations", "turns"], "--cpu-share measured needs --cores K"),
        (["run", "--from-run", str(BUSY_RUN), "--durations", "turns"],
         "--cpu-share measured (a CPU shared moment by moment) needs --cores K"),
        (["run", "--from-run", str(BUSY_RUN), "--durations", "turns", "--cores", "2",
          "--set", "job.cpu.timed_demand=0"], "job.cpu.timed_demand: Input should be greater"),
    ],
)  # fmt: skip
def test_bad_measured_sharing_exits_2_naming_what(args, message, capsys):
    assert main([*args, "--cpu-share", "measured"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
