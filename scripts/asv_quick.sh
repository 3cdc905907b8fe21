#!/usr/bin/env bash
# The quick benchmark run CI does once: every asv suite in asv's quick mode, in the current environment
# (asv's `existing` path), recorded under HEAD with rlbench's hardware fingerprint beside the machine
# name, then the dashboard published into asv's html folder (.asv/html) with local copies of the
# scripts asv takes from CDNs, so it also works offline. Serve it with `rlbench dashboard --no-publish`
# (asv preview serves it too). Exits non-zero (2) when a benchmark fails.
# Extra arguments go to `asv run` (e.g. -b bench_e2e). RLBENCH_ASV_MATRIX=full measures every e2e cell;
# RLBENCH_ASV_CONFIG names another asv configuration (default asv.conf.json).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RLBENCH_VENV:-.venv}
ASV=("$VENV/bin/python" -m asv)
CONFIG=${RLBENCH_ASV_CONFIG:-asv.conf.json}
MACHINE=${RLBENCH_ASV_MACHINE:-$(hostname)}
"${ASV[@]}" machine --yes --machine "$MACHINE" --config "$CONFIG" >/dev/null
"$VENV/bin/python" -m suites.machine --machine "$MACHINE"
# A quick run selects its own cells (suites/quick.py: asv would otherwise start a process for each of the
# grids' ~2,300 combinations, measured or not), unless the caller chose benchmarks with -b itself.
selection=()
if [ "${RLBENCH_ASV_MATRIX:-quick}" = quick ] && [[ " $* " != *" -b "* && " $* " != *" --bench"* ]]; then
  while IFS= read -r regex; do selection+=(-b "$regex"); done < <("$VENV/bin/python" -m suites.quick)
fi
# asv exits 2 when a benchmark failed; add -e (--show-stderr) to see its traceback.
status=0
"${ASV[@]}" run --python=same --quick --machine "$MACHINE" --config "$CONFIG" \
  --set-commit-hash "$(git rev-parse HEAD)" "${selection[@]}" "$@" || status=$?
"$VENV/bin/rlbench" dashboard --config "$CONFIG" --no-serve
echo "asv_quick: dashboard published; serve it with: rlbench dashboard --no-publish"
exit "$status"
