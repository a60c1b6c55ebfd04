"""The ES rule is torch-free: a process in which torch cannot be imported still imports the
orchestrator, builds update records and writes the checkpoint document, and only the
kernels' names need torch."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# torch (and anything below it) cannot be imported in this process
NO_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is blocked in this test ({name})")

sys.meta_path.insert(0, NoTorch())
"""

WITHOUT_TORCH = (
    NO_TORCH
    + """
import json, math, tempfile
import runner.orchestrator  # the single controller, which holds no model
from runner.es import UpdateRule, read_checkpoint, write_checkpoint

rule = UpdateRule(sigma=0.01, alpha=0.3)
record = rule.make([(11, 1.0, 4), (12, 2.0, 4), (13, 3.0, 4)], version=4)
with tempfile.TemporaryDirectory() as d:
    write_checkpoint(d, base_hash="ab", config=rule.config(), log=[record])
    doc = read_checkpoint(d)
try:
    from runner.es import ESOptimizer  # a kernel: needs torch
    kernel = "imported"
except ImportError as exc:
    kernel = str(exc)
print(json.dumps({
    "version": record.version, "entries": record.entries, "doc_version": doc["version"],
    "kernel": kernel, "torch": sorted(m for m in sys.modules if m.split(".")[0] == "torch"),
}))
"""
)


def test_the_rule_and_the_orchestrator_import_without_torch():
    import json

    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["torch"] == []
    assert got["kernel"].startswith("torch is blocked")  # the hook works: the test can fail
    assert got["version"] == 5 and got["doc_version"] == 1
    # z-scores of rewards 1, 2, 3 (mean 2, population sd sqrt(2/3)) are -sqrt(1.5), 0,
    # +sqrt(1.5); each coefficient is alpha / N * z = 0.3 / 3 * z
    expected = [(11, -0.1 * 1.5**0.5), (12, 0.0), (13, 0.1 * 1.5**0.5)]
    assert [s for s, _ in got["entries"]] == [s for s, _ in expected]
    for (_, c), (_, want) in zip(got["entries"], expected, strict=True):
        assert c == pytest.approx(want, rel=1e-6, abs=1e-12)


def test_every_public_name_of_runner_es_resolves_to_its_module():
    es = importlib.import_module("runner.es")
    for name in es.__all__:
        value = getattr(es, name)
        homes = [
            m.name
            for m in pkgutil.iter_modules(es.__path__)
            if getattr(importlib.import_module(f"runner.es.{m.name}"), name, None) is value
        ]
        assert homes, name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        es.nothing  # noqa: B018
