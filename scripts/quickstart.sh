#!/usr/bin/env bash
# The main job on the reference target (SmolLM2-135M-Instruct), from a fresh clone:
#   1. install into .venv            2. fetch + convert the target once (cached in $DRAFTSMITH_HOME)
#   3. a short greedy generation     4. speculative decoding with the training-free drafters
#      (prompt lookup, layer-skip) on one Spec-Bench prompt per category, with τ, speedup and
#      greedy equality written to runs/quickstart/<drafter>/summary.json
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
ds=.venv/bin/draftsmith
echo "[quickstart] target"
$ds target --target smollm2-135m-instruct
for drafter in prompt-lookup layer-skip; do
  echo "[quickstart] eval $drafter"
  $ds eval --target smollm2-135m-instruct --drafter "$drafter" --prompts spec-bench --limit 6 \
    --max-new-tokens 64 --dtype float32 --out "runs/quickstart/$drafter"
done
