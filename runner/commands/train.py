"""``es-runner train`` and ``es-runner eval``: a real ES run, and held-out evaluation."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from runner.errors import UserError

log = logging.getLogger("runner")


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser(
        "train",
        help="train with ES on terminal tasks, driven by a scheduling policy",
        description="Train with ES on terminal tasks in Docker. The scheduling policy is the "
        "simulator's own; the run directory holds the same trace tables the simulator writes.",
    )
    train.add_argument("config", nargs="?", type=Path, help="run config YAML")
    train.add_argument("--out", type=Path, help="run directory (default runs/<name>-<time>)")
    train.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field by dotted path, e.g. --set policy.max_lag=2 (repeatable)",
    )
    train.add_argument("--resume", type=Path, metavar="RUN_DIR", help="resume a stopped run")
    train.add_argument("--no-progress", action="store_true", help="no live progress line")
    train.add_argument(
        "--precheck",
        nargs="?",
        const=3,
        type=int,
        metavar="UPDATES",
        help="a short run (3 updates unless given, no evaluation) that prints the pair "
        "disagreement and the share of slots where all members agree (runner.precheck)",
    )
    train.set_defaults(func=cmd_train)

    ev = sub.add_parser(
        "eval",
        help="evaluate a run's weights (a version), or a model folder, on held-out tasks",
        description="Evaluate the unperturbed weights of one version of a run on a task split; "
        "success per seed and the mean, written to RUN_DIR/eval.parquet. Or, with --model DIR "
        "--tasks TASK_DIR, a saved model folder (e.g. from 'es-runner model pretrain'): real "
        "episodes in containers, success per category and overall.",
    )
    ev.add_argument("run_dir", type=Path, nargs="?", help="run directory (or give --model)")
    ev.add_argument("--version", type=int, help="version to evaluate (default: the last)")
    ev.add_argument("--split", default=None, help="task split (default: the config's eval.split)")
    ev.add_argument("--seeds", type=int, nargs="+", help="sampling seeds (default: eval.seeds)")
    ev.add_argument("--max-tasks", type=int, help="only the first K tasks of the split")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    model = ev.add_argument_group(
        "a model folder", "evaluate a saved model instead of a run (defaults suit the tiny model)"
    )
    model.add_argument("--model", type=Path, metavar="DIR", help="a from_pretrained folder")
    model.add_argument("--tasks", type=Path, metavar="TASK_DIR", help="task folder with splits")
    model.add_argument("--temperature", type=float, default=0.6)
    model.add_argument("--top-p", type=float, default=1.0)
    model.add_argument("--max-turns", type=int, default=MODEL_EVAL["max_turns"])
    model.add_argument("--max-new-tokens", type=int, default=MODEL_EVAL["max_new_tokens"])
    model.add_argument("--context-tokens", type=int, default=MODEL_EVAL["context_tokens"])
    model.add_argument("--concurrency", type=int, default=MODEL_EVAL["concurrency"])
    model.add_argument("--command-timeout", type=float, default=MODEL_EVAL["command_timeout_s"])
    model.add_argument("--out", type=Path, metavar="FILE", help="write the rows (parquet)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.set_defaults(func=cmd_eval)


# What ``eval --model`` runs with unless told otherwise: the tiny model's rollout settings
# (configs/runner/cpu_learn.yaml).
MODEL_EVAL = {
    "max_turns": 8,
    "max_new_tokens": 160,
    "context_tokens": 1024,
    "concurrency": 4,
    "command_timeout_s": 10.0,
    "episode_timeout_s": 120.0,
}


# -- train ----------------------------------------------------------------------------------


def _open_run(args: argparse.Namespace):
    from runner.config import load_run_config, resolve_paths
    from runner.run_dir import RunDir
    from runner.tracking import check_sinks
    from staleness_sim.config import ConfigError

    if args.resume:
        if args.config or args.sets:
            raise UserError("--resume takes no config or --set: a resumed run keeps its config")
        run = RunDir.open(args.resume)
        run.lock()
        config = run.config()
        check_sinks(config.logging.to)
        return run, config
    if args.config is None:
        raise UserError("give a CONFIG, or --resume RUN_DIR")
    try:
        config = resolve_paths(load_run_config(args.config, args.sets))
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    model = Path(config.model.path)
    if not (model / "config.json").is_file():
        raise UserError(
            f"model.path {model}: no model there; build a tiny one with "
            f"'es-runner model make-tiny {model}', or point model.path at a saved checkpoint"
        )
    check_sinks(config.logging.to)  # a missing package: one line, before anything is made
    out = args.out or Path("runs") / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return RunDir.create(out, config), config


def _log_to(run) -> logging.Handler:
    handler = logging.FileHandler(run / "run.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
        for h in root.handlers:  # the console keeps its own level
            if h is not handler and h.level == logging.NOTSET:
                h.setLevel(logging.WARNING)
    return handler


def task_folder(run, config) -> Path:
    """The run's task folder; generated tasks are written into the run directory once."""
    if config.tasks.dir is not None:
        return Path(config.tasks.dir)
    from runner.terminal.generator.writer import write_tasks

    folder = run / "tasks"
    gen = config.tasks.generate
    if not (folder / "manifest.json").is_file():
        try:
            write_tasks(folder, gen.n, gen.seed, gen.categories)
        except ValueError as exc:
            raise UserError(f"tasks.generate: {exc}") from None
    return folder


def prepare_pool(folder: Path, split: str, builder, limit=None, what="tasks", show=True, only=None):
    from tqdm import tqdm

    from runner.task_pool import TaskPool, split_ids

    total = len(split_ids(folder, split)[:limit]) if only is None else len(only)
    with tqdm(
        total=total, desc=f"building {what}", unit="task", leave=False, disable=not show
    ) as bar:
        return TaskPool.prepare(folder, split, builder, limit=limit, only=only, progress=bar.update)


def cmd_train(args: argparse.Namespace) -> int:
    from runner.evaluation import Evaluator
    from runner.orchestrator import Orchestrator, RunFailed
    from runner.progress import Progress
    from runner.rollouts import docker_client
    from runner.terminal import reaper
    from runner.terminal.images import ImageBuilder
    from runner.tracking import Tracker

    if args.precheck is not None:
        if args.resume is not None or args.precheck < 1:
            raise UserError("--precheck takes a number of updates >= 1 and no --resume")
        args.sets = [*args.sets, f"updates={args.precheck}", "eval_every=0"]
    run, config = _open_run(args)
    handler = _log_to(run)
    tracker = None
    try:
        tracker = Tracker.open(run.path, config)
        client = docker_client()
        reaper.reap_orphans(client)  # containers of a process that died (a killed run)
        builder = ImageBuilder(client)
        folder = task_folder(run, config)
        only = None
        if config.tasks.signal is not None:  # scored once, kept in the run directory
            from runner.models.task_scores import signal_task_ids

            only = signal_task_ids(run, config, folder, show_progress=not args.no_progress)
            band = config.tasks.signal
            print(
                f"es-runner: tasks.signal: training on {len(only)} {config.tasks.split} task(s) "
                f"with predicted success in [{band.min:g}, {band.max:g}] (scores: "
                f"{run / 'task_scores.parquet'})"
            )
        pool = prepare_pool(
            folder, config.tasks.split, builder, show=not args.no_progress, only=only
        )
        run.write_json("tasks_skipped.json", [s.__dict__ for s in pool.skipped])
        if pool.skipped:
            print(
                f"es-runner: {len(pool.skipped)} task(s) skipped (see {run / 'tasks_skipped.json'})"
            )
        evaluator = None
        if config.eval_every:
            eval_pool = prepare_pool(
                folder,
                config.eval.split,
                builder,
                config.eval.max_tasks,
                "eval tasks",
                show=not args.no_progress,
            )
            evaluator = Evaluator(run, config, eval_pool, client, builder, tracker)
        progress = Progress(config.updates, enabled=not args.no_progress)
        orch = Orchestrator(
            run, config, pool, client, builder, progress=progress, evaluator=evaluator,
            tracker=tracker,
        )  # fmt: skip
        try:
            outcome = orch.run()
        except RunFailed as exc:
            print(f"es-runner: run failed: {exc}")
            return 1
        finally:
            if evaluator is not None:
                if orch.state.finished and evaluator.pending():
                    print(f"es-runner: finishing {evaluator.pending()} evaluation(s)")
                evaluator.close(wait=orch.state.finished)
        print(f"{outcome.status}: version {outcome.version} of {config.updates} ({outcome.reason})")
        print(format_run_table(run, config))
        print(precheck_line(run))
        print(f"run directory: {run.path}")
        return {"finished": 0, "interrupted": 130}.get(outcome.status, 1)
    finally:
        if tracker is not None:
            tracker.close()
        logging.getLogger().removeHandler(handler)
        handler.close()
        run.unlock()


def format_run_table(run, config) -> str:
    """The run's trace summarised with the columns of ``staleness-sim compare``."""
    import pandas as pd

    from staleness_sim.cli import format_table
    from staleness_sim.core.metrics import summarize
    from staleness_sim.core.trace import Trace
    from staleness_sim.summary import compare_row

    row = compare_row(config, summarize(Trace.read(run.path)))
    return format_table(pd.DataFrame([row]))


def precheck_line(run) -> str:
    """The pre-check figures of the run's updates (runner.precheck)."""
    from runner.precheck import summary_line
    from staleness_sim.core.trace import Trace

    updates = Trace.read(run.path).updates
    if "pair_disagreement" not in updates:  # a run made before the figures were recorded
        return "pre-check: not recorded in this run"
    return summary_line(list(updates["pair_disagreement"]), list(updates["slots_all_agree"]))


# -- eval -----------------------------------------------------------------------------------


def cmd_eval(args: argparse.Namespace) -> int:
    if args.model is not None or args.tasks is not None:
        return cmd_eval_model(args)
    if args.run_dir is None:
        raise UserError("give a RUN_DIR, or --model DIR --tasks TASK_DIR")
    from runner.evaluation import success_table
    from runner.orchestrator import replay_log
    from runner.rollouts import docker_client
    from runner.run_dir import RunDir
    from runner.terminal import reaper
    from runner.terminal.images import ImageBuilder
    from runner.tracking import check_sinks

    run = RunDir.open(args.run_dir)
    config = run.config()
    check_sinks(config.logging.to)  # before the evaluation, not after it
    log_ = replay_log(run)
    version = len(log_) if args.version is None else args.version
    if not 0 <= version <= len(log_):
        raise UserError(f"--version {version}: the run has versions 0..{len(log_)}")
    split = args.split or config.eval.split
    seeds = args.seeds or config.eval.seeds
    client = docker_client()
    reaper.reap_orphans(client)
    builder = ImageBuilder(client)
    pool = prepare_pool(
        task_folder(run, config),
        split,
        builder,
        args.max_tasks or config.eval.max_tasks,
        show=not args.no_progress,
    )
    rows = _evaluate_weights(config, pool, log_[:version], version, split, seeds, client, builder)
    run.merge_eval(rows)
    _track_eval(run, config, rows)
    table = success_table(rows)
    result = {
        "version": version,
        "split": split,
        "tasks": len(pool),
        "per_seed": {int(r.seed): float(r.success) for r in table.itertuples()},
        "success": float(table["success"].mean()),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(table.to_string(index=False, float_format="{:.3f}".format))
        print(
            f"mean success over {len(seeds)} seed(s): {result['success']:.3f} ({len(pool)} tasks)"
        )
    return 0


def _track_eval(run, config, rows) -> None:
    """Send an evaluation to the run's trackers (its ``logging.to``), as training does."""
    from runner.tracking import Tracker

    tracker = Tracker.open(run.path, config)
    if tracker is not None:
        try:
            tracker.evaluated(rows)
        finally:
            tracker.close()


def _evaluate_weights(config, pool, log_, version, split, seeds, client, builder):
    """Rows of ``eval.parquet`` for the weights at ``version`` (the base weights + ``log_``)."""
    import threading

    from runner.evaluation import eval_worker, evaluate
    from runner.terminal import reaper

    worker = eval_worker(config, client, builder)
    abort = threading.Event()
    try:
        worker.sync(log_)
        return evaluate(worker, pool, version=version, split=split, seeds=seeds, abort=abort)
    except KeyboardInterrupt:
        abort.set()
        reaper.remove_all_live()
        raise
    finally:
        worker.close()


def model_eval_config(args: argparse.Namespace):
    """A one-worker run config holding ``eval --model``'s model, sampling and episode settings.

    The evaluation then goes through exactly the code a run's evaluation takes
    (:func:`runner.evaluation.evaluate`: the backend, the session batcher, the rollouts).
    """
    from runner.config import validate_run
    from staleness_sim.config import ConfigError

    data = {
        "name": "eval-model",
        "workers": 1,
        "cohort": 1,
        "updates": 1,
        "policy": {"kind": "sync"},
        "model": {"backend": "hf", "path": str(args.model.resolve()), "device": "cpu"},
        "sampling": {
            "temperature": args.temperature,
            "top_p": args.top_p,
            "max_new_tokens": args.max_new_tokens,
        },
        "tasks": {"dir": str(args.tasks.resolve()), "split": args.split or "test"},
        "episodes_per_job": 1,
        "concurrency": args.concurrency,
        "max_turns": args.max_turns,
        "context_tokens": args.context_tokens,
        "command_timeout_s": args.command_timeout,
        "episode_timeout_s": MODEL_EVAL["episode_timeout_s"],
    }
    try:
        return validate_run(data, "eval --model")
    except ConfigError as exc:  # e.g. "eval --model: sampling.max_new_tokens: ..."
        raise UserError(str(exc)) from None


def model_training_tasks(model: Path) -> set[str]:
    """Task ids the model was warm-started on (``pretrain.json``), if it says."""
    meta = model / "pretrain.json"
    if not meta.is_file():
        return set()
    try:
        return set(json.loads(meta.read_text()).get("data", {}).get("train_task_ids", []))
    except (OSError, ValueError, AttributeError):
        return set()


def cmd_eval_model(args: argparse.Namespace) -> int:
    """``es-runner eval --model DIR --tasks TASK_DIR``: success per category and overall."""
    from runner.rollouts import docker_client
    from runner.terminal import reaper
    from runner.terminal.images import ImageBuilder

    split = _check_model_eval_args(args)
    config = model_eval_config(args)
    seeds = args.seeds or [42]
    client = docker_client()
    reaper.reap_orphans(client)
    builder = ImageBuilder(client)
    pool = prepare_pool(args.tasks, split, builder, args.max_tasks, show=not args.no_progress)
    seen = model_training_tasks(args.model) & set(pool.by_id)
    if seen:
        print(
            f"es-runner: warning: {len(seen)} of the {len(pool)} evaluated tasks are in the "
            f"model's training data ({args.model / 'pretrain.json'})",
            file=sys.stderr,
        )
    rows = _evaluate_weights(config, pool, [], 0, split, seeds, client, builder)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        rows.drop(columns=["version"]).assign(model=str(args.model)).to_parquet(args.out)
    result = _model_eval_result(args, split, pool, seeds, rows, len(seen))
    print(json.dumps(result) if args.json else _format_model_eval(result))
    return 0


def _check_model_eval_args(args: argparse.Namespace) -> str:
    """The split to evaluate, once every argument of ``eval --model`` is checked (one line)."""
    from runner.task_pool import SPLITS, split_ids

    if args.run_dir is not None:
        raise UserError("give either RUN_DIR or --model DIR --tasks TASK_DIR, not both")
    if args.version is not None:
        raise UserError("--version belongs to a run directory; a model folder has one version")
    if args.model is None or args.tasks is None:
        raise UserError("--model DIR and --tasks TASK_DIR go together")
    if not (args.model / "config.json").is_file():
        what = "no such folder" if not args.model.is_dir() else "no config.json in it"
        raise UserError(f"--model {args.model}: not a model folder ({what})")
    if not args.tasks.is_dir():
        raise UserError(f"--tasks {args.tasks}: no such folder")
    split = args.split or "test"
    if split != "all" and not (args.tasks / f"{split}.txt").is_file():
        have = [s for s in SPLITS if (args.tasks / f"{s}.txt").is_file()]
        raise UserError(
            f"--split {split}: {args.tasks} has no {split}.txt "
            f"(splits there: {', '.join(have) or 'none'}; or --split all)"
        )
    if not split_ids(args.tasks, split):
        raise UserError(f"--split {split}: {args.tasks}/{split}.txt lists no task")
    for name, value in (("--max-turns", args.max_turns), ("--concurrency", args.concurrency)):
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    if args.max_tasks is not None and args.max_tasks < 1:
        raise UserError(f"--max-tasks must be >= 1, got {args.max_tasks}")
    return split


def _model_eval_result(args, split, pool, seeds, rows, seen: int) -> dict:
    """What ``eval --model`` reports (``--json`` prints it as it is)."""
    from runner.evaluation import success_table

    table = success_table(rows)
    per_category = rows.groupby("category")["passed"].mean()
    return {
        "model": str(args.model),
        "tasks": str(args.tasks),
        "split": split,
        "n_tasks": len(pool),
        "skipped": len(pool.skipped),
        "seeds": list(seeds),
        "per_seed": {int(r.seed): float(r.success) for r in table.itertuples()},
        "per_category": {str(k): float(v) for k, v in per_category.items()},
        "success": float(table["success"].mean()),
        "episodes": len(rows),
        "errors": int(rows["error"].notna().sum()),
        "seen_in_training": seen,
        "settings": {
            "temperature": args.temperature,
            "top_p": args.top_p,
            "max_turns": args.max_turns,
            "max_new_tokens": args.max_new_tokens,
            "context_tokens": args.context_tokens,
        },
    }


def _format_model_eval(result: dict) -> str:
    """The table a person reads: success per category, per seed, and overall."""
    width = max([len("category"), *map(len, result["per_category"])])
    lines = [f"{'category':<{width}}  success"]
    lines += [f"{cat:<{width}}  {value:.3f}" for cat, value in result["per_category"].items()]
    per_seed = ", ".join(f"{k}: {v:.3f}" for k, v in result["per_seed"].items())
    lines.append(f"per seed: {per_seed}")
    lines.append(
        f"success {result['success']:.3f} over {result['n_tasks']} {result['split']} tasks "
        f"x {len(result['seeds'])} seed(s)"
    )
    return "\n".join(lines)
