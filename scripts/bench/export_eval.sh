#!/usr/bin/env bash
# Exports decode what their drafter folder decodes, on the reference target: each format of each run is
# exported in fp32, evaluated with `eval --drafter EXPORT` (fp32, greedy, the prompts and lengths the run's
# own eval used, baselines off), and compared with the run's eval/samples.jsonl: tau, accept lengths and
# output ids per prompt (the run's eval compared those ids with HF generate, so equal ids are greedy equality).
#   bash scripts/bench/export_eval.sh OUT RUN [RUN ...]      e.g. RUN = runs/house/smollm2-eagle3-quick (a pipeline run
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
  formats=$("$py" - "$run" <<'PY'
import sys
from draftsmith.heads.folder import read_folder
print(" ".join(read_folder(f"{sys.argv[1]}/drafter").formats))
PY
)
  limit=$("$py" -c "import json,sys; print(sum(1 for _ in open(sys.argv[1])))" "$run/eval/samples.jsonl")
  tokens=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['max_new_tokens'])" "$run/eval/summary.json")
  target=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['target'])" "$run/eval/summary.json")
  prompts=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['prompts'])" "$run/eval/summary.json")
  for fmt in $formats; do
    exp="$out/$name-$fmt"
    "$ds" export --run "$run" --format "$fmt" --out "$exp/drafter" --dtype float32
    "$ds" eval --drafter "$exp/drafter" --target "$target" --prompts "$prompts" --limit "$limit" \
      --max-new-tokens "$tokens" --dtype float32 --out "$exp/eval" eval.baselines=false drafter.plan=false log.progress=false
    pairs+=("$run/eval" "$exp/eval")
  done
done
"$py" - "$out/export-eval.json" "${pairs[@]}" <<'PY'
import json, sys
from pathlib import Path
out, rest = sys.argv[1], sys.argv[2:]
rows = []
for ref, exp in zip(rest[::2], rest[1::2]):
    a = [json.loads(x) for x in Path(ref, "samples.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in Path(exp, "samples.jsonl").read_text().splitlines()]
    sa, sb = (json.loads(Path(d, "summary.json").read_text()) for d in (ref, exp))
    same = [x["id"] == y["id"] and x["output_ids"] == y["output_ids"] and x["accept_lengths"] == y["accept_lengths"]
            for x, y in zip(a, b, strict=True)]
    rows.append({"export": str(Path(exp).parent.name), "folder_eval": ref, "prompts": len(a),
                 "tau_folder": sa["tau"], "tau_export": sb["tau"], "tree_folder": sa.get("tree"),
                 "tree_export": sb.get("tree"), "identical_prompts": sum(same),
                 "greedy_equal_to_hf": sum(x.get("equal_to_hf", False) and s for x, s in zip(a, same))})
Path(out).write_text(json.dumps({"rows": rows}, indent=2) + "\n")
for r in rows:
    print(f"{r['export']:<40} tau folder {r['tau_folder']:.4f} export {r['tau_export']:.4f}  identical "
          f"{r['identical_prompts']}/{r['prompts']}  greedy equal {r['greedy_equal_to_hf']}/{r['prompts']}")
PY
