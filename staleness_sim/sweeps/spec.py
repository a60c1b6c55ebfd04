"""Sweep files: a base scenario (plus fixed ``set`` overrides), ``grid`` axes (cartesian), ``zip`` axes (varied together),
``seeds`` (replicates). Parsing, validation of every point, and expansion into runs.

Everything here happens before anything runs or is written, so a bad sweep file costs
nothing: it raises :class:`ConfigError` with one line naming the axis and the field.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from staleness_sim.config import ConfigError, read_yaml, scenario_dict, validate, with_overrides

MAX_RUNS = 100_000  # more than this needs --yes
SWEEP_KEYS = ("name", "base", "set", "grid", "zip", "seeds")


@dataclass(frozen=True)
class Run:
    """One scenario at one seed: ``point`` indexes the axis values, ``key`` its full scenario."""

    point: int
    seed: int
    key: str
    scenario: dict[str, Any]


@dataclass
class SweepSpec:
    name: str
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    zips: list[dict[str, list[Any]]]
    seeds: list[int] | None  # None: the base scenario's own seed
    source: str = "sweep"

    @property
    def axes(self) -> list[str]:
        return list(self.grid) + [k for group in self.zips for k in group]

    @property
    def n_points(self) -> int:
        sizes = [len(v) for v in self.grid.values()]
        sizes += [len(next(iter(g.values()))) for g in self.zips]
        return math.prod(sizes)

    @property
    def run_seeds(self) -> list[int]:
        return self.seeds if self.seeds is not None else [int(self.base.get("seed", 0))]

    @property
    def n_runs(self) -> int:
        return self.n_points * len(self.run_seeds)

    def points(self) -> Iterator[dict[str, Any]]:
        """Axis values of every point, grid axes outermost, in the order written."""
        grid = [list(zip(itertools.repeat(k), v, strict=False)) for k, v in self.grid.items()]
        zips = [
            [list(zip(g.keys(), row, strict=True)) for row in zip(*g.values(), strict=True)]
            for g in self.zips
        ]
        for combo in itertools.product(*grid, *zips):
            values: dict[str, Any] = {}
            for item in combo:
                values.update([item] if isinstance(item, tuple) else item)
            yield values

    def runs(self, yes: bool = False) -> list[Run]:
        """Validate every point and return its runs; raises ConfigError on the first bad one."""
        check_size(self, yes)
        seeds = self.run_seeds
        out: list[Run] = []
        for i, values in enumerate(self.points()):
            where = f"{self.source}: point {i} ({describe_point(values)})"
            scenario = scenario_dict(validate(with_overrides(self.base, values), where))
            for seed in seeds:
                sc = {**scenario, "seed": seed}
                out.append(Run(point=i, seed=seed, key=scenario_key(sc), scenario=sc))
        return out

    def describe(self) -> dict[str, Any]:
        """Plain data saved beside the results (the report reads the axes from it)."""
        return {
            "name": self.name,
            "source": self.source,
            "axes": self.axes,
            "grid": self.grid,
            "zip": self.zips,
            "seeds": self.run_seeds,
            "points": self.n_points,
            "runs": self.n_runs,
            "base": self.base,
        }


def scenario_key(scenario: dict[str, Any]) -> str:
    """Stable hash of a full (validated, normalised) scenario including its seed."""
    text = json.dumps(scenario, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def describe_point(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in values.items())


def axis_value(value: Any) -> Any:
    """A value as stored in its axis column: scalars as they are, mappings/lists as JSON."""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return value


def check_size(spec: SweepSpec, yes: bool) -> None:
    n = spec.n_runs
    if n > MAX_RUNS and not yes:
        raise ConfigError(
            f"{spec.source}: {n:,} runs ({spec.n_points:,} points x {len(spec.run_seeds)} seeds) "
            f"is more than {MAX_RUNS:,}; pass --yes to run it anyway"
        )


# -- parsing --------------------------------------------------------------------------


def load_sweep(path: str | Path) -> SweepSpec:
    path = Path(path)
    return parse_sweep(read_yaml(path), source=str(path), folder=path.parent)


def parse_sweep(data: dict[str, Any], source: str = "sweep", folder: str | Path = ".") -> SweepSpec:
    """Check a sweep mapping's shape (not yet its points) and resolve its base scenario."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with keys {', '.join(SWEEP_KEYS)}")
    unknown = [k for k in data if k not in SWEEP_KEYS]
    if unknown:
        raise ConfigError(f"{source}: {unknown[0]}: unknown key (allowed: {', '.join(SWEEP_KEYS)})")
    if "base" not in data:
        raise ConfigError(f"{source}: base: required (a scenario mapping or a path to one)")
    base = _resolve_base(data["base"], source, Path(folder))
    fixed = data.get("set") or {}  # overrides applied to the base before the axes
    if not isinstance(fixed, dict):
        raise ConfigError(f"{source}: set: expected a mapping of dotted key -> value")
    base = with_overrides(base, fixed)
    grid = _axes(data.get("grid", {}), "grid", source)
    zips = _zips(data.get("zip"), source)
    seen: set[str] = set()
    for key in list(grid) + [k for g in zips for k in g]:
        if key in seen:
            raise ConfigError(f"{source}: axis {key!r} is given twice")
        seen.add(key)
    if not seen:
        raise ConfigError(
            f"{source}: grid: empty (give at least one axis with values in grid or zip)"
        )
    name = data.get("name", Path(source).stem if source != "sweep" else "sweep")
    if not isinstance(name, str):
        raise ConfigError(f"{source}: name: expected a string (got {name!r})")
    return SweepSpec(name, base, grid, zips, _seeds(data.get("seeds"), source), source)


def _resolve_base(base: Any, source: str, folder: Path) -> dict[str, Any]:
    if isinstance(base, dict):
        return base
    if not isinstance(base, str):
        raise ConfigError(f"{source}: base: expected a scenario mapping or a path (got {base!r})")
    # relative paths: the sweep file's folder first, then the current directory
    for candidate in (folder / base, Path(base)):
        if candidate.is_file():
            return read_yaml(candidate)
    raise ConfigError(f"{source}: base: no such file {base!r} (looked in {folder}/ and ./)")


def _axes(axes: Any, where: str, source: str) -> dict[str, list[Any]]:
    if axes is None:
        return {}
    if not isinstance(axes, dict):
        raise ConfigError(f"{source}: {where}: expected a mapping of dotted key -> list of values")
    out: dict[str, list[Any]] = {}
    for key, values in axes.items():
        if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
            raise ConfigError(f"{source}: {where}: axis {key!r} is not a dotted field name")
        if key == "seed" or key.startswith("seed."):
            raise ConfigError(f"{source}: {where}.seed: use the top-level seeds list instead")
        if not isinstance(values, list):
            raise ConfigError(
                f"{source}: {where}.{key}: expected a list of values (got {values!r})"
            )
        if not values:
            raise ConfigError(f"{source}: {where}.{key}: empty list of values")
        out[key] = values
    return out


def _zips(zips: Any, source: str) -> list[dict[str, list[Any]]]:
    """``zip`` is one mapping of equal-length lists, or a list of such groups."""
    if zips is None:
        return []
    groups = zips if isinstance(zips, list) else [zips]
    out = []
    for i, group in enumerate(groups):
        where = "zip" if not isinstance(zips, list) else f"zip[{i}]"
        axes = _axes(group, where, source)
        lengths = {k: len(v) for k, v in axes.items()}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k}: {n}" for k, n in lengths.items())
            raise ConfigError(f"{source}: {where}: axes must have equal lengths ({detail})")
        if axes:
            out.append(axes)
    return out


def _seeds(seeds: Any, source: str) -> list[int] | None:
    if seeds is None:
        return None
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = list(range(seeds))  # seeds: 3 means [0, 1, 2]
    ok = (
        isinstance(seeds, list)
        and seeds
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    )
    if not ok:
        raise ConfigError(
            f"{source}: seeds: expected a non-empty list of integers >= 0 or a count (got {seeds!r})"
        )
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{source}: seeds: repeated seed in {seeds!r}")
    return seeds
