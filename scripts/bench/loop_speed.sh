#!/usr/bin/env bash
# Decoder-loop speed, this tree vs another (a refactor's before), alternating runs on idle cores:
#   OTHER_DS_PYTHON=/old/venv/bin/python bash scripts/bench/loop_speed.sh OUT [RUNS]      (default 3 runs each)
# ONLY=plain-b4,hf-b4 times just those cells (a close cell rerun with more runs).
# Writes OUT/<tree>-<i>.json (scripts/bench/loop_speed.py: tokens/s of plain decoding and prompt lookup at batch 1
# and 4, HF generate beside them) and OUT/summary.json: medians per tree and this/other ratios, raw and with each
# run divided by its own process's HF generate. Timings:
# keep the machine otherwise idle.
set -euo pipefail
out=${1:?usage: loop_speed.sh OUT [RUNS]}
runs=${2:-3}
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
for i in $(seq 1 "$runs"); do
  "$here/.venv/bin/python" "$here/scripts/bench/loop_speed.py" --out "$out/new-$i.json" --only "${ONLY:-}"
  "${OTHER_DS_PYTHON:?set OTHER_DS_PYTHON to the other tree\'s python}" "$here/scripts/bench/loop_speed.py" --out "$out/old-$i.json" --only "${ONLY:-}"
done
"$here/.venv/bin/python" - "$out" "$runs" <<'EOF'
import json, statistics, sys
from pathlib import Path
out, runs = Path(sys.argv[1]), int(sys.argv[2])
rows = {t: [json.loads((out / f"{t}-{i}.json").read_text()) for i in range(1, runs + 1)] for t in ("new", "old")}
keys = [k for k in rows["new"][0] if k.endswith(("-b1", "-b4"))]
hf_keys = {k for k in keys if k.startswith("hf-")}
med = {t: {k: statistics.median(r[k] for r in rs) for k in keys} for t, rs in rows.items()}
summary = {"median_tokens_per_s": med, "new_over_old": {k: round(med["new"][k] / med["old"][k], 4) for k in keys},
           "new_over_hf": {k: round(med["new"][k] / med["new"][f"hf-{k.split('-')[-1]}"], 4) for k in keys
                           if f"hf-{k.split('-')[-1]}" in hf_keys}}
# Each process's own HF generate is its yardstick: a process that runs slow (the whole forward, from its
# placement or allocator history) is slow for both, so loop/HF per run then new/old of the medians removes
# the between-process spread that raw tokens/s carries (here up to 15%, against a 3% criterion).
own = {t: {k: statistics.median(r[k] / r[f"hf-{k.split('-')[-1]}"] for r in rs) for k in keys
           if not k.startswith("hf-") and f"hf-{k.split('-')[-1]}" in hf_keys} for t, rs in rows.items()}
summary["per_process_hf_normalised"] = {"median_loop_over_hf": own,
                                        "new_over_old": {k: round(own["new"][k] / own["old"][k], 4) for k in own["new"]}}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
EOF
