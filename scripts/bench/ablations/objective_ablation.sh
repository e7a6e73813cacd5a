#!/usr/bin/env bash
# Training objective ablation for EAGLE-3 at equal budget (issue: an acceptance-aimed objective beside KL): the
# EAGLE-3 recipe (configs/runs/smollm2-eagle3.yaml: layers 2/15/27, TTT 3, 16k draft vocabulary, top-64 target
# logits) on the first ANSWERS answers for STEPS steps, once per objective of the one divergence module
# (heads/losses.py): forward KL, total variation (1 - acceptance), negative log-acceptance and the LK hybrid.
# Same data, steps, batch, lr and seed for every row; each drafter is the last step's (no selection), judged for
# tau on the same Spec-Bench prompts (bf16, T=0, no timing) with the recipe's 16-node dynamic tree and a chain of 5.
#   bash scripts/bench/ablations/objective_ablation.sh [OUT]      (default runs/objective-ablation)
# Env: STEPS (default 300; ~3 s per step here), ANSWERS (default 2000), LIMIT (prompts, default 40), TOKENS
# (default 128), LOSSES (default "kl tvd nla lk_hybrid"), RECIPE (default smollm2-eagle3), EXTRA (more overrides).
# Resumable: finished rows and evals are skipped. Writes OUT/<loss>/ (pipeline runs) and OUT/table.json, which holds
# every finished row under OUT -- this call's and earlier calls' (LOSSES=tvd after the others adds a row, not a table).
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-runs/objective-ablation}
STEPS=${STEPS:-300}
ANSWERS=${ANSWERS:-2000}
LIMIT=${LIMIT:-40}
TOKENS=${TOKENS:-128}
LOSSES=${LOSSES:-kl tvd nla lk_hybrid}
RECIPE=${RECIPE:-smollm2-eagle3}
read -r -a extra <<< "${EXTRA:-}"
[ -x .venv/bin/draftsmith ] || bash scripts/setup_venv.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "$OUT"
for loss in $LOSSES; do
  run="$OUT/$loss"
  .venv/bin/draftsmith pipeline -c "$RECIPE" --out "$run" "drafter.loss=$loss" "data.limit=$ANSWERS" \
    "train.max_steps=$STEPS" train.select=last train.eval_every=0 "eval.limit=$LIMIT" "eval.max_new_tokens=$TOKENS" \
    eval.baselines=false export.formats=[] log.progress=false "${extra[@]}" > "$run.log" 2>&1 \
    || { echo "[ablation] $loss FAILED: see $run.log"; exit 1; }
  [ -f "$run/eval-chain-5/summary.json" ] || .venv/bin/draftsmith eval --drafter "$run/drafter" --prompts spec-bench \
    --limit "$LIMIT" --max-new-tokens "$TOKENS" --dtype "${DTYPE:-auto}" --tree chain-5 --out "$run/eval-chain-5" \
    eval.baselines=false drafter.plan=false log.progress=false "${extra[@]}" >> "$run.log" 2>&1
  echo "[ablation] $loss done"
done
# shellcheck disable=SC2086
rows=$(printf '%s\n' kl tvd nla lk_hybrid $LOSSES | awk '!seen[$0]++')  # every objective, then any other asked
# shellcheck disable=SC2086
.venv/bin/python scripts/bench/ablations/ablation_table.py "$OUT" $rows --evals eval eval-chain-5
