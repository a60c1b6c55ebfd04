#!/usr/bin/env bash
# A tiny agent that learns on a laptop (docs/learning.md): the schedule table. ES from the
# habit warm start under each schedule and each training seed, then one table of held-out
# success (version 0 and the last), stale share, mean lag and wall time.
#
#   bash scripts/learn_on_laptop.sh [WORK_DIR]        (WORK_DIR default: runs/learn)
#
# Runs are WORK_DIR/<schedule>_s<seed>. A finished run is skipped and a stopped one resumed,
# so a stopped script picks up where it was. Version 0 (the warm start) is the same
# evaluation in every run (same model, tasks and seeds): the first runs evaluate it, it is
# kept as WORK_DIR/eval_base.parquet, and runs started after that skip it (eval.initial
# false; runner.learning_table reads it from there). Knobs (environment):
#   SCHEDULES    default "sync bounded cd4 cd8 cd8_half" (see policy() below)
#   TRAIN_SEEDS  default "0 1 2" (the runs' `seed`)
#   PARALLEL     runs at once (default 1); they share the cores, so each run's wall time
#                includes the others' load; runs are started seed by seed, all schedules of
#                a seed before the next seed, so a cut-short table is complete per seed
#   UPDATES, EVAL_TASKS   override the config's `updates` and `eval.max_tasks`
#   SETS         extra KEY=VALUE overrides for every run, space-separated
#   MODEL        the warm start (default examples/warm_start_habit, committed); a missing
#                one is built with `es-runner model pretrain MODEL $PRETRAIN_ARGS`
#   TASKS        the generated task folder (default examples/warm_start/tasks, not committed:
#                regenerated here from the same seed when missing)
#   EXPORT_TO    a folder: copy there every run's trace, evaluations (version 0 included)
#                and final ES checkpoint, and the table (examples/runs/learn was made so)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-runs/learn}"
model="${MODEL:-examples/warm_start_habit}"
tasks="${TASKS:-examples/warm_start/tasks}"
parallel="${PARALLEL:-1}"
mkdir -p "$work"

if [ ! -f "$tasks/manifest.json" ]; then
  # 70 MB, so not committed: the same seed writes the same tasks (the warm starts' split).
  echo "== tasks -> $tasks"
  es-runner tasks generate --n 3000 --seed 0 --out "$tasks"
fi
if [ ! -f "$model/pretrain.json" ]; then
  echo "== pretrain -> $model"
  # shellcheck disable=SC2086
  es-runner model pretrain "$model" ${PRETRAIN_ARGS:?MODEL $model is missing: set PRETRAIN_ARGS to build it (docs/learning.md)}
fi

policy() {
  case $1 in
    sync) echo "{kind: sync}" ;;
    bounded) echo "{kind: bounded, max_lag: 1, on_stale: drop}" ;;
    cd4) echo "{kind: controlled_delay, fraction: 0.1, delay: 4}" ;;
    cd8) echo "{kind: controlled_delay, fraction: 0.1, delay: 8}" ;;
    cd8_half) echo "{kind: controlled_delay, fraction: 0.5, delay: 8}" ;;
    *) echo "unknown schedule '$1' (sync, bounded, cd4, cd8, cd8_half)" >&2; return 2 ;;
  esac
}

keep_base() {  # a run's version-0 evaluation, kept once as the shared one
  [ -f "$work/eval_base.parquet" ] && return
  python - "$1/eval.parquet" "$work/eval_base.parquet" <<'EOF'
import sys
import pandas as pd
rows = pd.read_parquet(sys.argv[1])
if (rows["version"] == 0).any():
    rows[rows["version"] == 0].to_parquet(sys.argv[2] + ".tmp", index=False)
EOF
  [ -f "$work/eval_base.parquet.tmp" ] && mv "$work/eval_base.parquet.tmp" "$work/eval_base.parquet"
  return 0
}

run_one() {  # schedule seed
  local run="$work/$1_s$2" pol
  pol=$(policy "$1")
  if tail -n 1 "$run/journal.jsonl" 2>/dev/null | grep -q '"reason":"run ended"'; then
    echo "== $1 seed $2: finished in $run"
    keep_base "$run"
    return
  fi
  echo "== $1 seed $2 -> $run ($(date +%H:%M:%S))"
  if [ -f "$run/journal.jsonl" ]; then
    es-runner train --resume "$run" --no-progress
  else
    local sets=(--set "policy=$pol" --set "name=learn-$1" --set "seed=$2"
                --set "model.path=$model" --set "tasks.dir=$tasks")
    [ -f "$work/eval_base.parquet" ] && sets+=(--set "eval.initial=false")
    [ -n "${UPDATES:-}" ] && sets+=(--set "updates=$UPDATES")
    [ -n "${EVAL_TASKS:-}" ] && sets+=(--set "eval.max_tasks=$EVAL_TASKS")
    for extra in ${SETS:-}; do sets+=(--set "$extra"); done
    es-runner train configs/runner/cpu_learn.yaml --out "$run" --no-progress "${sets[@]}"
  fi
  keep_base "$run"
}

status=0
for seed in ${TRAIN_SEEDS:-0 1 2}; do
  for schedule in ${SCHEDULES:-sync bounded cd4 cd8 cd8_half}; do
    policy "$schedule" >/dev/null
    if [ "$parallel" -le 1 ]; then
      run_one "$schedule" "$seed" || status=1
    else
      while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || status=1; done
      run_one "$schedule" "$seed" >"$work/log_${schedule}_s$seed.txt" 2>&1 &
      echo "== $schedule seed $seed started (log: $work/log_${schedule}_s$seed.txt)"
    fi
  done
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || status=1; done
[ "$status" -eq 0 ] || { echo "a run failed: see its log in $work" >&2; exit 1; }

python -m runner.learning_table "$work"

if [ -n "${EXPORT_TO:-}" ]; then
  for run in "$work"/*_s[0-9]*; do
    [ -d "$run" ] || continue
    dest="$EXPORT_TO/$(basename "$run")"
    rm -rf "$dest" && mkdir -p "$dest/checkpoint"
    cp "$run"/{config.yaml,meta.json,summary.json,jobs.parquet,updates.parquet,workers.parquet,episodes.parquet,tasks_skipped.json,metrics.jsonl} "$dest/"
    cp "$run/checkpoint/es_checkpoint.json" "$dest/checkpoint/"
    # the copy's eval.parquet holds version 0 too (the shared base's rows where the run
    # skipped it), so that every exported run reads alone
    python -c 'import sys; from pathlib import Path; from runner.learning_table import run_evals
run_evals(Path(sys.argv[1])).to_parquet(sys.argv[2], index=False)' "$run" "$dest/eval.parquet"
  done
  cp "$work"/schedules*.csv "$work/eval_base.parquet" "$EXPORT_TO/"
  echo "exported to $EXPORT_TO ($(du -sh "$EXPORT_TO" | cut -f1))"
fi
