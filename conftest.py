"""Test scheduling for pytest-xdist (scripts/test.sh runs two workers, --dist loadgroup).

A file's tests stay on one worker (its module fixtures are built once); every file that starts a Ray
cluster or network namespaces shares one worker, so two clusters never compete for the same ports,
memory and cores; a plugin's or example's tests stay together (their DPDK vdevs, sockets and devices).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
# The longest groups go first, so the two workers end together (measured: each over 100 s of a
# 16-minute run); the rest keep their order.
LONGEST_FIRST = ("tests/test_policies.py", "ray", "tests/test_suites.py", "tests/test_distributed.py",
                 "tests/test_hardening.py", "tests/test_deep_algorithms.py")
RAY_FILES = {"ray_support.py", "test_ray.py", "test_ray_netns.py", "test_ray_recipe.py",
             "test_ray_transport_limits.py", "test_plugin_contract.py", "test_bench_weights.py"}


def schedule_group(path: Path) -> str:
    relative = path.resolve().relative_to(ROOT)
    if relative.parts[0] in ("plugins", "examples"):
        return "/".join(relative.parts[:2])
    return "ray" if relative.name in RAY_FILES else str(relative)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups = {item: schedule_group(Path(str(item.path))) for item in items}
    for item, group in groups.items():
        item.add_marker(pytest.mark.xdist_group(group))
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(groups[item], len(rank)))


def pytest_collection_finish(session: pytest.Session) -> None:
    # xdist's loadgroup finds a test's group by the "@group" it appends to the node id on each worker.
    # pytest 9 ignores that append (node ids became structured), and every test was then scheduled on
    # its own: files' module fixtures built on both workers and two Ray clusters at once. Say so loudly.
    if getattr(session.config.option, "loadgroup", False) and session.items and "@" not in session.items[0].nodeid:
        raise pytest.UsageError(f"pytest-xdist's --dist loadgroup did not group the tests on pytest "
                                f"{pytest.__version__} (node ids carry no @group): use the pytest pyproject.toml pins")
