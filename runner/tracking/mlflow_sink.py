"""``mlflow``: MLflow's local SQLite store, ``RUN_DIR/mlflow.db`` (``mlflow ui
--backend-store-uri sqlite:///RUN_DIR/mlflow.db``). A resumed run logs into the same
MLflow run."""

from __future__ import annotations

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from runner.tracking.state_file import record_id, recorded_id

STORE = "mlflow.db"


class Sink:
    name = "mlflow"

    def __init__(self, run_dir, config) -> None:
        self._client = MlflowClient(tracking_uri=f"sqlite:///{(run_dir / STORE).resolve()}")
        run_id = recorded_id(run_dir, "mlflow")
        if run_id is None:
            experiment = config.logging.project or config.name
            found = self._client.get_experiment_by_name(experiment)
            exp_id = found.experiment_id if found else self._client.create_experiment(experiment)
            run_id = self._client.create_run(exp_id, run_name=config.name).info.run_id
            record_id(run_dir, "mlflow", run_id)
        self._run_id = run_id

    def write(self, step: int, scalars: dict[str, float], wall: float) -> None:
        ms = int(wall * 1000)
        metrics = [Metric(k, v, ms, step) for k, v in scalars.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def close(self) -> None:
        pass  # the run stays open across resumes; MLflow shows it as it stands
