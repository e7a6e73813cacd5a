#!/usr/bin/env bash
# The main job on the reference target (SmolLM2-135M-Instruct), from a fresh clone:
#   1. install into .venv                2. fetch + convert the target once (cached in $DRAFTSMITH_HOME)
#   3. train three drafters on small budgets from the vendored self-distilled answers (online):
#      Medusa heads, an EAGLE-3 drafter, a distilled draft LM (configs/runs/*-quick.yaml)
#   4. plan each trained drafter's serving settings on this machine (draftsmith plan on calibration prompts
#      disjoint from the timed ones -> serving.json) and evaluate it with its recipe's settings and with the plan;
#      evaluate the training-free drafters (prompt lookup, layer-skip) on the same
#      Spec-Bench prompts (dtype auto: bf16 where this CPU multiplies it natively, else fp32; greedy, batch 1)
#      against our loop and HF `generate`
#   5. `draftsmith bench`: all of them batched (batch 1 and 4, greedy, fall-back on) beside HF generate,
#      HF prompt lookup and HF assisted generation with the same draft LM
#   6. print one comparison table; write runs/quickstart/report/ (report.md + PNG plots: acceptance by
#      depth, τ by category, speedup vs batch size)
# Rerunning reuses every finished stage (each pipeline skips what its folder already holds).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
ds=.venv/bin/draftsmith
out=${QUICKSTART_OUT:-runs/quickstart}
eval_flags=(--prompts spec-bench --limit 12 --max-new-tokens 64 --dtype "${DTYPE:-auto}")
start=$(date +%s)
stamp() { echo "[quickstart $(( $(date +%s) - start ))s] $*"; }

stamp "target"
$ds target --target smollm2-135m-instruct
for kind in medusa eagle3 draft; do
  stamp "pipeline $kind (train -> export -> eval -> plan -> eval with the plan)"
  $ds pipeline -c "configs/runs/smollm2-$kind-quick.yaml" --out "$out/$kind" plan.enabled=true plan.calibration=4 \
    plan.max_new_tokens=32
done
for drafter in prompt-lookup layer-skip; do
  if [ ! -f "$out/$drafter/summary.json" ]; then
    stamp "eval $drafter"
    $ds eval --target smollm2-135m-instruct --drafter "$drafter" "${eval_flags[@]}" --out "$out/$drafter"
  fi
done
if [ ! -f "$out/bench/bench.json" ]; then
  stamp "bench (batch 1, 4)"
  $ds bench --target smollm2-135m-instruct --prompts spec-bench --dtype "${DTYPE:-auto}" --drafter prompt-lookup \
    --drafter "$out/medusa/drafter" --drafter "$out/eagle3/drafter" --drafter "$out/draft/drafter" \
    --batch-sizes 1,4 --temperatures 0 --limit 8 --max-new-tokens 32 --calibration-prompts 4 \
    --calibration-tokens 16 --out "$out/bench" log.progress=false
fi
stamp "report"
$ds report "$out/medusa/eval" "$out/medusa/eval-plan" "$out/eagle3/eval" "$out/eagle3/eval-plan" "$out/draft/eval" \
  "$out/draft/eval-plan" "$out/prompt-lookup" "$out/layer-skip" \
  --bench "$out/bench/bench.json" --out "$out/report"
stamp "done"
