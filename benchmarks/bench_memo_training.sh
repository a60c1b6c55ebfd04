#!/usr/bin/env bash
# The memo of repeated episodes (tasks.memo) in real training: configs/runner/cpu_learn.yaml
# (the habit warm start, sync, seed 0), UPDATES updates without evaluation, memo off, on,
# off, on (the same tasks and seeds each time). Per arm: the whole machine's CPU-seconds per
# training episode (/proc/stat, generation included: run it on an otherwise idle machine),
# the training wall time, how the episodes ran, the mismatches; then whether every job's
# reward is the same in every arm.
#
#   bash benchmarks/bench_memo_training.sh [WORK_DIR]     (default runs/bench_memo; UPDATES=4)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-runs/bench_memo}"
mkdir -p "$work"
: > "$work/results.jsonl"
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
for arm in off on off2 on2; do
  out="$work/$arm"
  rm -rf "$out"
  sets=(--set "updates=${UPDATES:-4}" --set eval_every=0 --set eval.initial=false)
  case $arm in on*) sets+=(--set "tasks.memo={audit: 0.1}") ;; esac
  b0=$(busy)
  es-runner train configs/runner/cpu_learn.yaml --out "$out" --no-progress "${sets[@]}" \
    >"$out.log" 2>&1
  b1=$(busy)
  python - "$out" "$b0" "$b1" "$work/results.jsonl" <<'EOF'
import json, os, sys
import pandas as pd
out, b0, b1, results = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
e = pd.read_parquet(f"{out}/episodes.parquet")
cpu = (b1 - b0) / os.sysconf("SC_CLK_TCK")
row = {"arm": os.path.basename(out), "episodes": len(e), "cpu_s_per_episode": round(cpu / len(e), 3),
       "train_wall_s": round(json.load(open(f"{out}/summary.json"))["wall_clock_s"], 1),
       "memo": e["memo"].value_counts().to_dict(), "mismatch": int(e["memo_mismatch"].sum())}
print(json.dumps(row))
with open(results, "a") as f:
    f.write(json.dumps(row) + "\n")
EOF
done
python - "$work" <<'EOF'
import sys
import pandas as pd
arms = {a: pd.read_parquet(f"{sys.argv[1]}/{a}/jobs.parquet").set_index("job_id")["reward"]
        for a in ("off", "on", "off2", "on2")}
same = all(arms["off"].equals(r) for r in arms.values())
print(f"every job's reward equal in all arms: {same} ({len(arms['off'])} jobs)")
EOF
