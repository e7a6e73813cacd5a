#!/usr/bin/env bash
# The benchmark sweep on the reference target (README "Results"), from finished full-recipe run folders:
#   bash scripts/bench/serving_speed/bench_reference.sh RUNS [OUT]       (default OUT runs/bench; 35 min on 2 CPU cores)
# RUNS holds the pipeline folders eagle3/ (configs/runs/smollm2-eagle3.yaml) and draft/
# (configs/runs/smollm2-draft.yaml). Keep the machine otherwise idle: every figure is a timing.
#   OUT/sweep     prompt lookup, EAGLE-3 and the draft LM at batch 1/4/16 and T 0/0.7/1.0, with the
#                 fall-back to plain decoding on, beside HF generate (and, at batch 1, HF prompt lookup
#                 and HF assisted generation with the same draft LM)
#   OUT/assisted  the draft LM in our decoder vs the same exported model in HF assisted generation:
#                 batch 1, T 0, fall-back off (both always speculate), longer answers
# Each writes bench.json, configs/*.json and PNGs. Env: LIMIT/TOKENS (sweep prompts and new tokens,
# default 16/64), ASSIST_LIMIT/ASSIST_TOKENS (default 24/128).
set -euo pipefail
cd "$(dirname "$0")/../../.."
RUNS=${1:?usage: bash scripts/bench/serving_speed/bench_reference.sh RUNS [OUT]}
OUT=${2:-runs/bench}
[ -x .venv/bin/draftsmith ] || bash scripts/setup_venv.sh
for need in "$RUNS/eagle3/drafter/draftsmith.json" "$RUNS/draft/export/hf/config.json"; do
  [ -f "$need" ] || { echo "missing $need: run the full recipes (draftsmith pipeline -c configs/runs/smollm2-{eagle3,draft}.yaml --out $RUNS/{eagle3,draft})" >&2; exit 2; }
done
ds=(.venv/bin/draftsmith bench --target smollm2-135m-instruct --prompts spec-bench --dtype "${DTYPE:-auto}")

"${ds[@]}" --drafter prompt-lookup --drafter "$RUNS/eagle3/drafter" --drafter "$RUNS/draft/export/hf" \
  --batch-sizes 1,4,16 --temperatures 0,0.7,1.0 --limit "${LIMIT:-16}" --max-new-tokens "${TOKENS:-64}" \
  --out "$OUT/sweep" log.progress=false

"${ds[@]}" --drafter "$RUNS/draft/export/hf" --batch-sizes 1 --temperatures 0 --no-fallback \
  --limit "${ASSIST_LIMIT:-24}" --max-new-tokens "${ASSIST_TOKENS:-128}" --out "$OUT/assisted" log.progress=false
