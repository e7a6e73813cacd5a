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
"$py" - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = []
for summary in sorted(out.glob("*/eval/summary.json")) + sorted(out.glob("fp32-*/summary.json")):
    s = json.loads(summary.read_text())
    run = summary.parent.parent if summary.parent.name == "eval" else summary.parent
    record = json.loads((run / "pipeline.json").read_text()) if (run / "pipeline.json").is_file() else {}
    rows.append({"run": run.name, "kind": s["drafter_kind"], "dtype": s["dtype"], "tree": s["tree"],
                 "prompts": s["n_prompts"], "max_new_tokens": s["max_new_tokens"], "tau": s["tau"],
                 "tokens_per_s": s["tokens_per_s"], "plain_tokens_per_s": s["baseline_tokens_per_s"],
                 "hf_generate_tokens_per_s": s["hf_generate_tokens_per_s"], "speedup": s["speedup"],
                 "speedup_vs_hf": s["speedup_vs_hf"], "greedy_equal": f"{s['greedy_equal_count']}/{s['n_prompts']}",
                 "stage_seconds": record.get("stage_seconds", {})})
regen = out / "regenerated.jsonl"
result = {"target": "gemma3-270m", "regenerated_answers": sum(1 for _ in regen.open()) if regen.is_file() else 0,
          "rows": rows}
(out / "gemma-check.json").write_text(json.dumps(result, indent=2))
print(f"regenerated answers: {result['regenerated_answers']}")
print("| run | kind | dtype | tree | prompts x tokens | tau | tok/s | plain tok/s | HF tok/s | x plain | x HF | greedy equal |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['run']} | {r['kind']} | {r['dtype']} | {r['tree']} | {r['prompts']} x {r['max_new_tokens']} | {r['tau']:.3f} | "
          f"{r['tokens_per_s']:.1f} | {r['plain_tokens_per_s']:.1f} | {r['hf_generate_tokens_per_s']:.1f} | "
          f"{r['speedup']:.2f} | {r['speedup_vs_hf']:.2f} | {r['greedy_equal']} |")
PY
