#!/usr/bin/env bash
# vLLM's speculators library on our exports, for real, in a venv of its own (draftsmith needs transformers
# >= 5.24, speculators 0.9.0 <= 5.19):
#   bash scripts/dev/engine_check.sh OUT [--drafter DRAFTER_DIR | --norms fc_norm,norm_output]   (SPEC_VENV: default .engine-venv)
# Builds the venv once (scripts/dev/engine_venv.sh), writes an EAGLE-3 drafter's speculators and eagle3 exports
# with the features and our logits (scripts/dev/engine_check.py), then in the other venv loads the export with
# Eagle3DraftModel.from_pretrained, compares its logits with ours and runs `speculators convert` on the
# eagle3 export (scripts/dev/engine_check_speculators.py, which prints the verdict). Result:
# OUT/speculators-check.json; exit 1 = failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: engine_check.sh OUT [--drafter DIR]}
shift
venv=${SPEC_VENV:-.engine-venv}
[ -x "$venv/bin/speculators" ] || bash scripts/dev/engine_venv.sh "$venv"
[ -x .venv/bin/python ] || bash scripts/setup_venv.sh
.venv/bin/python scripts/dev/engine_check.py "$out" "$@"
HF_HUB_OFFLINE=1 "$venv/bin/python" scripts/dev/engine_check_speculators.py "$out"
