"""Module paths from before the simulator was split into packages, kept for users' imports.

``import staleness_sim.policies`` (or ``from staleness_sim import policies``) gives the very
module object ``staleness_sim.core.policies``: classes keep their identity, and a monkeypatch
through either name is seen through both. Nothing is imported until it is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "policies": "core.policies",
    "trace": "core.trace",
    "metrics": "core.metrics",
    "analytic": "core.analytic",
    "engine": "cohort.engine",
    "queue_config": "queue.config",
    "queue_engine": "queue.engine",
    "queue_metrics": "queue.metrics",
    "sweep": "sweeps.run",
    "sweep_spec": "sweeps.spec",
    "sweep_store": "sweeps.store",
    "report": "sweeps.report",
    "plots": "sweeps.plots",
    "plot_data": "sweeps.plot_data",
    "fitting": "validation.fitting",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        package, _, leaf = fullname.rpartition(".")
        if package != "staleness_sim" or leaf not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        leaf = spec.name.rpartition(".")[2]
        module = importlib.import_module(f"staleness_sim.{MOVED[leaf]}")
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module):
        # The import machinery stamped the alias's spec on the real module: put its own back.
        module.__spec__ = self._own_spec


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())  # before any finder that still sees the old files
