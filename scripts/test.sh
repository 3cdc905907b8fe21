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
# Two workers (pytest-xdist): most tests wait on processes they start, so two share the 2 cores well;
# conftest.py keeps a file's tests, every Ray/namespace test and each plugin's tests on one worker.
# RLBENCH_TEST_WORKERS=0 runs them in this process.
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${RLBENCH_TEST_WORKERS:-2}" --dist loadgroup "$@" "${paths[@]}" || status=$?
# Runs even when the suite failed, so one run reports both; the suite's status wins.
sanitized=0
bash scripts/sanitized-native-tests.sh || sanitized=$?
if [ "$status" = 0 ]; then status=$sanitized; fi
exit "$status"
