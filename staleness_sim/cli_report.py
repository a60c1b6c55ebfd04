"""``staleness-sim report``: the report of a sweep folder, or of one run (a measured run
directory or a simulated ``--out`` folder: the worker timeline and its figures)."""

from __future__ import annotations

import argparse
from pathlib import Path

from staleness_sim.core.trace import Trace
from staleness_sim.summary import simulate_scenario
from staleness_sim.sweeps.report import report_command


def add_report(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "folder",
        type=Path,
        help="a sweep's output folder (results.parquet), or one run: a measured run "
        "directory or a simulated --out folder (the trace tables)",
    )
    p.add_argument("--out", type=Path, help="report folder (default: FOLDER/report)")
    p.add_argument("--format", choices=("md", "html", "both"), default="both")
    run = p.add_argument_group("one run")
    run.add_argument(
        "--predicted",
        type=Path,
        metavar="DIR",
        help="a simulated trace of the same run (e.g. staleness-sim run --from-run RUN_DIR "
        "--out DIR): its timeline is drawn beside the measured one",
    )
    run.add_argument(
        "--predict",
        action="store_true",
        help="simulate the prediction now (staleness-sim run --from-run FOLDER, defaults)",
    )
    run.add_argument(
        "--window",
        metavar="START:END",
        help="the timeline's span in seconds (default: the whole run, or a long run's first "
        "30 updates)",
    )


def report(args: argparse.Namespace) -> int:
    from staleness_sim.run_report import is_trace_folder, write_run_report

    if (args.folder / "results.parquet").exists():
        if args.predicted or args.predict or args.window:
            raise ValueError("--predicted, --predict and --window go with a run, not a sweep")
        return report_command(args)
    if not is_trace_folder(args.folder):
        raise ValueError(
            f"{args.folder}: no results.parquet (a sweep's) and no jobs.parquet (a run's)"
        )
    if args.predicted and args.predict:
        raise ValueError("give --predicted DIR or --predict, not both")
    predicted = None
    if args.predicted:
        predicted = Trace.read(args.predicted)
    elif args.predict:
        from staleness_sim.validation import scenario_from_run

        predicted = simulate_scenario(scenario_from_run(args.folder))
    formats = ("md", "html") if args.format == "both" else (args.format,)
    paths = write_run_report(args.folder, args.out, predicted, _window(args.window), formats)
    print(f"report written: {paths[0]}" + (f" (+{len(paths) - 1} files)" if len(paths) > 1 else ""))
    return 0


def _window(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        start, end = (float(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--window {text}: give START:END in seconds, e.g. 0:600") from None
    if not 0 <= start < end:
        raise ValueError(f"--window {text}: needs 0 <= START < END")
    return start, end
