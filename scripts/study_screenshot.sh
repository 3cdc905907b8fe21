#!/usr/bin/env bash
# Regenerates docs/study-report.png: runs (or resumes) the study docs/study-replay-placement.toml
# (DQN on CartPole-v1, prioritized and uniform replay x local and server placement x 5 seeds), writes
# its report and takes a screenshot of the report's top with headless Chromium. 6 to 11 minutes on
# 2 cores. RLBENCH_STUDY_OUT changes the results folder (default results/studies/replay-placement).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RLBENCH_VENV:-.venv}
OUT=${RLBENCH_STUDY_OUT:-results/studies/replay-placement}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
"$VENV/bin/rlbench" sweep docs/study-replay-placement.toml --out "$OUT"
"$VENV/bin/rlbench" report "$OUT" --out "$OUT/report.html" \
  --title "Replay memory x placement: DQN on CartPole-v1, 5 seeds" \
  --screenshot docs/study-report.png --screenshot-size 1300x1900
echo "study_screenshot: docs/study-report.png (report: $OUT/report.html)"
