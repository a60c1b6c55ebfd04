"""The MLflow sink against MLflow itself (an optional extra: skipped where it is not
installed): its local SQLite store holds every step once, and a resumed run, a new sink
on the same run directory, logs into the same MLflow run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def test_mlflow_sink_logs_each_step_once_across_a_resume(tmp_path):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient

    from runner.tracking.mlflow_sink import STORE, Sink

    config = SimpleNamespace(name="mlcheck", logging=SimpleNamespace(project=None))
    sink = Sink(tmp_path, config)
    sink.write(1, {"train/reward_mean": 0.25, "eval/success": 0.4}, 1000.0)
    sink.write(2, {"train/reward_mean": 0.5}, 1001.0)
    sink.close()
    sink = Sink(tmp_path, config)  # the resumed process
    sink.write(3, {"train/reward_mean": 0.75}, 1002.0)
    sink.close()

    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / STORE).resolve()}")
    runs = client.search_runs([client.get_experiment_by_name("mlcheck").experiment_id])
    assert len(runs) == 1
    run_id = runs[0].info.run_id
    history = client.get_metric_history(run_id, "train/reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/success")] == [
        (1, 0.4)
    ]
