#!/usr/bin/env bash
# A tiny agent that learns on a laptop (docs/learning.md): warm-start a tiny model on the
# generated tasks' reference solutions, measure its held-out success, then run ES from it
# under four schedules and measure again.
#
#   bash scripts/learn_on_laptop.sh [WORK_DIR]        (WORK_DIR default: runs/learn)
#
# Steps are skipped when their output exists, so a stopped script picks up where it was.
# Knobs (environment): PRETRAIN_ARGS (extra `model pretrain` options), EVAL_SEEDS
# (default "1 2 3"), SCHEDULES (default "sync bounded cd4 cd8"), UPDATES (default: the
# config's), WARM_EVAL_TASKS (test tasks for the warm start's own evaluation, default 70:
# 5 per category), EVAL_TASKS (test tasks per evaluation during ES, default: the config's),
# EXPORT_TO (a folder: copy there the four runs' traces, evaluations and checkpoints, the
# warm start's evaluation and the table; examples/runs/learn was made so), SETS (extra
# KEY=VALUE overrides for every ES run, space-separated, e.g. "es.reward=graded
# es.noise=lowrank-v1-r4"), MODEL (the warm start's folder, default examples/warm_start),
# PARALLEL (non-empty: run the schedules at once, each logging to WORK_DIR/log_<schedule>.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-runs/learn}"
# The warm start: the committed one (examples/warm_start, which the example runs name), or
# MODEL=DIR to pretrain (or reuse) another.
model="${MODEL:-examples/warm_start}"
seeds=(${EVAL_SEEDS:-1 2 3})
mkdir -p "$work"

if [ ! -f "$model/pretrain.json" ]; then
  echo "== pretrain -> $model"
  rm -rf "$model"
  # shellcheck disable=SC2086
  es-runner model pretrain "$model" ${PRETRAIN_ARGS:-}
fi
if [ ! -f "$model/tasks/manifest.json" ]; then
  # The generated tasks are not committed (70 MB): the same seed writes the same tasks.
  read -r n seed cats < <(python - "$model/pretrain.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))["data"]["generated"]
print(g["n"], g["seed"], ",".join(g["categories"] or []))
PY
)
  echo "== tasks ($n, seed $seed) -> $model/tasks"
  es-runner tasks generate --n "$n" --seed "$seed" --out "$model/tasks" ${cats:+--categories "$cats"}
fi

if [ ! -f "$work/eval_pretrained.json" ]; then
  echo "== held-out success of the warm start"
  es-runner eval --model "$model" --tasks "$model/tasks" --split test --seeds "${seeds[@]}" \
    --max-tasks "${WARM_EVAL_TASKS:-70}" --json --out "$work/eval_pretrained.parquet" --no-progress \
    >"$work/eval_pretrained.json.tmp"
  mv "$work/eval_pretrained.json.tmp" "$work/eval_pretrained.json"
fi
cat "$work/eval_pretrained.json"

policy() {
  case $1 in
    sync) echo "{kind: sync}" ;;
    bounded) echo "{kind: bounded, max_lag: 1, on_stale: drop}" ;;
    cd4) echo "{kind: controlled_delay, fraction: 0.1, delay: 4}" ;;
    cd8) echo "{kind: controlled_delay, fraction: 0.1, delay: 8}" ;;
    *) echo "unknown schedule $1" >&2; exit 2 ;;
  esac
}

run_schedule() {
  local schedule=$1 run="$work/es_$1"
  if tail -n 1 "$run/journal.jsonl" 2>/dev/null | grep -q '"reason":"run ended"'; then
    echo "== $schedule: finished in $run"
    return
  fi
  echo "== ES under $schedule -> $run"
  local sets=(--set "policy=$(policy "$schedule")" --set "name=learn-$schedule"
        --set "model.path=$model" --set "tasks.dir=$model/tasks"
        --set "eval.seeds=[$(IFS=,; echo "${seeds[*]}")]")
  [ -n "${UPDATES:-}" ] && sets+=(--set "updates=$UPDATES")
  for extra in ${SETS:-}; do sets+=(--set "$extra"); done
  [ -n "${EVAL_TASKS:-}" ] && sets+=(--set "eval.max_tasks=$EVAL_TASKS")
  if [ -f "$run/journal.jsonl" ]; then
    es-runner train --resume "$run" --no-progress
  else
    es-runner train configs/runner/cpu_learn.yaml --out "$run" --no-progress "${sets[@]}"
  fi
}

if [ -n "${PARALLEL:-}" ]; then
  # All schedules at once, sharing the cores: each run's wall time then includes the others'
  # load (their relative order still compares them under equal conditions).
  pids=()
  for schedule in ${SCHEDULES:-sync bounded cd4 cd8}; do
    run_schedule "$schedule" >"$work/log_$schedule.txt" 2>&1 &
    pids+=($!)
  done
  status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  [ "$status" -eq 0 ] || { echo "a schedule failed: see $work/log_*.txt" >&2; exit 1; }
else
  for schedule in ${SCHEDULES:-sync bounded cd4 cd8}; do run_schedule "$schedule"; done
fi

python - "$work" <<'EOF'
"""One table: held-out success (the share of episodes that passed) per schedule at version
0 and at the last version (mean and spread over the evaluation seeds; the runs' own
evaluations, so the same tasks), and the gain with its standard error (per task, averaged
over the seeds; runner.evaluation.success_gain)."""
import json
import sys
from pathlib import Path

import pandas as pd

from runner.evaluation import success_gain

work = Path(sys.argv[1])
rows = []
for run in sorted(p for p in work.glob("es_*") if p.is_dir()):
    evals = pd.read_parquet(run / "eval.parquet")
    per_seed = evals.groupby(["version", "seed"])["passed"].mean().unstack()
    summary = json.loads((run / "summary.json").read_text())
    first, last = per_seed.index.min(), per_seed.index.max()
    gain = success_gain(evals, int(first), int(last))
    rows.append({"schedule": run.name[3:], "success_v0": per_seed.loc[first].mean(),
                 "version": int(last), "success": per_seed.loc[last].mean(),
                 "spread": per_seed.loc[last].std(ddof=0), "gain": gain["gain"],
                 "gain_se": gain["se"], "tasks": gain["tasks"],
                 "stale_fraction": summary["stale_fraction"], "mean_lag": summary["mean_lag"],
                 "minutes": summary["wall_clock_s"] / 60})
table = pd.DataFrame(rows)
print(table.to_string(index=False, float_format="{:.3f}".format))
table.to_csv(work / "schedules.csv", index=False)
EOF

if [ -n "${EXPORT_TO:-}" ]; then
  for run in "$work"/es_*; do
    dest="$EXPORT_TO/$(basename "$run")"
    rm -rf "$dest" && mkdir -p "$dest/checkpoint"
    cp "$run"/{config.yaml,meta.json,summary.json,jobs.parquet,updates.parquet,workers.parquet,episodes.parquet,eval.parquet,tasks_skipped.json} "$dest/"
    cp "$run/checkpoint/es_checkpoint.json" "$dest/checkpoint/"
  done
  cp "$work"/{eval_pretrained.json,eval_pretrained.parquet,schedules.csv} "$EXPORT_TO/"
  echo "exported to $EXPORT_TO ($(du -sh "$EXPORT_TO" | cut -f1))"
fi
