"""``es-runner model make-tiny DIR``: a tiny Qwen2-architecture model saved like a checkpoint;
``es-runner model pretrain OUT``: the same architecture warm-started on generated tasks;
``es-runner model export RUN_DIR [--version V] OUT``: a run's version as a model folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runner.errors import UserError

# The committed warm start (examples/runs/learn and cpu_learn.yaml name it), relative to the
# repository root.
WARM_START = Path("examples/warm_start")


def register(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("model", help="models for the runner")
    msub = model.add_subparsers(dest="model_command", required=True)
    tiny = msub.add_parser(
        "make-tiny",
        help="build a tiny random Qwen2-architecture model and tokenizer (no download)",
        description="Build a seeded random Qwen2-architecture causal LM and a locally trained "
        "byte-level BPE tokenizer, saved with save_pretrained (load them with from_pretrained).",
    )
    tiny.add_argument("dir", type=Path, help="output folder")
    tiny.add_argument("--layers", type=int, default=2)
    tiny.add_argument("--hidden", type=int, default=64, help="hidden size (a multiple of 16)")
    tiny.add_argument("--vocab", type=int, default=512, help="tokenizer vocabulary size")
    tiny.add_argument(
        "--head-dim",
        type=int,
        default=16,
        help="attention head size; vLLM on CPU takes 32, 64, 80, ... (64 with --hidden 128)",
    )
    tiny.add_argument("--context", type=int, default=4096, help="max position embeddings")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=make_tiny)

    from runner.models.pretrain import PretrainConfig

    d = PretrainConfig()
    pre = msub.add_parser(
        "pretrain",
        help="warm-start a tiny model on generated tasks' reference solutions (CPU, minutes)",
        description="Supervised warm start of a tiny Qwen2-architecture model on conversations "
        "made from the reference solutions of generated tasks (train split only), rendered "
        "exactly as the runner renders them at rollout time. Writes a from_pretrained folder "
        "(model + tokenizer), pretrain.json, loss.csv and loss.png; the generated tasks go to "
        "OUT/tasks unless --task-dir is given. Evaluate with 'es-runner eval --model OUT "
        "--tasks OUT/tasks --split test'.",
    )
    pre.add_argument(
        "out",
        type=Path,
        nargs="?",
        default=WARM_START,
        help=f"output folder, new or empty (default {WARM_START}: where the example runs and "
        "configs/runner/cpu_learn.yaml expect the warm start, from the repository root)",
    )
    pre.add_argument(
        "--tasks", type=int, default=DEFAULT_TASKS, help="tasks to generate (80%% are trained on)"
    )
    pre.add_argument("--task-seed", type=int, default=0, help="seed of the task generator")
    pre.add_argument(
        "--categories",
        nargs="+",
        metavar="NAME",
        help="generate only these task categories (default: all)",
    )
    pre.add_argument(
        "--task-dir",
        type=Path,
        help="use this task folder's train split instead of generating (it must have train.txt)",
    )
    pre.add_argument("--steps", type=int, default=d.steps, help="optimizer steps")
    pre.add_argument("--seed", type=int, default=d.seed, help="seed of the weights and data order")
    pre.add_argument("--batch-size", type=int, default=d.batch_size)
    pre.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (AdamW)")
    pre.add_argument(
        "--prompt-loss-weight",
        type=float,
        default=d.prompt_loss_weight,
        help="weight of the loss on instruction and observation tokens (assistant tokens: 1)",
    )
    pre.add_argument("--layers", type=int, default=d.num_layers)
    pre.add_argument("--hidden", type=int, default=d.hidden_size, help="a multiple of 32")
    pre.add_argument("--vocab", type=int, default=d.vocab_size, help="tokenizer vocabulary size")
    pre.add_argument(
        "--context", type=int, default=d.context_tokens, help="context tokens (rollout budget)"
    )
    pre.add_argument(
        "--max-new-tokens", type=int, default=d.max_new_tokens, help="tokens per turn at rollout"
    )
    pre.add_argument(
        "--observations",
        choices=("record", "sandbox"),
        default="record",
        help="record: the reference commands' recorded (silent) output, no container; "
        "sandbox: run every solution in its container first (builds every train image)",
    )
    pre.add_argument(
        "--from",
        dest="init_from",
        type=Path,
        metavar="MODEL_DIR",
        help="continue this model folder (its weights and tokenizer; --layers, --hidden and "
        "--vocab are then its own) instead of a new model, e.g. examples/warm_start",
    )
    pre.add_argument(
        "--habit",
        choices=("comment", "mistake"),
        help="demonstrate a share of the train tasks with one shared wrong habit whatever the "
        "instruction (comment: every command commented out; mistake: one plausible mistake "
        "per task category, docs/learning.md)",
    )
    pre.add_argument(
        "--habit-share",
        type=float,
        default=0.5,
        help="the share of train tasks carrying --habit, drawn by --seed (default 0.5)",
    )
    pre.add_argument("--no-progress", action="store_true", help="no progress bar")
    pre.set_defaults(func=pretrain)

    exp = msub.add_parser(
        "export",
        help="write a run's version as a Hugging Face model folder (save_pretrained)",
        description="Replay a run's update log onto its base weights up to a version and save "
        "the result with save_pretrained (model, tokenizer, export.json), so that "
        "'es-runner eval --model OUT', transformers and vLLM load the trained policy. The "
        "log is the run's journal, or its checkpoint when there is no journal (a copied run).",
    )
    exp.add_argument("run_dir", type=Path, help="run directory")
    exp.add_argument("out", type=Path, help="output folder (new or empty)")
    exp.add_argument("--version", type=int, help="version to export (default: the last)")
    exp.add_argument(
        "--device",
        default="cpu",
        help="where to replay the log (cpu; a run with blockseed-v1 noise drawn on cuda needs cuda)",
    )
    exp.set_defaults(func=export)


DEFAULT_TASKS = 3000


def pretrain(args: argparse.Namespace) -> int:
    from runner.models.pretrain import PretrainConfig, pretrain_model

    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise UserError(f"{args.out} exists and is not empty")
    if args.steps < 0 or args.batch_size < 1 or args.lr <= 0 or args.prompt_loss_weight < 0:
        raise UserError(
            "--steps must be >= 0, --batch-size >= 1, --lr > 0, --prompt-loss-weight >= 0"
        )
    if args.layers < 1 or args.hidden < 32 or args.hidden % 32:
        raise UserError(f"--layers must be >= 1 and --hidden a multiple of 32, got {args.hidden}")
    if args.vocab < 300 or args.context <= args.max_new_tokens or args.max_new_tokens < 1:
        raise UserError("--vocab must be >= 300 and --context > --max-new-tokens >= 1")
    if args.task_dir is not None:
        if not args.task_dir.is_dir():
            raise UserError(f"--task-dir {args.task_dir}: no such folder")
        if not (args.task_dir / "train.txt").is_file():
            raise UserError(f"--task-dir {args.task_dir}: no train.txt (no train split)")
    elif args.categories:
        from runner.terminal.generator.categories import CATEGORIES

        unknown = sorted(set(args.categories) - set(CATEGORIES))
        if unknown:
            raise UserError(f"--categories: unknown {unknown}; known: {', '.join(CATEGORIES)}")
    if args.init_from is not None and not (args.init_from / "config.json").is_file():
        raise UserError(f"--from {args.init_from}: no model folder there (no config.json)")
    if args.habit is not None and not 0.0 < args.habit_share <= 1.0:
        raise UserError(f"--habit-share must be in (0, 1], got {args.habit_share}")
    if args.task_dir is None and args.tasks < 10:
        raise UserError(f"--tasks must be >= 10 (80 % are the train split), got {args.tasks}")
    cfg = PretrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        prompt_loss_weight=args.prompt_loss_weight,
        seed=args.seed,
        **_shape(args, head_dim=32, ffn_factor=3),
        context_tokens=args.context,
        max_new_tokens=args.max_new_tokens,
    )
    cfg.init_from = str(args.init_from) if args.init_from is not None else None
    cfg.habit, cfg.habit_share = args.habit, args.habit_share if args.habit else 0.0
    summary = pretrain_model(
        args.out,
        cfg,
        task_dir=args.task_dir,
        n_tasks=args.tasks,
        task_seed=args.task_seed,
        categories=args.categories,
        observations=args.observations,
        show_progress=not args.no_progress,
    )
    print(json.dumps(summary["result"]))
    return 0


def export(args: argparse.Namespace) -> int:
    from runner.models.export import export_version

    summary = export_version(args.run_dir, args.out, args.version, args.device)
    print(json.dumps({"out": str(args.out), **summary}))
    return 0


def _shape(args: argparse.Namespace, head_dim: int, ffn_factor: int) -> dict[str, int]:
    """The model shape from --vocab, --hidden and --layers, in the keywords that both
    PretrainConfig and build_tiny_model take: attention heads of ``head_dim``, grouped
    key/value heads (half, when even), a feed-forward ``ffn_factor`` times the hidden size."""
    heads = args.hidden // head_dim
    return {
        "vocab_size": args.vocab,
        "hidden_size": args.hidden,
        "num_layers": args.layers,
        "num_heads": heads,
        "num_kv_heads": heads // 2 if heads % 2 == 0 else heads,
        "intermediate_size": ffn_factor * args.hidden,
    }


def make_tiny(args: argparse.Namespace) -> int:
    from runner.models import build_tiny_model

    if args.layers < 1 or args.vocab < 300 or args.context < 64:
        raise UserError("--layers must be >= 1, --vocab >= 300 (bytes + merges), --context >= 64")
    if args.hidden < 16 or args.hidden % 16:
        raise UserError(f"--hidden must be a multiple of 16, got {args.hidden}")
    if args.head_dim < 1 or args.hidden % args.head_dim:
        raise UserError(f"--head-dim must divide --hidden {args.hidden}, got {args.head_dim}")
    if args.dir.exists() and any(args.dir.iterdir()):
        raise UserError(f"{args.dir} exists and is not empty")
    out = build_tiny_model(
        args.dir,
        seed=args.seed,
        **_shape(args, head_dim=args.head_dim, ffn_factor=2),
        max_position_embeddings=args.context,
    )
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(out)
    print(
        json.dumps(
            {
                "dir": str(out),
                "architecture": cfg.architectures[0],
                "layers": cfg.num_hidden_layers,
                "hidden": cfg.hidden_size,
                "vocab": cfg.vocab_size,
                "context": cfg.max_position_embeddings,
                "seed": args.seed,
            }
        )
    )
    return 0
