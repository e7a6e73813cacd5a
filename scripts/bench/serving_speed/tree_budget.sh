#!/usr/bin/env bash
# How large a draft tree pays on this machine (README "Serving tree budget"), from the full-recipe EAGLE-3 run:
#   bash scripts/bench/serving_speed/tree_budget.sh RUNS [OUT]     (default OUT runs/tree-budget; about an hour on 2 CPU cores)
# RUNS holds the pipeline folder eagle3/ (configs/runs/smollm2-eagle3.yaml). Keep the machine otherwise
# idle: every figure is a timing. Reruns skip finished parts.
#   OUT/calibration/<tree>/   the same four evals on calibration prompts (Spec-Bench from 240 on); OUT/choice.json:
#                             the tree with the most tokens/s there (the selection; the report split is not used)
#   OUT/<tree>/summary.json   `draftsmith eval` with four serving trees (24 Spec-Bench prompts x 128 tokens,
#                             bf16, T=0): the recipe's dynamic 16 nodes (top-4, depth 5), dynamic 8 (top-2,
#                             depth 4), dynamic 4 (top-2, depth 3), a 3-token chain; and the 4-node tree
#                             in fp32 on 20 prompts (greedy output equal to the target's)
#   OUT/bench                 `draftsmith bench` with the 4-node tree: batch 1/4/16, T 0 and 1, fall-back on
# Env: LIMIT/TOKENS (eval prompts and new tokens, default 24/128).
set -euo pipefail
cd "$(dirname "$0")/../../.."
RUNS=${1:?usage: bash scripts/bench/serving_speed/tree_budget.sh RUNS [OUT]}
OUT=${2:-runs/tree-budget}
DRAFTER=$RUNS/eagle3/drafter
[ -x .venv/bin/draftsmith ] || bash scripts/setup_venv.sh
[ -f "$DRAFTER/draftsmith.json" ] || { echo "missing $DRAFTER: run draftsmith pipeline -c configs/runs/smollm2-eagle3.yaml --out $RUNS/eagle3" >&2; exit 2; }
small=(drafter.tree_topk=2 drafter.num_speculative_tokens=3)  # with --tree dynamic-4: top-2, depth 3, 4 nodes

tree() {  # DIR NAME FLAGS...: one eval of the drafter with that serving tree
  local dir=$1 name=$2; shift 2
  [ -f "$OUT/$dir$name/summary.json" ] && return
  .venv/bin/draftsmith eval --drafter "$DRAFTER" --prompts spec-bench --limit "${LIMIT:-24}" \
    --max-new-tokens "${TOKENS:-128}" --dtype "${DTYPE:-auto}" --out "$OUT/$dir$name" "$@" log.progress=false
}
four() {  # DIR FLAGS...: the four trees
  tree "$1" n16-k4-d5 --tree dynamic-16 drafter.tree_topk=4 drafter.num_speculative_tokens=5 "${@:2}"
  tree "$1" n8-k2-d4 --tree dynamic-8 drafter.tree_topk=2 drafter.num_speculative_tokens=4 "${@:2}"
  tree "$1" chain3 --tree chain-3 "${@:2}"
  tree "$1" n4-k2-d3 --tree dynamic-4 "${small[@]}" "${@:2}"
}
# choose on a calibration split (Spec-Bench's stratified order from prompt 240 on), report on the first prompts:
# the tree a reader would pick is picked where its figures are not reported
four calibration/ eval.offset=240
.venv/bin/python scripts/bench/serving_speed/tree_choice.py "$OUT"
four ""
tree "" n4-k2-d3-fp32 --tree dynamic-4 --dtype float32 --limit 20 "${small[@]}"  # lossless: greedy equal in fp32

[ -f "$OUT/bench/bench.json" ] || .venv/bin/draftsmith bench --target smollm2-135m-instruct --prompts spec-bench \
  --dtype "${DTYPE:-auto}" --drafter "$DRAFTER" --tree dynamic-4 --batch-sizes 1,4,16 --temperatures 0,1.0 --limit 16 \
  --max-new-tokens 64 --out "$OUT/bench" "${small[@]}" log.progress=false
