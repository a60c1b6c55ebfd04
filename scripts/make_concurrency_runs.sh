#!/usr/bin/env bash
# Make the measured runs across sessions per worker committed in examples/runs/ (about 5
# minutes a run on 2 cores; run nothing else meanwhile: their speed is what they measure).
#
#   bash scripts/make_concurrency_runs.sh [WORK_DIR [DEST [NAME ...]]]
#
# Runs of configs/runner/cpu_tiny.yaml that differ only in concurrency and workers: NAME
# C<k> is C = k with G = 1 (a letter after it marks a repeat: C4b), G<g>C<k> is G = g
# workers at C = k (a letter after either marks a repeat: G2C4r). Every run: a 6-layer,
# hidden-384 random model (`es-runner model
# make-tiny`, the same weights every time), 64-token replies, 16 episodes a job, cohort 4,
# 3 updates (12 jobs, 192 episodes), 80 generated tasks, real containers (UPDATES=6 makes
# them twice as long). The committed sets were made with
#   bash scripts/make_concurrency_runs.sh runs/concurrency4 examples/runs/across_concurrency_4 \
#     C4 C1 C2 C8 C16 G2C4 C4r
#   UPDATES=3 bash scripts/make_concurrency_runs.sh runs/workers12 examples/runs/across_workers_12 \
#     G2C4 C4 G2C4r C4r G2C4s C4s
# and each is predicted from the others by
#   staleness-sim validate examples/runs/across_concurrency_4/{C4,C1,C2,C8,C16} --across \
#     --durations turns
# The full run directories stay in WORK_DIR (default runs/concurrency); the copies get the
# trace, the per-episode and per-turn records and the config, not transcripts or tasks.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-runs/concurrency}"
dest_root="${2:-examples/runs/across_concurrency}"
shift $(($# < 2 ? $# : 2))
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(C4 C1 C2 C8 C16 G2C4)
for name in "${names[@]}"; do  # every name checked before any run starts
  [[ "$name" =~ ^(G[0-9]+)?C[0-9]+[a-z]?$ ]] || {
    echo "make_concurrency_runs: $name is not [G<g>]C<k>[letter]" >&2
    exit 2
  }
done
mkdir -p "$work"
[ -f models/m6/config.json ] || es-runner model make-tiny --layers 6 --hidden 384 models/m6

for name in "${names[@]}"; do
  g=1
  [[ "$name" =~ ^G([0-9]+) ]] && g=${BASH_REMATCH[1]}
  [[ "$name" =~ C([0-9]+) ]] && c=${BASH_REMATCH[1]}
  run="$work/$name"
  if tail -n 1 "$run/journal.jsonl" 2>/dev/null | grep -q '"reason":"run ended"'; then
    echo "== $name: already finished in $run"
  else
    echo "== $name (C = $c, G = $g)"
    rm -rf "$run"
    es-runner train configs/runner/cpu_tiny.yaml --out "$run" --no-progress \
      --set model.path=models/m6 --set sampling.max_new_tokens=64 --set workers="$g" \
      --set episodes_per_job=16 --set concurrency="$c" --set cohort=4 --set updates="${UPDATES:-3}" \
      --set eval_every=0 --set 'tasks.generate={n: 80, seed: 0}'
  fi
  dest="$dest_root/$name"
  rm -rf "$dest"
  mkdir -p "$dest"
  cp "$run"/{config.yaml,meta.json,summary.json,jobs.parquet,updates.parquet,workers.parquet,episodes.parquet,tasks_skipped.json} "$dest/"
  # the model by its repository-relative path, not this machine's
  sed -i "s#$PWD/models/m6#models/m6#g" "$dest/config.yaml" "$dest/meta.json"
done
echo "$dest_root/: $(du -sh "$dest_root" | cut -f1)"
