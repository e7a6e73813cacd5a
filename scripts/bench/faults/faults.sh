#!/usr/bin/env bash
# Fault campaign (kill -9 at random moments, full disk, corrupt shards) on a tiny model; its JSON is the figure.
#   bash scripts/bench/faults/faults.sh [OUT_DIR] [--trials 20] [--seed 0] [--stages ...]     (docs: scripts/bench/faults/faults.py)
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
out=${1:-runs/faults}; shift || true
[ -x "$root/.venv/bin/python" ] || bash "$root/scripts/setup_venv.sh"
exec "$root/.venv/bin/python" -u "$root/scripts/bench/faults/faults.py" "$out" "$@"
