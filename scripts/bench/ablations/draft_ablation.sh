#!/usr/bin/env bash
# Draft-LM distillation ablation on the reference target (issue 6's table): the quick recipe
# (configs/runs/smollm2-draft-quick.yaml: 6 strided layers, 50 steps x 4 sequences, 600 answers) trained
# with each loss — forward KL, reverse KL, total variation, JSD(0.5) — with a quarter of every batch
# on-policy, and forward KL without on-policy data: the same steps, batch and data for every row.
# Plus the untrained student (0 steps). Each is evaluated for τ on the same Spec-Bench prompts (bf16,
# T=0, chain of 4, no timing baselines); the table also keeps each row's last validation top-1.
#   bash scripts/bench/ablations/draft_ablation.sh [OUT]        (default runs/draft-ablation; ~30 min on 2 idle CPU cores)
# Writes OUT/<row>/ (a full pipeline run folder each), OUT/table.json and OUT/report/.
# Rerunning skips finished rows (pipeline stages are resumable). Env: LIMIT (prompts, default 24),
# TOKENS (new tokens per prompt, default 64), PARALLEL (rows at once, default 1).
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-runs/draft-ablation}
LIMIT=${LIMIT:-24}
TOKENS=${TOKENS:-64}
PARALLEL=${PARALLEL:-1}
[ -x .venv/bin/draftsmith ] || bash scripts/setup_venv.sh
mkdir -p "$OUT"

row() {  # name, overrides...
  local name=$1; shift
  .venv/bin/draftsmith pipeline -c configs/runs/smollm2-draft-quick.yaml --out "$OUT/$name" \
    "eval.limit=$LIMIT" "eval.max_new_tokens=$TOKENS" eval.baselines=false "log.progress=false" "$@" \
    > "$OUT/$name.log" 2>&1 && echo "[ablation] $name done" || { echo "[ablation] $name FAILED: see $OUT/$name.log"; return 1; }
}

ROWS=("fkl drafter.loss=kl"
      "rkl drafter.loss=rkl"
      "tvd drafter.loss=tvd"
      "jsd drafter.loss=jsd drafter.jsd_beta=0.5"
      "fkl-no-onpolicy drafter.loss=kl train.onpolicy_ratio=0"
      "untrained train.max_steps=0")
running=0
for spec in "${ROWS[@]}"; do
  # shellcheck disable=SC2086
  row $spec &
  running=$((running + 1))
  if [ "$running" -ge "$PARALLEL" ]; then wait -n; running=$((running - 1)); fi
done
wait

.venv/bin/python scripts/bench/ablations/ablation_table.py "$OUT" fkl rkl tvd jsd fkl-no-onpolicy untrained
.venv/bin/draftsmith report "$OUT"/*/eval/summary.json --out "$OUT/report" > /dev/null
echo "[ablation] table: $OUT/table.json, report: $OUT/report/report.md"
