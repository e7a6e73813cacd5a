#!/usr/bin/env bash
# GPU check (about 5-8 minutes on one H200): measure verification cost and decoder overhead on
# random-weight ~1B/8B Llama-shaped targets, then run the tests marked `gpu`. No downloads.
# Writes gpu_check.json and pytest_gpu.txt into $OUT when the device tool sets it, else into runs/gpu/.
# Python: .venv if this checkout has one with CUDA torch, else the machine's python3 (which must hold
# torch + transformers; draftsmith itself is installed into it without dependencies, offline).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    PY=.venv/bin/python
else
    $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
fi
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0), torch.__version__)"
DEST=${OUT:-runs/gpu}  # the device tool's $OUT comes back even when the lease cuts the run short
mkdir -p "$DEST"
PYTHONUNBUFFERED=1 $PY scripts/gpu_check.py --out "$DEST/gpu_check.json"
set +e
$PY -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$DEST/pytest_gpu.txt"
status=${PIPESTATUS[0]}
set -e
exit "$status"
