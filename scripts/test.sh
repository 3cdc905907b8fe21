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
# The sanitized native tests (one process, under a minute) run beside the suite, which leaves about a
# quarter of the cores idle while it waits on the processes it starts; their output follows the suite's.
sanitized_log=$(mktemp "${TMPDIR:-/tmp}/rlbench-sanitized-log.XXXXXX")
bash scripts/sanitized-native-tests.sh >"$sanitized_log" 2>&1 &
sanitized_pid=$!
# Two workers (pytest-xdist): most tests wait on processes they start, so two share the 2 cores well
# (three took longer here); conftest.py keeps a file's tests, every Ray/namespace test and each
# plugin's tests on one worker. RLBENCH_TEST_WORKERS=0 runs them in this process. A worker that dies
# (a native abort) fails the run at once: with a replacement worker, xdist re-sent the dead worker's
# group and once left both workers idle until the CI's limit.
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${RLBENCH_TEST_WORKERS:-2}" --dist loadgroup --max-worker-restart 0 \
  "$@" "${paths[@]}" || status=$?
sanitized=0
wait "$sanitized_pid" || sanitized=$?
cat "$sanitized_log"
rm -f "$sanitized_log"
if [ "$status" = 0 ]; then status=$sanitized; fi  # one run reports both; the suite's status wins
exit "$status"
