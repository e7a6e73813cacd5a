#!/usr/bin/env bash
# Exports decode what their drafter folder decodes, on the reference target: each format of each run is
# exported in fp32, evaluated with `eval --drafter EXPORT` (fp32, greedy, the prompts and lengths the run's
# own eval used, baselines off), and compared with the run's eval/samples.jsonl: tau, accept lengths and
# output ids per prompt (the run's eval compared those ids with HF generate, so equal ids are greedy equality).
#   bash scripts/dev/export_eval.sh OUT RUN [RUN ...]      e.g. RUN = runs/house/smollm2-eagle3-quick (a pipeline run
#   with eval in fp32: scripts/dev/house_check.sh makes them); writes OUT/export-eval.json
set -euo pipefail
out=${1:?usage: export_eval.sh OUT RUN [RUN ...]}
shift
here=$(cd "$(dirname "$0")/../.." && pwd)
ds=${DS:-$here/.venv/bin/draftsmith}
py=${PY:-$here/.venv/bin/python}
mkdir -p "$out"
pairs=()
for run in "$@"; do
  name=$(basename "$run")
  formats=$("$py" "$here/scripts/dev/export_eval.py" formats "$run")
  read -r limit tokens target prompts < <("$py" "$here/scripts/dev/export_eval.py" settings "$run")
  for fmt in $formats; do
    exp="$out/$name-$fmt"
    "$ds" export --run "$run" --format "$fmt" --out "$exp/drafter" --dtype float32
    "$ds" eval --drafter "$exp/drafter" --target "$target" --prompts "$prompts" --limit "$limit" \
      --max-new-tokens "$tokens" --dtype float32 --out "$exp/eval" eval.baselines=false drafter.plan=false log.progress=false
    pairs+=("$run/eval" "$exp/eval")
  done
done
"$py" "$here/scripts/dev/export_eval.py" compare "$out/export-eval.json" "${pairs[@]}"
