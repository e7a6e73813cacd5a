#!/usr/bin/env bash
# Gemma-3-270M, the second real target family, end to end on this machine:
#   1. the preset loads (cold/cached times are printed by `draftsmith target`)
#   2. Gemma answers 320 vendored training prompts itself (the regenerate stage of the first pipeline; every
#      later recipe finds the answers done), its own training text
#   3. the quick recipe of every kind (configs/runs/gemma3-*-quick.yaml): train -> export -> eval (bf16, greedy,
#      12 Spec-Bench prompts x 64 tokens: tau, speedup vs our loop and vs HF generate, greedy equality)
#   4. fp32 greedy equality, 20 Spec-Bench prompts x 128 tokens, for prompt lookup and the trained EAGLE-3
#      (several of them run past Gemma's 512-token sliding window)
#   bash scripts/dev/gemma_check.sh OUT       -> OUT/gemma-check.json (one row per run) and a markdown table
# Rerunning reuses every finished stage. Timings: keep the machine otherwise idle.
set -euo pipefail
out=${1:?usage: gemma_check.sh OUT}
here=$(cd "$(dirname "$0")/../.." && pwd)
ds=${DS:-$here/.venv/bin/draftsmith}
py=${PY:-$here/.venv/bin/python}
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
"$ds" target --target gemma3-270m --max-new-tokens 16
for kind in ${GEMMA_KINDS:-eagle3 eagle1 medusa draft}; do
  "$ds" pipeline -c "gemma3-$kind-quick" --out "$out/$kind" data.regenerate.out="$out/regenerated.jsonl" log.progress=false
done
fp32=(--target gemma3-270m --prompts spec-bench --limit 20 --max-new-tokens 128 --dtype float32 log.progress=false)
[ -f "$out/fp32-prompt-lookup/summary.json" ] || "$ds" eval --drafter prompt-lookup "${fp32[@]}" --out "$out/fp32-prompt-lookup"
[ -f "$out/fp32-eagle3/summary.json" ] || "$ds" eval --drafter "$out/eagle3/drafter" "${fp32[@]}" --out "$out/fp32-eagle3"
"$py" "$here/scripts/dev/gemma_check.py" "$out"
