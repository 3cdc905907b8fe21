"""`rlbench bench attacks` (issue #40 item 6): each row is printed as it completes and a row that
raises does not lose the others; the attacker is handed only its compromised role's key, never the
run's secret; a figure is judged against its target, and a missed timing on a contended machine is
not judged. Before, one raising row (udp: the other side closed) left no table at all, and the
attacker derived every role's key from the node's secret."""

from __future__ import annotations

import json
import pickle
import types
from dataclasses import replace

import pytest
from click.testing import CliRunner

from support import SECRET
from rlbench.bench.attacks import (
    ATTACKS,
    QUICK,
    Attack,
    attacker_key,
    check,
    command,
    concurrent,
    format_row,
    run_rows,
    target_for,
    verdict,
)
from rlbench.runtime.distributed.messages import role_key


def test_a_row_that_raises_is_printed_as_failed_and_the_next_rows_still_run_and_print():
    printed: list[str] = []
    printed_before_the_real_row: list[int] = []

    def closed(attack, transport, setting):
        raise ConnectionError("udp: the other side closed")

    def impersonation(attack, transport, setting):
        printed_before_the_real_row.append(len(printed))
        return concurrent(attack, transport, setting)

    real = next(attack for attack in ATTACKS if attack.name == "impersonation")
    attacks = [Attack("closes", "the other side closes", closed), replace(real, run=impersonation)]
    rows = run_rows(attacks, ["tcp"], QUICK, lambda row: printed.append(format_row(row)))

    assert [row["verdict"] for row in rows][0] == "failed" and "udp: the other side closed" in printed[0]
    assert printed_before_the_real_row == [1]  # the failed row was out before the next one started
    assert rows[1]["verdict"] in ("held", "open", "contended, not judged") and rows[1]["checks"], rows[1]
    assert rows[1]["attacker"] == {"as launcher": "refused", "as learner": "refused", "SHUTDOWN": "refused"}
    assert len(printed) == 2 and "impersonation" in printed[1] and "target <=" in printed[1]


def test_json_gives_each_row_as_a_line_of_its_own():
    result = CliRunner().invoke(command, ["--quick", "--transport", "tcp", "--attack", "produced-claim", "--json"])
    assert result.exit_code == 0, result.output
    [row] = [json.loads(line) for line in result.output.splitlines()]
    assert row["attack"] == "produced-claim" and row["attacker"] == {"claim": "refused"}, row
    assert row["verdict"] in ("held", "open", "contended, not judged") and row["checks"], row


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda attack: attack.name)
def test_an_attacker_is_handed_its_compromised_roles_key_and_never_the_runs_secret(attack):
    node = types.SimpleNamespace(address="tcp://127.0.0.1:1", secret=SECRET)
    target = target_for(attack, "tcp", QUICK, node)
    handed = pickle.dumps(target)  # what crosses into the attacker's process
    assert SECRET not in handed
    if attack.compromised is None:
        assert target.key is None
    else:
        assert target.key == attacker_key(attack, SECRET) == role_key(SECRET, *attack.compromised)


def test_a_missed_timing_on_a_contended_machine_is_not_judged_and_any_other_miss_is_open():
    """(The rows' verdicts: held, open, contended, not judged, or a stated design's cost.)"""
    slow = check("longest honest round trip", 250.0, 100.0, "ms", timing=True)
    refused = check("honest requests refused", 1, 0, "")
    fine = check("node memory growth", 3.0, 50.0, "MiB")
    assert verdict([fine], contended=False) == "held"
    assert verdict([fine, slow], contended=False) == "open"
    assert verdict([fine, slow], contended=True) == "contended, not judged"
    assert verdict([slow, refused], contended=True) == "open"
    assert not check("serve step", float("nan"), 1.0, "ms")["held"]  # an unmeasured figure never holds
    injected = check("rows injected", 4, 0, "", excused="trusted network path by design")
    assert verdict([fine, injected], contended=False) == "trusted network path by design"
    assert verdict([injected, refused], contended=False) == "open"  # a design excuses its own cost only
