#!/usr/bin/env bash
# A separate CPU-only venv with vLLM's speculators 0.9.0 (draftsmith needs transformers >= 5.24, speculators
# <= 5.19, so they cannot share one): torch 2.13 CPU, transformers 5.19.0, its dependencies in its own ranges.
# Usage: bash scripts/dev/engine_venv.sh VENV   (about 1.5 GB; scripts/dev/engine_check.sh calls it)
set -euo pipefail
VENV="${1:?usage: engine_venv.sh VENV}"
PY=${PYTHON:-python3}

"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --upgrade pip

# 1. torch first, pinned: 2.13.0 resolves to the CPU wheel on local disk
#    (/opt/wheels/torch-2.13.0+cpu-...whl). Never plain `torch` (pulls a CUDA build).
"$VENV/bin/pip" install torch==2.13.0

# 2. transformers (speculators needs >=5.0,<=5.19.0) + every pure-Python dependency
#    of speculators 0.9.0 (its own ranges), with torch re-pinned so it cannot move.
#    torchvision / torchaudio are deliberately NOT installed: speculators never
#    imports them, and PyPI torchvision breaks beside torch 2.13 CPU.
"$VENV/bin/pip" install \
  torch==2.13.0 \
  transformers==5.19.0 \
  hs-connectors==0.9.0 \
  aiohttp click "datasets>=4.0.0,<=5.1.0" httpx huggingface-hub \
  "loguru>=0.7.2,<=0.7.3" "numpy>=2.0.0,<=2.5.4" "openai>=2.0.0" protobuf psutil \
  "pydantic>=2.0.0" "pydantic-settings>=2.0.0" rich safetensors \
  "tqdm>=4.66.3,<=4.70.1" "typer>=0.12.0"

# 3. speculators itself without deps (its metadata requires torchvision + torchaudio).
"$VENV/bin/pip" install --no-deps speculators==0.9.0

# 4. sanity: torch must still be the CPU 2.13.0 build.
"$VENV/bin/python" "$(dirname "$0")/engine_venv_check.py"
# `pip check` will report only the two intentionally missing packages:
#   speculators 0.9.0 requires torchaudio / torchvision, which is not installed.
"$VENV/bin/pip" check || true
