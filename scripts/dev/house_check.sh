#!/usr/bin/env bash
# Behaviour check for refactors: the three quick recipes plus a 40-step EAGLE-1 and prompt lookup,
# all in fp32 (no autocast), same seed and threads, eval on 20 Spec-Bench prompts x 128 tokens with
# HF generate as the greedy reference. Run it on two trees and compare the run folders with
# `python scripts/dev/compare_runs.py OUT_A OUT_B` (saved weights, exports, samples.jsonl).
#   bash scripts/dev/house_check.sh OUT                      # this checkout's .venv
#   DS=/other/venv/bin/draftsmith ROOT=/other/tree bash scripts/dev/house_check.sh OUT
set -euo pipefail
out=${1:?usage: house_check.sh OUT}
root=${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
ds=${DS:-$root/.venv/bin/draftsmith}
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
fp32=(model.dtype=float32 train.mixed_precision=no eval.dtype=float32 eval.limit=20 eval.max_new_tokens=128
      log.progress=false)
start=$(date +%s)
for recipe in smollm2-medusa-quick smollm2-eagle3-quick smollm2-draft-quick; do
  echo "[house-check $(( $(date +%s) - start ))s] $recipe"
  $ds pipeline -c "$root/configs/runs/$recipe.yaml" --out "$out/$recipe" "${fp32[@]}"
done
echo "[house-check $(( $(date +%s) - start ))s] smollm2-eagle1 (40 steps)"
$ds pipeline -c "$root/configs/runs/smollm2-eagle1.yaml" --out "$out/smollm2-eagle1-40" "${fp32[@]}" \
  train.max_steps=40 train.eval_every=0
if [ ! -f "$out/prompt-lookup/summary.json" ]; then
  echo "[house-check $(( $(date +%s) - start ))s] prompt-lookup"
  $ds eval --target smollm2-135m-instruct --drafter prompt-lookup --prompts spec-bench --limit 20 \
    --max-new-tokens 128 --dtype float32 --out "$out/prompt-lookup" log.progress=false
fi
echo "[house-check $(( $(date +%s) - start ))s] done"
