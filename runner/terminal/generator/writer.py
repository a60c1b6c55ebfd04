"""Generate N distinct tasks from a seed and write them with train/validation/test splits."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from runner.terminal.generator.categories import CATEGORIES
from runner.terminal.generator.spec import TaskSpec

SPLITS = (("train", 0.8), ("validation", 0.1), ("test", 0.1))


def generate_specs(
    n: int, seed: int, categories: list[str] | None = None
) -> list[tuple[str, TaskSpec]]:
    """``n`` distinct (task_id, spec) pairs, categories in rotation; same seed, same tasks."""
    names = categories or list(CATEGORIES)
    unknown = [c for c in names if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"unknown categories {unknown}; allowed: {', '.join(CATEGORIES)}")
    seen: set[str] = set()
    out: list[tuple[str, TaskSpec]] = []
    for i in range(n):
        category = names[i % len(names)]
        for attempt in range(100):
            rng = random.Random(f"{seed}:{i}:{attempt}")
            spec = CATEGORIES[category](rng)
            digest = hashlib.sha256(spec.identity().encode()).hexdigest()
            if digest not in seen:
                seen.add(digest)
                out.append((f"gen_{category}_{digest[:10]}", spec))
                break
        else:
            raise RuntimeError(f"could not draw a new distinct {category} task after 100 tries")
    return out


def interleave(ids: list[str], category: dict[str, str]) -> list[str]:
    """Categories in turn (each sorted), so the first K tasks of a split cover the categories
    evenly: what ``eval.max_tasks`` and ``--max-tasks`` take."""
    by_category: dict[str, list[str]] = {}
    for task_id in sorted(ids):
        by_category.setdefault(category[task_id], []).append(task_id)
    lists = [by_category[c] for c in sorted(by_category)]
    return [
        ids_[k] for k in range(max(map(len, lists), default=0)) for ids_ in lists if k < len(ids_)
    ]


def write_tasks(
    out_dir: str | Path, n: int, seed: int, categories: list[str] | None = None
) -> list[Path]:
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    specs = generate_specs(n, seed, categories)
    paths = [spec.write(root, task_id) for task_id, spec in specs]
    ids = [task_id for task_id, _ in specs]
    category = {task_id: spec.category for task_id, spec in specs}
    random.Random(seed).shuffle(ids)
    start = 0
    counts = {}
    for i, (name, frac) in enumerate(SPLITS):
        end = len(ids) if i == len(SPLITS) - 1 else start + round(frac * len(ids))
        chunk = interleave(ids[start:end], category)
        (root / f"{name}.txt").write_text("".join(t + "\n" for t in chunk))
        counts[name] = len(chunk)
        start = end
    (root / "manifest.json").write_text(
        json.dumps(
            {
                "seed": seed,
                "n": n,
                "splits": counts,
                "categories": sorted({spec.category for _, spec in specs}),
            },
            indent=2,
        )
        + "\n"
    )
    return paths
