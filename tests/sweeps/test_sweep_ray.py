"""Ray placement on a local Ray instance (ray.init(num_cpus=2)): same rows as the local
pool for the same seeds. One small sweep, to keep the suite lean."""

from __future__ import annotations

import pandas as pd
import pytest

from staleness_sim.sweeps.run import run_sweep

ray = pytest.importorskip("ray")


def test_ray_backend_gives_identical_rows_to_the_local_backend(tmp_path, tiny_sweep, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # start a local instance, not a cluster
    sweep = tiny_sweep(seeds=[0, 1, 2])
    local = run_sweep(sweep, tmp_path / "local", jobs=2, progress=False)
    # run_sweep starts ray.init(num_cpus=2) itself, and shuts it down afterwards
    remote = run_sweep(sweep, tmp_path / "ray", jobs=2, placement="ray", progress=False, batch=2)
    assert not ray.is_initialized()
    assert remote.ran == len(local.results) == 12
    pd.testing.assert_frame_equal(local.results, remote.results)
    pd.testing.assert_frame_equal(local.lag_hists, remote.lag_hists)
