"""Live metrics of a run in the trackers people already watch (``logging:`` in the config).

:class:`Tracker` sends one dict of scalars per committed update (and per evaluation) to
each sink the config names: ``console``, ``jsonl`` (``RUN_DIR/metrics.jsonl``),
``tensorboard`` (``RUN_DIR/tensorboard/``), ``wandb`` (offline) and ``mlflow`` (a local
SQLite store). :mod:`runner.tracking.scalars` computes the scalars from the run's state;
the names are the table in docs/metrics.md. Each sink lives in a file of its own and is
imported only when named, so a missing package is found at start (:func:`check_sinks`).
"""

from runner.tracking.scalars import UpdateScalars, eval_scalars
from runner.tracking.tracker import SINKS, Tracker, check_sinks

__all__ = ["SINKS", "Tracker", "UpdateScalars", "check_sinks", "eval_scalars"]
