#!/usr/bin/env bash
# Make the measured runs across sessions per worker committed in
# examples/runs/across_concurrency/ (about 50 minutes on 2 cores; run nothing else meanwhile:
# their speed is what they measure).
#
#   bash scripts/make_concurrency_runs.sh [WORK_DIR]
#
# Five runs of configs/runner/cpu_tiny.yaml that differ only in concurrency C = 1, 2, 4, 8,
# 16, and a sixth at C = 4 with G = 2 workers (G2C4; benchmarks/across_workers.py): a 6-layer, hidden-384 random model (`es-runner model make-tiny`, the same weights
# every time), 64-token replies, G = 1 worker, 16 episodes a job, cohort 4, 3 updates
# (12 jobs, 192 episodes), 80 generated tasks, real containers. docs/turns.md ("Across
# concurrency") predicts each from another: python benchmarks/across_concurrency.py
# examples/runs/across_concurrency/C{1,2,4,8,16} --fit examples/runs/across_concurrency/C4
# The full run directories stay in WORK_DIR (default runs/concurrency); the copies get the
# trace, the per-episode and per-turn records and the config, not transcripts or tasks.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-runs/concurrency}"
mkdir -p "$work"
[ -f models/m6/config.json ] || es-runner model make-tiny --layers 6 --hidden 384 models/m6

for name in C4 C1 C2 C8 C16 G2C4; do  # C4 again with G = 2 workers: G2C4
  c=${name#C}; g=1
  [ "$name" = G2C4 ] && c=4 && g=2
  run="$work/$name"
  if tail -n 1 "$run/journal.jsonl" 2>/dev/null | grep -q '"reason":"run ended"'; then
    echo "== $name: already finished in $run"
  else
    echo "== $name"
    rm -rf "$run"
    es-runner train configs/runner/cpu_tiny.yaml --out "$run" --no-progress \
      --set model.path=models/m6 --set sampling.max_new_tokens=64 --set workers="$g" \
      --set episodes_per_job=16 --set concurrency="$c" --set cohort=4 --set updates=3 \
      --set eval_every=0 --set 'tasks.generate={n: 80, seed: 0}'
  fi
  dest="examples/runs/across_concurrency/$name"
  rm -rf "$dest"
  mkdir -p "$dest"
  cp "$run"/{config.yaml,meta.json,summary.json,jobs.parquet,updates.parquet,workers.parquet,episodes.parquet,tasks_skipped.json} "$dest/"
  # the model by its repository-relative path, not this machine's
  sed -i "s#$PWD/models/m6#models/m6#g" "$dest/config.yaml" "$dest/meta.json"
done
echo "examples/runs/across_concurrency/: $(du -sh examples/runs/across_concurrency | cut -f1)"
