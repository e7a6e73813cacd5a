#!/usr/bin/env bash
# Served vs ours: each drafter in vLLM's CPU build and in our decoder, chains of 1..3, same prompts, fp32, T=0.
#   bash scripts/bench/engine_served.sh OUT [NAME=DRAFTER ...]
#   (LIMIT=8 TOKENS=64 KS="1 2 3" CONCURRENCY=8; DRAFTER: a drafter folder or an export)
# The first row is always `layerdrop`: an untrained draft LM built as training builds one, the reference target
# without layers 14 and 15 (OUT/drafters/layerdrop; the drafter tests/integration/test_engine_serve.py serves).
# One `draftsmith eval --engine vllm` per drafter and chain length into OUT/NAME/chain-K (a finished one is kept),
# then OUT/engine-served.json: per drafter and K the served and our tau and alpha per position, the comparison,
# greedy equality, the engine's speed with / without the drafter, and the host. Speed is not a figure on a host
# whose cores are shared: the JSON says so.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: engine_served.sh OUT [NAME=DRAFTER ...]}
shift
ds=.venv/bin/draftsmith
$ds engine install vllm
layerdrop="$out/drafters/layerdrop"
[ -f "$layerdrop/draftsmith.json" ] || .venv/bin/python - "$layerdrop" <<'PY'
import sys
from draftsmith.distill.loading import load_target
from draftsmith.heads.draft_lm import DraftLM
from draftsmith.heads.registry import DrafterConfig

target = load_target("smollm2-135m-instruct", dtype="float32", device="cpu")
cfg = DrafterConfig.for_kind("draft-lm", layers=[i for i in range(30) if i not in (14, 15)], num_speculative_tokens=3)
DraftLM.build(cfg, target.model).save_pretrained(sys.argv[1], "smollm2-135m-instruct", target.tokenizer)
PY
for pair in "layerdrop=$layerdrop" "$@"; do
  name=${pair%%=*} drafter=${pair#*=}
  for k in ${KS:-1 2 3}; do
    dir="$out/$name/chain-$k"
    [ -f "$dir/summary.json" ] && continue
    echo "[engine-served] $name chain-$k"
    $ds eval --engine vllm --drafter "$drafter" --tree "chain-$k" --prompts spec-bench --limit "${LIMIT:-8}" \
      --max-new-tokens "${TOKENS:-64}" --dtype float32 --engine-concurrency "${CONCURRENCY:-8}" --out "$dir"
  done
done
.venv/bin/python - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rows = []
for path in sorted(out.glob("*/chain-*/summary.json")):
    s = json.loads(path.read_text())
    rows.append({"drafter": path.parent.parent.name, "drafter_path": s["drafter_path"], "format": s["served_format"],
                 "method": s["method"], "k": s["num_speculative_tokens"], "n_prompts": s["n_prompts"],
                 "max_new_tokens": s["max_new_tokens"], "served_tau": s["tau"], "ours_tau": s["ours"]["tau"],
                 "served_alpha": s["alpha_by_position"], "ours_alpha": s["ours"]["alpha_by_position"],
                 "by_concurrency": {c: {key: r[key] for key in ("num_drafts", "tau", "alpha_by_position", "greedy_equal_count",
                                                             "equal_to_ours_count", "tokens_per_s", "baseline_tokens_per_s",
                                                             "speedup", "comparison")}
                                    for c, r in s["by_concurrency"].items()},
                 "agree": all(r["comparison"]["agree"] for r in s["by_concurrency"].values()),
                 "greedy_equal": all(r["greedy_equal"] for r in s["by_concurrency"].values()), "host": s["host"]})
result = {"rows": rows, "command": "bash scripts/bench/engine_served.sh " + " ".join(sys.argv[1:]),
          "speed_note": "tokens_per_s / speedup were measured while other work may have shared this host's cores "
                        "(see each row's host): a speed figure only from a run on an otherwise idle host"}
(out / "engine-served.json").write_text(json.dumps(result, indent=2) + "\n")
for r in rows:
    print(f"{r['drafter']:>14} chain-{r['k']}: served alpha {r['served_alpha']} ours {r['ours_alpha']} "
          f"tau {r['served_tau']}/{r['ours_tau']} agree {r['agree']} greedy_equal {r['greedy_equal']}")
print(f"wrote {out / 'engine-served.json'}")
PY
