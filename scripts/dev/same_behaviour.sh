#!/usr/bin/env bash
# Behaviour unchanged across a refactor: the quick recipes run at two revisions (fp32, same seed, same threads, a few
# steps each) and their saved drafter weights and eval outputs are compared byte for byte (weights) and token for
# token (samples.jsonl: output ids and accept lengths; timings differ by nature).
#   bash scripts/dev/same_behaviour.sh OLD_REV [NEW_REV=HEAD] [OUT=/tmp/same-behaviour]
# Each revision is built as a wheel into its own folder (no editable hook), so the two runs share the venv's
# libraries and nothing else. Writes OUT/same-behaviour.json: per recipe, per file, equal or not. One torch job at a
# time: the runs are sequential.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OLD="${1:?old revision}"; NEW="${2:-HEAD}"; OUT="${3:-/tmp/same-behaviour}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
RECIPES="${RECIPES:-smollm2-eagle3-quick smollm2-medusa-quick smollm2-draft-quick}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
for rev in "$OLD" "$NEW"; do
  sha=$(git -C "$ROOT" rev-parse --short "$rev")
  site="$OUT/site-$sha"
  if [ ! -d "$site/draftsmith" ]; then
    src="$OUT/src-$sha"; rm -rf "$src" && mkdir -p "$src"
    git -C "$ROOT" archive "$rev" | tar -x -C "$src"
    "$PY" -m pip install -q --no-deps --no-build-isolation --target "$site" "$src" >/dev/null
  fi
  for recipe in $RECIPES; do
    run="$OUT/$sha/$recipe"
    [ -f "$run/eval/samples.jsonl" ] && continue
    rm -rf "$run" && mkdir -p "$(dirname "$run")"
    PYTHONPATH="$site" "$PY" -c "import sys; from draftsmith.train.cli import main; sys.exit(main())" \
      pipeline -c "$recipe" --out "$run" model.dtype=float32 train.mixed_precision=no train.max_minutes=null \
      train.max_steps=6 train.save_every=0 data.limit=48 eval.limit=3 eval.max_new_tokens=24 eval.dtype=float32 \
      eval.baselines=false eval.warmup=0 export.dtype=float32 plan.enabled=false drafter.plan=false \
      train.onpolicy_max_new_tokens=16 > "$run.log" 2>&1 || { echo "$recipe at $sha failed: $run.log"; exit 1; }
  done
done
"$PY" "$ROOT/scripts/dev/same_behaviour.py" "$OUT" "$(git -C "$ROOT" rev-parse --short "$OLD")" "$(git -C "$ROOT" rev-parse --short "$NEW")" $RECIPES
