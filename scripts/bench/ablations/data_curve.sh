#!/usr/bin/env bash
# tau vs training data for EAGLE-3 on the reference target: the EAGLE-3 recipe (configs/runs/smollm2-eagle3.yaml)
# trained on the first 1k / 2k / 4k / all of the target's own answers (smollm2-selfdistill-4k followed by
# smollm2-selfdistill-extra: 12.9k), the same epochs for every size, each judged in our decoder on the same
# Spec-Bench prompts (bf16, T=0) with a chain of 5 and with the recipe's 16-node dynamic tree. The plot puts
# the field's calibration points beside ours (8B targets, chain drafting: ~5k samples tau 1.45-1.53, ~50k ~1.9,
# ~500k 2.8-3.0; speculators / SpecForge threads) -- other targets and trees, a reference, not a comparison.
#   bash scripts/bench/ablations/data_curve.sh OUT        -> OUT/n<size>/ (pipeline runs), OUT/curve.json, OUT/curve.png
# (scripts/bench/ablations/curve_table.py tabulates every finished size under OUT, so a curve measured over several sessions -- one
# SIZES at a time -- is one table; it fits tau against log10(answers) and warns when sizes differ in epochs.)
# Env: SIZES (default "1000 2000 4000 all"), EPOCHS (default 2), LIMIT (prompts, default 80), TOKENS (default 128),
# EXTRA (more overrides for every run, e.g. "train.max_steps=20" for a smoke run, or model.target=...).
# Resumable across sessions: every run is a pipeline folder (finished stages are skipped, training resumes from its
# last checkpoint) and each eval is skipped once its summary exists. The recipe's time budget is off
# (train.max_minutes=null): equal epochs are equal, whatever the host. Budget on this 2-core CPU: ~3 s per step of
# 4 sequences, so 2 epochs of all 12.9k answers are ~6.4k steps (~5.5 h); the whole curve ~9 h; EPOCHS=1 with
# SIZES="1000 2000 4000" and LIMIT=40 ~2 h (measured), SIZES=all ~3.5 h more (measured: 3,167 steps at ~3.7 s). The pipeline's own eval is the
# 16-node dynamic tree (the recipe's serving tree, OUT/n<size>/eval); the chain of 5 is one more eval
# (OUT/n<size>/eval-chain-5).
set -euo pipefail
out=${1:?usage: data_curve.sh OUT}
here=$(cd "$(dirname "$0")/../../.." && pwd)
ds=${DS:-$here/.venv/bin/draftsmith}
py=${PY:-$here/.venv/bin/python}
sizes=${SIZES:-1000 2000 4000 all}
epochs=${EPOCHS:-2}
limit=${LIMIT:-80}
tokens=${TOKENS:-128}
read -r -a extra <<< "${EXTRA:-}"
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
for size in $sizes; do
  run="$out/n$size"
  lim=$([ "$size" = all ] && echo null || echo "$size")
  "$ds" pipeline -c smollm2-eagle3 --out "$run" "data.train=[smollm2-selfdistill-4k,smollm2-selfdistill-extra]" \
    "data.limit=$lim" "train.epochs=$epochs" train.max_minutes=null "eval.limit=$limit" "eval.max_new_tokens=$tokens" \
    eval.baselines=false export.formats=[] log.progress=false "${extra[@]}"
  [ -f "$run/eval-chain-5/summary.json" ] || "$ds" eval --drafter "$run/drafter" --prompts spec-bench --limit "$limit" \
    --max-new-tokens "$tokens" --dtype "${DTYPE:-auto}" --tree chain-5 --out "$run/eval-chain-5" eval.baselines=false \
    drafter.plan=false log.progress=false "${extra[@]}"
done
"$py" "$here/scripts/bench/ablations/curve_table.py" "$out"  # every finished size under OUT, this call's or an earlier one's
