"""`rlbench bench weights` (issue #24): the ratio it prints comes from the bytes the runs measured,
and publishing every update sends more per update than every 50. A short --local run of both."""

from __future__ import annotations

import json

from rlbench.bench.weights import TARGET_RATIO, format_rows, publishes
from tests.support import run_cli


def test_the_printed_ratio_is_the_measured_bytes_per_update_of_both_runs():
    done = run_cli("bench", "weights", "--local", "--steps", "1500", "--json", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    old, new = results["rows"]
    assert (old["publish_every"], new["publish_every"]) == (1, 50)
    for row in (old, new):
        assert row["status"] == "complete" and row["updates"] > 0
        assert row["learner_bytes_per_update"] == row["learner_bytes_sent"] / row["updates"]
        assert set(row["actor_bytes_received"]) == {"actor-0", "actor-1"}
        assert all(received > 0 for received in row["actor_bytes_received"].values())
    assert old["learner_bytes_per_update"] > new["learner_bytes_per_update"]
    judged = results["comparison"]
    assert judged["ratio"] == new["learner_bytes_per_update"] / old["learner_bytes_per_update"]
    assert judged["met"] == (judged["ratio"] <= TARGET_RATIO)
    # the split reproduces both runs' bytes; one weights message outweighs the rest of an update
    derived = judged["derived"]
    for row in (old, new):
        rebuilt = (derived["other_bytes_per_update"] * row["updates"]
                   + derived["weights_message_bytes"] * publishes(row["publish_every"], row["updates"]))
        assert abs(rebuilt - row["learner_bytes_sent"]) < 1e-6 * row["learner_bytes_sent"]
    assert derived["weights_message_bytes"] > derived["other_bytes_per_update"] > 0
    printed = format_rows(results)
    assert f"{judged['ratio']:.2%}" in printed and f"target <= {TARGET_RATIO:.0%}" in printed


def test_without_root_the_three_hosts_are_refused_in_one_line(monkeypatch):
    from click.testing import CliRunner

    from rlbench.bench.weights import command
    from rlbench.cluster import netns

    monkeypatch.setattr(netns, "namespaces_unavailable", lambda: "network namespaces need root")
    done = CliRunner().invoke(command, [])
    assert done.exit_code == 2 and "network namespaces need root; --local measures on this host" in done.output
