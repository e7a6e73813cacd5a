#!/usr/bin/env bash
# Decoder-loop speed, this tree vs another (a refactor's before), alternating runs on idle cores:
#   OTHER_DS_PYTHON=/old/venv/bin/python bash scripts/bench/loop_speed/loop_speed.sh OUT [RUNS]      (default 3 runs each)
# ONLY=plain-b4,hf-b4 times just those cells (a close cell rerun with more runs).
# Writes OUT/<tree>-<i>.json (scripts/bench/loop_speed/loop_speed.py: tokens/s of plain decoding and prompt lookup at batch 1
# and 4, HF generate beside them) and OUT/summary.json: medians per tree and this/other ratios, raw and with each
# run divided by its own process's HF generate. Timings:
# keep the machine otherwise idle.
set -euo pipefail
out=${1:?usage: loop_speed.sh OUT [RUNS]}
runs=${2:-3}
here=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
for i in $(seq 1 "$runs"); do
  "$here/.venv/bin/python" "$here/scripts/bench/loop_speed/loop_speed.py" --out "$out/new-$i.json" --only "${ONLY:-}"
  "${OTHER_DS_PYTHON:?set OTHER_DS_PYTHON to the other tree\'s python}" "$here/scripts/bench/loop_speed/loop_speed.py" --out "$out/old-$i.json" --only "${ONLY:-}"
done
"$here/.venv/bin/python" "$here/scripts/bench/loop_speed/loop_summary.py" "$out" "$runs"
