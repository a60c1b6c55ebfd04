"""benchmarks/fair_share_prototype.py: max-min fair shares in closed cases, and the
simulation of jobs whose parts take a known time under them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SPEC = importlib.util.spec_from_file_location("fair_share", BENCH / "fair_share_prototype.py")
fair_share = importlib.util.module_from_spec(SPEC)
sys.modules["fair_share"] = fair_share  # a dataclass looks its module up
SPEC.loader.exec_module(fair_share)
Sharing = fair_share.Sharing


@pytest.mark.parametrize(
    ("n_timed", "batch", "timed", "engine"),
    [
        (0, 1, 1.0, 1.0),  # the engine alone wants 1.13 of 2 cores: all of it
        (4, 0, 0.5, 1.0),  # four timed threads on two cores
        (4, 4, 1 / 3, (2 / 3) / 1.30),  # six threads, all wanting more than 1/3
        (1, 16, 2 / 3, (4 / 3) / 1.67),  # three threads, all wanting more than 2/3
        (2, 1, 0.5, 1.0 / 1.13),  # four threads at 1/2: the engine's 0.565 each is cut
    ],
)
def test_fair_shares_in_closed_cases(n_timed, batch, timed, engine):
    got_timed, got_engine = Sharing().rates(n_timed, [batch])
    assert got_timed == pytest.approx(timed)
    assert got_engine[0] == pytest.approx(engine)


def test_a_satisfied_engine_leaves_the_rest_to_the_timed_parts():
    sharing = Sharing(engine_cores=(0.5, 0.5, 0.5))
    timed, (engine,) = sharing.rates(3, [1])
    assert engine == 1.0 and timed == pytest.approx((2 - 0.5) / 3)


def test_jobs_take_the_time_their_parts_take_at_their_shares():
    sharing, none = Sharing(), (0.0, 0.0, 0.0)
    one_second = [(0, [("timed", 1.0)])]
    # C = 1: two one-second episodes a job, one after the other: 2 s a job
    assert fair_share.simulate(one_second, none, sharing, 1, 1, 2, 3, 0) == pytest.approx(1800)
    # C = 4: four at once on two cores, each at half speed: 2 s a job
    assert fair_share.simulate(one_second, none, sharing, 4, 1, 4, 3, 0) == pytest.approx(1800)
    # a decode of 100 tokens at 10 ms a step, the engine alone: 1 s a job
    decode = [(0, [("decode", 100.0, 0.0)])]
    got = fair_share.simulate(decode, (0.01, 0.0, 0.0), sharing, 1, 1, 1, 2, 0)
    assert got == pytest.approx(3600)
