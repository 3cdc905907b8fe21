"""The asv selection of a quick run: `python -m suites.quick` prints one `asv run -b` regular expression
per line, and scripts/asv_quick.sh passes them on unless RLBENCH_ASV_MATRIX=full or the caller chose
benchmarks (-b) itself.

asv runs every parameter combination of a benchmark in a process of its own (~10 ms each here),
whether or not it has anything to measure: the end-to-end grids are ~2,300 combinations and four
tracks each, so a quick run spent a minute and a half forking for cells that were outside its subset.
asv matches a parameterized benchmark's regex against `name(param, ...)`, so a quick run selects its
own cells (rlbench.bench.matrix.QUICK, QUICK_ENVIRONMENTS) and every combination of the small suites.
Its results carry the same grid: the cells it did not select have no value, as the skipped ones had none.

Not a benchmark module: asv imports it and finds nothing to run.
"""

from __future__ import annotations

import re

from rlbench.bench.matrix import QUICK, QUICK_ENVIRONMENTS, REAL_WORKLOADS, REPLAY_LOOP_ALGORITHMS


def _parameters(*values: str) -> str:
    return re.escape("(" + ", ".join(repr(value) for value in values) + ")") + "$"


def quick_selection() -> list[str]:
    selection = [r"^bench_(transport|replay|compute)\.", r"^bench_e2e\.Tabular\."]
    environments = "|".join(re.escape(repr(env)) for env in QUICK_ENVIRONMENTS)
    selection.append(rf"^bench_env\.Step\.\w+\(({environments}), ")
    for cell in QUICK:
        if cell.workload in REPLAY_LOOP_ALGORITHMS or cell.workload in REAL_WORKLOADS:
            grid = "ReplayLoop" if cell.workload in REPLAY_LOOP_ALGORITHMS else "Workloads"
            selection.append(rf"^bench_e2e\.{grid}\.\w+" + _parameters(cell.workload, cell.placement, cell.transport,
                                                                           cell.replay, cell.compute))
    return selection


if __name__ == "__main__":
    print("\n".join(quick_selection()))
