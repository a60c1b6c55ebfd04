"""The workers package: one interface that both kinds of worker have, imports one way."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import runner.workers
from runner.workers import LocalWorker, Worker
from runner.workers.ray_driver import RayWorker

# each module may import only the ones before it (the package's documented order)
ORDER = ["protocol", "local", "ray_actor", "ray_driver", "factory"]


def positional(function) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(function).parameters.values() if p.kind in kinds]


def test_local_and_ray_workers_have_every_member_of_the_protocol():
    members = [n for n in vars(Worker) if not n.startswith("_")]
    assert set(members) >= {"base_hash", "es_config", "sync", "run_job", "close"}
    for cls in (LocalWorker, RayWorker):
        for name in members:
            want, got = inspect.getattr_static(Worker, name), inspect.getattr_static(cls, name)
            if isinstance(want, property):
                assert isinstance(got, property), (cls.__name__, name)
            else:  # the same positional parameters; extra keyword-only ones are allowed
                assert positional(got) == positional(want), (cls.__name__, name)
                extra = [
                    p for p in inspect.signature(got).parameters.values()
                    if p.kind is p.KEYWORD_ONLY and p.default is p.empty
                ]  # fmt: skip
                assert extra == [], (cls.__name__, name)
        assert "index" in inspect.signature(cls).parameters


def test_the_package_imports_one_way():
    folder = Path(runner.workers.__file__).parent
    assert sorted(p.stem for p in folder.glob("*.py")) == sorted([*ORDER, "__init__"])
    for position, name in enumerate(ORDER):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {
            node.module.split(".")[2]
            for node in ast.walk(tree)  # function-level imports too
            if isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("runner.workers.")
        }
        assert imported <= set(ORDER[:position]), (name, imported)
