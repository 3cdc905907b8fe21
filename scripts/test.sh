#!/usr/bin/env bash
# The test command: sets up (idempotent) and runs every test suite, core and plugins, then the native
# extensions' tests again against a sanitized debug build (scripts/sanitized-native-tests.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
paths=(tests)
for dir in plugins/*/tests examples/*/tests; do
  if [ -d "$dir" ]; then paths+=("$dir"); fi
done
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" "${paths[@]}" || status=$?
# Runs even when the suite failed, so one run reports both; the suite's status wins.
sanitized=0
bash scripts/sanitized-native-tests.sh || sanitized=$?
if [ "$status" = 0 ]; then status=$sanitized; fi
exit "$status"
