"""``staleness-sim sweep``: run every point of a sweep file, in parallel, resumably.

Runs are grouped into batches (many small scenarios per task, so that process or Ray
overhead does not dominate) and executed by a local process pool (default) or Ray tasks.
Each finished batch is saved at once as a part file; at the end the parts are folded into
``DIR/results.parquet`` (one row per point and seed) and ``DIR/lag_hists.parquet``.
A row's metrics are exactly ``staleness-sim run --json`` for that scenario and seed.

Python use::

    from staleness_sim.sweeps.run import run_sweep
    out = run_sweep("configs/sweeps/paper_published.yaml", "runs/sweeps/paper", jobs=2)
    out.results.groupby("workers")["updates_per_hour"].mean()
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from staleness_sim import summary
from staleness_sim.config import ConfigError, validate
from staleness_sim.durations.kernel_threads import ENV as THREADS_ENV
from staleness_sim.sweeps.spec import Run, SweepSpec, axis_value, load_sweep, parse_sweep
from staleness_sim.sweeps.store import SWEEP_INFO, ResultStore, atomic_write

PLACEMENTS = ("local", "ray")  # where the runs execute (the runner's `placement` too)
Batch = list[tuple[str, dict[str, Any]]]  # (key, scenario) pairs


@dataclass
class SweepOutput:
    folder: Path
    results: pd.DataFrame  # one row per point and seed
    lag_hists: pd.DataFrame  # point, seed, key, lag, count
    ran: int  # runs simulated now
    reused: int  # runs found finished in the folder


# -- one batch (runs in a worker process or a Ray task) ---------------------------------


def result_row(key: str, scenario: dict[str, Any]) -> dict[str, Any]:
    """Simulate one scenario; its ``run --json`` summary, flattened for a table."""
    sc = validate(scenario, key)
    row: dict[str, Any] = {}
    for k, v in summary.run_summary(sc).items():
        # histograms and the success curve as JSON text: round-trip through Parquet, keys
        # become strings as in --json
        row[k] = json.dumps(v) if isinstance(v, dict | list) else v
    row["policy_label"] = summary.policy_label(sc)
    row["policy_kind"] = summary.policy_kind(sc)
    row["scenario"] = json.dumps(scenario, sort_keys=True)
    row["key"] = key
    return row


def run_batch(batch: Batch) -> list[dict[str, Any]]:
    return [result_row(key, scenario) for key, scenario in batch]


ADDED_COLUMNS = ("point", "policy_label", "policy_kind", "scenario", "key")


def summary_of_row(row: pd.Series | dict[str, Any]) -> dict[str, Any]:
    """Back from a results row to the ``run --json`` object, as ``json.loads`` would read it.

    A row is: point, axis columns, seed, then the summary's keys, then ADDED_COLUMNS.
    """
    row = dict(row)
    names = list(row)
    summary_cols = [c for c in names[names.index("seed") :] if c not in ADDED_COLUMNS]
    out = {k: row[k] for k in ["name", *(c for c in summary_cols if c != "name")]}
    for k, v in out.items():
        if isinstance(v, str) and (k.endswith("_hist") or k == "success_curve"):
            out[k] = json.loads(v)
    return json.loads(json.dumps(out, default=_plain))


def _plain(x: Any) -> Any:
    return x.item() if hasattr(x, "item") else str(x)


# -- placements -------------------------------------------------------------------------


def batch_size(n_runs: int, jobs: int) -> int:
    """About eight batches per worker (load balance against heavy tails), at most 32 runs."""
    return max(1, min(32, math.ceil(n_runs / (8 * jobs))))


def run_local(batches: list[Batch], jobs: int) -> Iterator[list[dict[str, Any]]]:
    if jobs == 1:  # in-process: no pool to start, and easy to debug
        for b in batches:
            yield run_batch(b)
        return
    import multiprocessing as mp

    # fork: workers inherit the imported modules, so a pool starts in milliseconds
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    # Workers ignore Ctrl-C: the parent alone handles it and terminates the pool (leaving the
    # with-block), so an interrupted pool cannot hang on a worker that died mid-handshake.
    with ctx.Pool(min(jobs, len(batches)), initializer=_pool_worker) as pool:
        yield from pool.imap_unordered(run_batch, batches)


def _pool_worker() -> None:
    """Ignores Ctrl-C, and simulates on one thread: the pool is the parallelism."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault(THREADS_ENV, "1")


def import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--placement ray needs Ray: pip install 'ray>=2.9' (or the ray extra)"
        ) from None
    return ray


def run_ray(batches: list[Batch], jobs: int) -> Iterator[list[dict[str, Any]]]:
    """Ray tasks; joins RAY_ADDRESS's cluster when set, else starts a local Ray with ``jobs`` CPUs."""
    ray = import_ray()
    import staleness_sim

    # The folder that holds the package (not the package itself: on PYTHONPATH, its
    # subpackage `queue` would shadow the standard library's and no worker would start).
    package_root = str(Path(staleness_sim.__file__).resolve().parent.parent)
    started = False
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:  # ship this package's code to the cluster (its dependencies must be there)
            env = {"py_modules": [staleness_sim], "env_vars": {THREADS_ENV: _task_threads()}}
            ray.init(address=address, runtime_env=env, log_to_driver=False)
        else:
            path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
            env = {"env_vars": {"PYTHONPATH": path, THREADS_ENV: _task_threads()}}
            ray.init(num_cpus=jobs, runtime_env=env, include_dashboard=False, log_to_driver=False)
        started = True
    task = ray.remote(num_cpus=1)(run_batch)
    pending = [task.remote(b) for b in batches]
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield ray.get(ref)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


def _task_threads() -> str:
    """A Ray task's threads: one (tasks take one CPU each), unless set here."""
    return os.environ.get(THREADS_ENV, "1")


# -- the sweep --------------------------------------------------------------------------


def run_sweep(
    sweep: SweepSpec | dict[str, Any] | str | Path,
    out: str | Path,
    jobs: int | None = None,
    placement: str = "local",
    yes: bool = False,
    progress: bool | None = None,
    batch: int | None = None,
    backend: str | None = None,
) -> SweepOutput:
    """Run every unfinished point of ``sweep`` into folder ``out``; return the results.

    Every point is validated before anything runs or is written; ``progress=None`` shows a
    bar only on a terminal. ``backend`` is the old name of ``placement`` (still taken).
    """
    spec = sweep if isinstance(sweep, SweepSpec) else _as_spec(sweep)
    placement = placement if backend is None else backend
    if placement not in PLACEMENTS:
        raise ConfigError(f"--placement: {placement!r} is not one of {', '.join(PLACEMENTS)}")
    jobs = jobs if jobs is not None else (len(os.sched_getaffinity(0)) or 1)
    if jobs < 1:
        raise ConfigError(f"--jobs: must be at least 1 (got {jobs})")
    if batch is not None and batch < 1:
        raise ConfigError(f"batch: must be at least 1 (got {batch})")
    runs = spec.runs(yes=yes)  # validates every point: nothing is written on error
    if placement == "ray":
        import_ray()
    folder = Path(out)
    store = ResultStore(folder)
    store.check_readable()
    with store.lock():
        return _run(spec, runs, store, jobs, placement, progress, batch)


def _run(
    spec: SweepSpec,
    runs: list[Run],
    store: ResultStore,
    jobs: int,
    placement: str,
    progress: bool | None,
    batch: int | None,
) -> SweepOutput:
    folder = store.folder
    done_keys = set(store.finished()["key"])
    # identical scenarios reached by two points (e.g. a repeated axis value) run once
    todo = list({r.key: r for r in runs if r.key not in done_keys}.values())
    if todo:
        size = batch or batch_size(len(todo), jobs)
        batches = [
            [(r.key, r.scenario) for r in todo[i : i + size]] for i in range(0, len(todo), size)
        ]
        execute = run_local if placement == "local" else run_ray
        from tqdm import tqdm

        bar = tqdm(
            total=len(todo),
            desc=spec.name,
            unit="run",
            file=sys.stderr,
            disable=None if progress is None else not progress,
            dynamic_ncols=True,
        )
        try:
            for rows in execute(batches, jobs):
                store.append(rows)  # saved at once: an interruption loses nothing finished
                bar.update(len(rows))
        finally:
            bar.close()
    table = store.consolidate(points_frame(spec, runs))
    atomic_write(folder / SWEEP_INFO, lambda p: p.write_text(json.dumps(spec.describe(), indent=2)))
    lags = pd.read_parquet(folder / "lag_hists.parquet")
    reused = sum(r.key in done_keys for r in runs)
    return SweepOutput(folder, table, lags, ran=len(todo), reused=reused)


def points_frame(spec: SweepSpec, runs: list[Run]) -> pd.DataFrame:
    """point, one column per axis (named by its dotted key), key: one row per run."""
    values = list(spec.points())
    rows = [
        {"point": r.point, **{k: axis_value(v) for k, v in values[r.point].items()}, "key": r.key}
        for r in runs
    ]
    return pd.DataFrame(rows, columns=["point", *spec.axes, "key"])


def _as_spec(sweep: dict[str, Any] | str | Path) -> SweepSpec:
    if isinstance(sweep, dict):
        return parse_sweep(sweep, source="sweep", folder=Path.cwd())
    return load_sweep(sweep)


# -- command line -----------------------------------------------------------------------


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep", type=Path, help="sweep YAML file (base, grid, zip, seeds)")
    p.add_argument("--out", type=Path, help="output folder (default: runs/sweeps/<sweep name>)")
    p.add_argument("--jobs", type=int, help="parallel processes or Ray CPUs (default: all cores)")
    p.add_argument(
        "--placement",
        choices=PLACEMENTS,
        help="local process pool (default) or Ray tasks (joins RAY_ADDRESS if set)",
    )
    p.add_argument("--backend", choices=PLACEMENTS, help="old name of --placement")
    p.add_argument("--batch", type=int, help="runs per task (default: about 8 tasks per worker)")
    p.add_argument("--yes", action="store_true", help="allow more than 100,000 runs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def sweep_command(args: argparse.Namespace) -> int:
    placement = args.placement or "local"
    if args.backend is not None:
        if args.placement not in (None, args.backend):
            raise ConfigError("--backend is the old name of --placement: give --placement only")
        print(
            "staleness-sim: --backend is now --placement (the old name works for now)",
            file=sys.stderr,
        )
        placement = args.backend
    spec = load_sweep(args.sweep)
    out = args.out or Path("runs") / "sweeps" / spec.name
    result = run_sweep(
        spec,
        out,
        jobs=args.jobs,
        placement=placement,
        yes=args.yes,
        progress=False if args.no_progress else None,
        batch=args.batch,
    )
    print(
        f"{spec.name}: {spec.n_runs} runs ({spec.n_points} points x {len(spec.run_seeds)} seeds); "
        f"simulated {result.ran}, reused {result.reused}; results in {out / 'results.parquet'}"
    )
    return 0
