#!/usr/bin/env bash
# The test command: sets up (idempotent) and runs every test suite, core and plugins.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
paths=(tests)
for dir in plugins/*/tests examples/*/tests; do
  if [ -d "$dir" ]; then paths+=("$dir"); fi
done
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@" "${paths[@]}"
