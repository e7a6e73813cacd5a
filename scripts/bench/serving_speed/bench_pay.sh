#!/usr/bin/env bash
# Do the drafters pay on this machine? Each drafter folder with its recipe's serving settings, with its plan
# (`draftsmith plan`, made first on calibration prompts 240+ if the folder has none), with adaptive drafting
# and with a prompt-lookup branch (hybrid), beside prompt lookup alone (a chain, a trie of 3 matches, and the chain with a datastore of the target's answers); our plain loop and HF generate (and,
# at batch 1, HF prompt lookup and HF assisted generation for draft LMs) timed in the same bench runs.
#   bash scripts/bench/serving_speed/bench_pay.sh OUT [DRAFTER_DIR ...]
#   e.g. bash scripts/bench/serving_speed/bench_pay.sh runs/pay runs/eagle3/drafter runs/medusa/drafter runs/draft/drafter
# Cells: batch 1 T=0 on 40 Spec-Bench prompts x 128 tokens; batch 4 T=0 and batch 1 T=1 on 24; dtype $DTYPE (default
# auto: bf16 where this CPU multiplies it natively, else fp32), no fall-back
# (each variant is measured as it is; the plan is the chooser). One bench folder per (cell, variant), skipped when
# its bench.json exists, so the script resumes across sessions (PAY_CELLS / PAY_VARIANTS pick a subset). Writes OUT/bench-pay.json, OUT/bench-pay.png and
# prints the table. Timings: keep the machine otherwise idle.
set -euo pipefail
out=${1:?usage: bench_pay.sh OUT [DRAFTER_DIR ...]  (no drafter: prompt lookup and the peers alone, on PAY_TARGET)}
shift
here=$(cd "$(dirname "$0")/../../.." && pwd)
ds=${DS:-$here/.venv/bin/draftsmith}
py=${PY:-$here/.venv/bin/python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "$out"
cells=("b1-t0 1 0 40" "b4-t0 4 0 24" "b1-t1 1 1.0 24")
if [ -n "${PAY_CELLS:-}" ]; then IFS=';' read -r -a cells <<< "$PAY_CELLS"; fi  # e.g. PAY_CELLS="b1-t0 1 0 2" (a smoke run)
variants=${PAY_VARIANTS:-recipe plan adaptive hybrid}  # a subset, e.g. PAY_VARIANTS="recipe plan" (a slow host)
# "trie": prompt lookup as a trie of several matches beside its chain in every cell; "datastore": the chain with a
# datastore of the target's own answers ($PAY_DATASTORE; the vendored self-distilled sets for the reference target); "": the chain alone
lookups=${PAY_LOOKUP-trie datastore}
tokens=${PAY_TOKENS:-128}
# prompt lookup runs on the target the first drafter was trained for (the drafters' own benches use theirs)
if [ $# -gt 0 ]; then
  target=$("$py" -c "from draftsmith.heads.folder import read_folder; import sys; print(read_folder(sys.argv[1]).target)" "$1")
else
  target=${PAY_TARGET:-smollm2-135m-instruct}
fi

datastore=${PAY_DATASTORE:-}
if [ -z "$datastore" ] && [ "$target" = smollm2-135m-instruct ]; then
  datastore="[smollm2-selfdistill-4k,smollm2-selfdistill-extra]"  # its answers to the training prompts, none a Spec-Bench one
fi

kind_of() { "$py" -c "from draftsmith.heads.folder import read_folder; import sys; print(read_folder(sys.argv[1]).kind)" "$1"; }
variants_of() {  # name|overrides (space-separated) for one drafter folder
  local kind
  kind=$(kind_of "$1")
  echo "recipe|drafter.plan=false"
  echo "plan|drafter.plan=true"
  case $kind in
    eagle|eagle3) echo "adaptive|drafter.plan=false drafter.confidence_threshold=0.05" ;;
    medusa) ;;  # Medusa's static tree has no confidence to stop on
    *) echo "adaptive|drafter.plan=false drafter.adaptive_length=true drafter.confidence_threshold=0.4" ;;
  esac
  echo "hybrid|drafter.plan=false drafter.lookup_branch=4"
}

# plans first, on the calibration split (disjoint from the timed prompts), one choice per batch size of the cells run
plan_batches=$(for cell in "${cells[@]}"; do read -r _ b _ _ <<< "$cell"; echo "$b"; done | sort -un | paste -sd, -)
for d in "$@"; do
  plan_store=()  # the plan also measures its prompt-lookup candidates drafting from the datastore, when one is run
  if [[ " $lookups " == *" datastore "* ]] && [ -n "$datastore" ]; then plan_store=("drafter.lookup_datastore=$datastore"); fi
  [ -f "$d/serving.json" ] || "$ds" plan --drafter "$d" --into-drafter --dtype "${DTYPE:-auto}" --batch-sizes "$plan_batches" \
    log.progress=false ${plan_store[@]+"${plan_store[@]}"}
done
for cell in "${cells[@]}"; do
  read -r name batch temp limit <<< "$cell"
  common=(--batch-sizes "$batch" --temperatures "$temp" --limit "$limit" --max-new-tokens "$tokens" --dtype "${DTYPE:-auto}"
          --no-fallback --prompts spec-bench)
  dir="$out/$name/prompt-lookup"
  [ -f "$dir/bench.json" ] || "$ds" bench --target "$target" --drafter prompt-lookup "${common[@]}" --out "$dir" log.progress=false
  if [[ " $lookups " == *" trie "* ]]; then  # the continuations of 3 matches x 8 tokens as a trie (the plans' candidate)
    dir="$out/$name/prompt-lookup-trie"
    [ -f "$dir/bench.json" ] || "$ds" bench --target "$target" --drafter prompt-lookup "${common[@]}" --out "$dir" \
      log.progress=false drafter.num_speculative_tokens=8 drafter.lookup_matches=3
  fi
  if [[ " $lookups " == *" datastore "* ]]; then
    dir="$out/$name/prompt-lookup-datastore"
    if [ -z "$datastore" ]; then
      echo "bench_pay: no datastore for $target: set PAY_DATASTORE to data sources with its own answers" >&2
    elif [ ! -f "$dir/bench.json" ]; then
      "$ds" bench --target "$target" --drafter prompt-lookup "${common[@]}" --out "$dir" log.progress=false \
        "drafter.lookup_datastore=$datastore"
    fi
  fi
  for d in "$@"; do
    run=$(basename "$(dirname "$(cd "$d" && pwd)")")
    while IFS='|' read -r variant overrides; do
      dir="$out/$name/$run-$variant"
      # shellcheck disable=SC2086
      [ -f "$dir/bench.json" ] || "$ds" bench --drafter "$d" "${common[@]}" --out "$dir" log.progress=false $overrides
    done < <(variants_of "$d" | grep -E "^($(echo "$variants" | tr ' ' '|'))\|")
  done
done
"$py" "$here/scripts/bench/serving_speed/pay_table.py" "$out"
