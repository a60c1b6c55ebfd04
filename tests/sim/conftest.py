import pytest

from staleness_sim.config import validate, with_overrides

BASE = {
    "name": "test",
    "seed": 0,
    "workers": 4,
    "cohort": 8,
    "updates": 50,
    "policy": {"kind": "unbounded"},
    "job": {"duration": {"dist": "exponential", "mean": 1.0}},
}


@pytest.fixture
def make_scenario():
    """A small scenario with dotted-key overrides, e.g. make_scenario(**{"policy.max_lag": 2})."""

    def build(**overrides):
        return validate(with_overrides(BASE, overrides))

    return build
