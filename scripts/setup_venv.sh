#!/usr/bin/env bash
# Create .venv (python3) and install draftsmith into it with the extras the main job and the tests use
# (gguf: the preset targets are GGUF files; deepspeed: the ZeRO tests; wandb); quick when nothing changed.
# torch first and pinned: 2.13.0 is the CPU wheel this machine has on disk. Asking pip for plain
# `torch` (or letting a dependency do it) would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.draftsmith-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] installing torch==2.13.0 and draftsmith[all,dev] into .venv"
  .venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
  .venv/bin/pip install --quiet --disable-pip-version-check -e '.[all,dev]'
  touch "$stamp"
else
  echo "[setup] .venv is up to date"
fi
