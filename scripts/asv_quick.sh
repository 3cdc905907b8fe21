#!/usr/bin/env bash
# The quick benchmark run CI does once: every asv suite in asv's quick mode, in the current environment
# (asv's `existing` path), recorded under HEAD with rlbench's hardware fingerprint beside the machine
# name, then the dashboard built into .asv/html. Exits non-zero (2) when a benchmark fails.
# Extra arguments go to `asv run` (e.g. -b bench_e2e). RLBENCH_ASV_MATRIX=full measures every e2e cell.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RLBENCH_VENV:-.venv}
ASV=("$VENV/bin/python" -m asv)
MACHINE=${RLBENCH_ASV_MACHINE:-$(hostname)}
"${ASV[@]}" machine --yes --machine "$MACHINE" >/dev/null
"$VENV/bin/python" -m suites.machine --machine "$MACHINE"
# asv exits 2 when a benchmark failed; add -e (--show-stderr) to see its traceback.
status=0
"${ASV[@]}" run --python=same --quick --machine "$MACHINE" --set-commit-hash "$(git rev-parse HEAD)" "$@" || status=$?
"${ASV[@]}" publish
echo "asv_quick: dashboard in .asv/html (asv preview serves it)"
exit "$status"
