"""`rlbench bench weights` (issue #24): the ratio it prints comes from the bytes the runs measured,
and publishing every update sends more per update than every 50. A short --local run of both."""

from __future__ import annotations

import json

import pytest

from rlbench.bench.weights import MIN_FORCED_UPDATES, TARGET_RATIO, format_rows, forced_updates, minimum_steps, publishes
from tests.support import run_cli


def test_the_printed_ratio_is_the_measured_bytes_per_update_of_both_runs():
    # the shortest run the bench accepts: the rate limiter holds the learner to MIN_FORCED_UPDATES updates
    steps = minimum_steps(actors=2)
    done = run_cli("bench", "weights", "--local", "--steps", str(steps), "--json", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    old, new = results["rows"]
    assert (old["publish_every"], new["publish_every"]) == (1, 50)
    for row in (old, new):
        assert row["status"] == "complete" and row["updates"] >= forced_updates(steps, 2) >= MIN_FORCED_UPDATES
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


def test_a_run_too_short_to_hold_the_learner_to_updates_is_refused_before_it_starts(monkeypatch):
    from click.testing import CliRunner

    from rlbench.bench import weights

    monkeypatch.setattr(weights, "run_local", lambda *args: pytest.fail("a refused run started"))
    shortest = minimum_steps(actors=2)
    assert forced_updates(shortest - 1, 2) < MIN_FORCED_UPDATES <= forced_updates(shortest, 2)
    assert minimum_steps(actors=4) > shortest  # more actors, more inserts in flight ahead of the learner
    done = CliRunner().invoke(weights.command, ["--local", "--steps", str(shortest - 1)])
    assert done.exit_code == 2
    assert "rate limiter lets actors run" in done.output and f"use at least {shortest:,}" in done.output
