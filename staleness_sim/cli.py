"""``staleness-sim``: run, compare and fit scenarios from the command line.

User mistakes exit with status 2 and one line on stderr naming the problem; no traceback.
Further subcommands register themselves through :data:`COMMANDS` (name -> (add, run)).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from staleness_sim.cli_report import add_report, report
from staleness_sim.config import ConfigError, Scenario, load_scenario
from staleness_sim.core.trace import TraceError
from staleness_sim.summary import compare_row, run_summary, simulate_scenario, trace_summary
from staleness_sim.sweeps.run import add_sweep_arguments, sweep_command
from staleness_sim.validation import DURATION_MODELS, VERSION_EFFECT, ModelOptions

USER_ERRORS = (ConfigError, TraceError, FileNotFoundError, ValueError)


# -- run ------------------------------------------------------------------------------


def _add_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="scenario YAML file (or --from-run RUN_DIR)")
    _add_from_run(p, many=False)
    _add_set(p)
    p.add_argument(
        "--out",
        type=Path,
        help="write jobs/updates/workers.parquet, meta.json and summary.json here",
    )
    p.add_argument(
        "--json", action="store_true", help="print exactly one JSON object (the summary) on stdout"
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="with --out: also write the run's report (timeline and figures) into OUT/report/",
    )


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field by dotted path, e.g. --set policy.max_lag=2 (repeatable)",
    )


def _add_from_run(p: argparse.ArgumentParser, many: bool) -> None:
    p.add_argument(
        "--from-run",
        dest="from_runs",
        action="append" if many else "store",
        default=[] if many else None,
        type=Path,
        metavar="RUN_DIR",
        help="build the scenario from a measured run: its fitted durations and measured costs"
        + (" (repeatable)" if many else ""),
    )
    _add_run_model(p, "with --from-run: ")


def _add_run_model(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """How a measured run becomes a scenario: shared by validate and --from-run."""
    p.add_argument(
        "--durations",
        choices=DURATION_MODELS,
        default="empirical",
        help=prefix + "job-duration model: the measured durations resampled (default), the "
        "family chosen by --criterion, fitted episodes composed into jobs, or the turn model "
        "(episodes of turns sharing one engine, fitted to the run: docs/turns.md)",
    )
    p.add_argument(
        "--criterion",
        choices=("aic", "bic"),
        default="aic",
        help=prefix + "how --durations fitted ranks the families (default aic)",
    )
    p.add_argument(
        "--version-effect",
        choices=VERSION_EFFECT,
        default="auto",
        help=prefix + "a duration factor shared by jobs of one version that start together "
        "(default auto: when the run's ANOVA test shows one)",
    )
    p.add_argument(
        "--capacity",
        type=float,
        metavar="C",
        help=prefix + "the workers shared one machine that runs C jobs at full speed "
        "(contention; measured durations become solo durations)",
    )
    _cores_flag(p, prefix)


def _cores(text: str) -> float | str:
    if text in ("run", "off"):
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of CPUs, run or off, got {text!r}") from None


def _cores_flag(p: argparse.ArgumentParser, prefix: str = "") -> None:
    p.add_argument(
        "--cores",
        type=_cores,
        default="run",
        metavar="K",
        help=prefix + "with --durations turns: the CPUs each worker's containers and engine "
        "shared, moment by moment (the job's cpu; docs/turns.md): run (default: from a CPU "
        "run's own record, its usable CPUs over its workers), a number, or off",
    )


def _options(args: argparse.Namespace) -> ModelOptions:
    """The command line's :class:`ModelOptions` (one place for every command)."""
    return ModelOptions(
        durations=args.durations,
        criterion=args.criterion,
        version_effect=getattr(args, "version_effect", "auto"),
        capacity=getattr(args, "capacity", None),
        cores=args.cores,
    )


def _from_run(folder: Path, args: argparse.Namespace, sets: list[str]) -> Scenario:
    from staleness_sim.validation import scenario_from_run

    return scenario_from_run(folder, sets, _options(args))


def _run(args: argparse.Namespace) -> int:
    if (args.config is None) == (args.from_runs is None):
        raise ConfigError("give a scenario file or --from-run RUN_DIR (exactly one)")
    if args.report and not args.out:
        raise ValueError("--report writes into the run's folder: give --out DIR")
    if args.from_runs is not None:
        scenario = _from_run(args.from_runs, args, args.sets)
    else:
        scenario = load_scenario(args.config, args.sets)
    trace = simulate_scenario(scenario)
    summary = trace_summary(scenario, trace)
    if args.out:
        trace.write(args.out)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.report:
        from staleness_sim.run_report import write_run_report

        paths = write_run_report(args.out)
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_summary(summary))
        if args.out:
            print(f"\ntrace written to {args.out}/")
    if args.report:
        print(f"report written: {paths[0]}", file=sys.stderr if args.json else sys.stdout)
    return 0


def format_summary(s: dict[str, Any]) -> str:
    hist = ", ".join(f"{k}: {v}" for k, v in s["lag_hist"].items()) or "-"
    rows = [
        ("scenario", s["name"]),
        ("wall clock", f"{s['wall_clock_s'] / 3600:.2f} h ({s['wall_clock_s']:.0f} s)"),
        ("updates", f"{s['updates']}  ({s['updates_per_hour']:.3g} per hour)"),
        ("results accepted", f"{s['results_accepted']}  ({s['results_per_hour']:.3g} per hour)"),
        ("results discarded", s["results_discarded"]),
        ("jobs completed", s["jobs_completed"]),
        ("data utilisation", f"{100 * s['data_utilization']:.1f} %"),
        ("worker idle", f"{100 * s['worker_idle_fraction']:.1f} %"),
        ("worker syncing", f"{100 * s['worker_sync_fraction']:.1f} %"),
        ("stale fraction", f"{100 * s['stale_fraction']:.1f} %"),
        ("lag mean / p99 / max", f"{s['mean_lag']:.3f} / {s['p99_lag']} / {s['max_lag']}"),
        ("lag histogram", hist),
    ]
    if "mean_staleness" in s:  # the queue pipeline
        rows += _queue_rows(s)
    if "success_final" in s:  # the success model (learning:)
        h = s["hours_to_success"]
        rows += [
            ("held-out success", f"{100 * s['success_initial']:.1f} % -> "
             f"{100 * s['success_final']:.1f} %"),
            ("hours to target", "never" if h is None else f"{h:.1f} h"),
        ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _queue_rows(s: dict[str, Any]) -> list[tuple[str, Any]]:
    closed = s.get("closed_form_staleness")
    return [
        ("rho (rollout / trainer)", "-" if s["rho"] is None else f"{s['rho']:.3f}"),
        ("M_tail", f"{s['m_tail']:.3f}"),
        (
            "mean staleness",
            f"{s['mean_staleness']:.3f}"
            + (f"  (queue-drop closed form: {closed:.3f})" if closed is not None else ""),
        ),
        ("trainer idle", f"{100 * s['trainer_idle_fraction']:.1f} %"),
        ("rollout idle", f"{100 * s['rollout_idle_fraction']:.1f} %"),
        ("samples dropped", s["samples_dropped"]),
        (
            "mean length generated / used",
            f"{s['mean_generated_duration']:.4g} / {s['mean_consumed_duration']:.4g}",
        ),
    ]


# -- compare --------------------------------------------------------------------------


def _add_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("configs", nargs="*", help="scenario YAML files (e.g. one per policy)")
    _add_from_run(p, many=True)
    _add_set(p)
    p.add_argument(
        "--workers",
        type=int,
        nargs="+",
        metavar="G",
        help="also run every config at these worker counts (default: each config's own)",
    )
    p.add_argument(
        "--policy",
        dest="policies",
        action="append",
        default=[],
        metavar="YAML",
        help="also run every config under this policy, e.g. --policy '{kind: bounded, max_lag: 2}'"
        " (repeatable; policy variants on one workload)",
    )
    p.add_argument("--json", action="store_true", help="print the table as a JSON list of rows")
    p.add_argument("--out", type=Path, help="also write the table to this CSV file")


def compare_table(scenarios: list[Scenario]) -> pd.DataFrame:
    """One row per scenario; speed-up is against the sync scenario at the same G if any,
    else against the first scenario at that G."""
    rows = [compare_row(sc, run_summary(sc)) for sc in scenarios]
    table = pd.DataFrame(rows)
    base = {}
    for g, group in table.groupby("G"):
        sync = group[group["policy"].str.startswith("sync")]
        base[g] = (sync if len(sync) else group)["hours"].iloc[0]
    table["speedup"] = [
        base[g] / h if h > 0 else math.nan for g, h in zip(table["G"], table["hours"], strict=True)
    ]
    return table


def _compare(args: argparse.Namespace) -> int:
    variants = [[]] + [[f"policy={p}"] for p in args.policies] if args.policies else [[]]
    if not args.configs and not args.from_runs:
        raise ConfigError("give scenario files and/or --from-run RUN_DIR")
    scenarios = []
    for g in args.workers or [None]:
        sets = args.sets + ([f"workers={g}"] if g is not None else [])
        scenarios += [load_scenario(c, sets + v) for c in args.configs for v in variants]
        scenarios += [_from_run(r, args, sets + v) for r in args.from_runs for v in variants]
    table = compare_table(scenarios)
    if args.out:
        table.to_csv(args.out, index=False)
    if args.json:
        print(json.dumps(table.to_dict(orient="records")))
    else:
        print(format_table(table))
    return 0


def format_table(table: pd.DataFrame) -> str:
    fmt = {
        "hours": "{:.1f}".format,
        "updates/h": "{:.3f}".format,
        "results/h": "{:.1f}".format,
        "idle %": "{:.1f}".format,
        "stale %": "{:.1f}".format,
        "mean lag": "{:.3f}".format,
        "util %": "{:.1f}".format,
        "speedup": "{:.2f}x".format,
        "success %": "{:.1f}".format,
    }
    if "h to target" in table.columns:  # to_string shows NaN before any formatter: never
        hours = table["h to target"].map(lambda h: "never" if h is None or h != h else f"{h:.1f}")
        table = table.assign(**{"h to target": hours})
    return table.to_string(index=False, formatters=fmt)


# -- fit ------------------------------------------------------------------------------


def _add_fit(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "data", type=Path, help="CSV or Parquet file of measured durations, or a trace folder"
    )
    p.add_argument(
        "--column",
        help="column of durations (default: the only numeric column; for a trace folder: "
        "jobs, the completed jobs' durations, or episodes)",
    )
    p.add_argument("--criterion", choices=("aic", "bic"), default="aic")
    p.add_argument("--plot", type=Path, help="write a goodness-of-fit figure (PNG) here")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--durations",
        choices=("family", "turns"),
        default="family",
        help="family: a duration law fitted by maximum likelihood (default); turns: the turn "
        "model of a run directory (its episodes and its engine's decode curve)",
    )
    _cores_flag(p)
    p.add_argument(
        "--learning",
        action="store_true",
        help="fit the success model (docs/success.md): DATA is a run directory (its "
        "eval.parquet curve along its own trace) or a scenario YAML (simulated, fitted to "
        "--endpoints)",
    )
    p.add_argument(
        "--endpoints",
        type=float,
        nargs=2,
        default=(0.093, 0.254),
        metavar=("INITIAL", "FINAL"),
        help="with --learning and a scenario: held-out success at version 0 and after the "
        "last update (default: the published sync run, 0.093 0.254)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=4,
        metavar="R",
        help="with --learning: model seeds the fitted mean curve averages (default 4)",
    )
    _add_set(p)


def _fit_turns(args: argparse.Namespace) -> int:
    from staleness_sim.validation import read_run
    from staleness_sim.validation.turn_fit import turn_job

    if not args.data.is_dir():
        raise ValueError(f"--durations turns fits a run directory, got {args.data}")
    run = read_run(args.data)
    options = ModelOptions(durations="turns", criterion=args.criterion, cores=args.cores)
    job, what = turn_job(run, cores=options.cores_of(run))
    if args.json:
        print(json.dumps({"job": job, "description": what}))
    else:
        print(what)
        shown = {k: job[k] for k in ("engine", "cpu") if k in job}
        print(yaml.safe_dump(shown, sort_keys=False).rstrip())
    return 0


def _fit(args: argparse.Namespace) -> int:
    from staleness_sim.durations import read_column
    from staleness_sim.validation.fitting import fit_durations

    if args.learning:
        from staleness_sim.cli_learning import fit_learning

        return fit_learning(args)
    if args.sets:
        raise ValueError("--set goes with --learning")
    if args.durations == "turns":
        return _fit_turns(args)
    if args.cores != "run":
        raise ValueError("--cores goes with --durations turns")
    censored = None
    if args.data.is_dir():
        values, censored = _trace_durations(args.data, args.column)
    else:
        values = read_column(args.data, args.column)
        values = values[~np.isnan(values)]  # empty cells are missing measurements
    result = fit_durations(values, criterion=args.criterion, censored=censored)
    if args.plot:
        result.plot(args.plot)
    best = result.best.model_dump(exclude_none=True)
    if args.json:
        print(
            json.dumps(
                {
                    "best": best,
                    "table": json.loads(result.table.to_json(orient="records")),
                    "n": int(values.size),
                    "censored": result.n_censored,
                }
            )
        )
    else:
        print(result.table.to_string(index=False))
        if result.n_censored:
            print(f"\n{result.n_censored} of {values.size} durations censored (cut by a timeout)")
        print(f"\nbest by {args.criterion.upper()}: {json.dumps(best)}")
    return 0


def _trace_durations(folder: Path, column: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Durations of a trace folder's completed jobs (cancelled ones are not durations), or
    with ``--column episodes`` of its episodes; a job or episode cut by its timeout is
    censored (a lower bound)."""
    from staleness_sim.validation import completed_jobs, job_durations, read_run

    run = read_run(folder)
    if column in (None, "jobs"):
        values, censored, _ = job_durations(run)
        return values, censored
    if column == "episodes":
        if run.episodes is None:
            raise ValueError(f"{folder}: no episodes.parquet")
        eps = run.episodes[run.episodes["job_id"].isin(set(completed_jobs(run)["job_id"]))]
        return (
            eps["duration_s"].to_numpy(dtype=float),
            eps["timed_out"].astype(bool).to_numpy(),
        )
    raise ValueError(f"--column for a trace folder: jobs or episodes (got {column!r})")


# -- validate -------------------------------------------------------------------------


def _add_validate(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
        help="a measured run (or any trace folder); several with --across",
    )  # fmt: skip
    p.add_argument(
        "--across",
        action="store_true",
        help="predict each run from each of the others (at the other's workers, sessions "
        "and cores), and the mean of each setting's runs from the others' (pooled)",
    )
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument(
        "--replicates", type=int, default=20, metavar="R", help="simulations (default 20)"
    )
    p.add_argument("--plot", type=Path, metavar="DIR", help="write the figures (PNG) here")
    _add_run_model(p)
    _add_set(p)


def _validate(args: argparse.Namespace) -> int:
    from staleness_sim.validation import validate_run, write_plots

    if args.across:
        return _validate_across(args)
    if len(args.run_dirs) > 1:
        raise ValueError(f"{len(args.run_dirs)} runs given: one, or several with --across")
    v = validate_run(args.run_dirs[0], args.replicates, _options(args), args.sets)
    paths = write_plots(v, args.plot) if args.plot else []
    if args.json:
        print(json.dumps(v.to_json()))
    else:
        print(v.format())
        for path in paths:
            print(f"figure: {path}")
    return 0


def _validate_across(args: argparse.Namespace) -> int:
    from staleness_sim.validation.across import compare_runs

    if args.plot:
        raise ValueError("--plot goes with one run, not --across")
    result = compare_runs(args.run_dirs, _options(args), args.replicates, args.sets)
    print(json.dumps(result.to_json()) if args.json else result.format())
    return 0


# -- entry point ----------------------------------------------------------------------

COMMANDS: dict[
    str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
] = {
    "run": ("simulate one scenario", _add_run, _run),
    "compare": ("simulate several scenarios side by side (the main job)", _add_compare, _compare),
    "fit": ("fit a duration model to measured durations by maximum likelihood", _add_fit, _fit),
    "validate": (
        "replay a measured run through the simulator and report each prediction's error",
        _add_validate,
        _validate,
    ),
    "sweep": (
        "run a sweep of scenarios in parallel, resumably",
        add_sweep_arguments,
        sweep_command,
    ),
    "report": (
        "write a report (Markdown, HTML, PNG figures) of a sweep, or of one run (simulated "
        "or measured: the worker timeline and its figures)",
        add_report,
        report,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="staleness-sim",
        description="Discrete-event simulator of asynchronous ES training: throughput, idle time, staleness.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, add, func) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add(p)
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as e:
        print(f"staleness-sim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("staleness-sim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
