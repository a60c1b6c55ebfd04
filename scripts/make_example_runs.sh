#!/usr/bin/env bash
# Make the measured example runs committed in examples/runs/ (about 12 minutes on 2 cores).
#
#   bash scripts/make_example_runs.sh [WORK_DIR]
#
# Three runs of configs/runner/cpu_tiny.yaml for 20 updates (tiny random model, generated
# tasks, real containers): bounded max_lag 1 drop at G = 2, sync at G = 2, and bounded at
# G = 1 (with the G = 2 run it measures how the two workers share the CPU: the
# `contention` capacity in docs/validation.md). The full run directories stay in WORK_DIR
# (default runs/examples); examples/runs/ gets the trace, the per-episode records, the
# evaluation, the checkpoint and the config (kilobytes), not the transcripts or tasks.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-runs/examples}"
mkdir -p "$work"
[ -f models/tiny/config.json ] || es-runner model make-tiny models/tiny

train() {  # name, then --set assignments
  local name=$1
  shift
  if tail -n 1 "$work/$name/journal.jsonl" 2>/dev/null | grep -q '"reason":"run ended"'; then
    echo "== $name: already finished in $work/$name"
  else
    echo "== $name"
    rm -rf "${work:?}/$name"
    es-runner train configs/runner/cpu_tiny.yaml --out "$work/$name" --no-progress \
      --set updates=20 --set "name=${name//_/-}" "$@"
  fi
  local dest="examples/runs/$name"
  rm -rf "$dest"
  mkdir -p "$dest/checkpoint"
  cp "$work/$name"/{config.yaml,meta.json,summary.json,jobs.parquet,updates.parquet,workers.parquet,episodes.parquet,eval.parquet,tasks_skipped.json} "$dest/"
  cp "$work/$name/checkpoint/es_checkpoint.json" "$dest/checkpoint/"
  local sets=""
  for a in "$@"; do [[ $a == *" "* ]] && sets+=" '$a'" || sets+=" $a"; done
  cat >"$dest/README.md" <<EOF
# $name: a measured run (es-runner train, CPU, real containers)

Made by \`bash scripts/make_example_runs.sh\`, which ran

    es-runner model make-tiny models/tiny
    es-runner train configs/runner/cpu_tiny.yaml --out $work/$name --no-progress --set updates=20 --set name=${name//_/-}$sets

and copied here the trace (\`jobs\`, \`updates\`, \`workers.parquet\`, \`meta.json\`), the
per-episode records (\`episodes.parquet\`), the evaluation (\`eval.parquet\`), the ES
checkpoint and the resolved config. The model is a tiny random one, so every reward is 0;
the schedule and the timings are real. Read it with \`staleness-sim validate\`,
\`staleness_sim.core.trace.Trace.read\` or \`pandas.read_parquet\`.
EOF
}

train cpu_tiny_bounded
train cpu_tiny_sync --set 'policy={kind: sync}'
train cpu_tiny_g1 --set workers=1
echo "examples/runs/: $(du -sh examples/runs | cut -f1)"
