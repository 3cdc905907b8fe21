"""End-to-end runtime benchmarks: placement (local / server / in-network) and actor scaling.

Both run the real runner on the same job in one invocation and print peers side by side.
`placement` also says where each replay operation's time went: the transport's own round trip of
a message that size (an echo, measured in the same invocation after the runs), the replay node's
handling and the memory operation inside it (the node's histograms), and the rest.
"""

from __future__ import annotations

import json

import click

PAPER_IN_NETWORK = "paper: in-network -21.9 % to -29.1 % prioritized-sampling communication"


def _run(**kw):
    from rlbench.config import RunConfig
    from rlbench.runner import run, stop_series_if_signalled

    return stop_series_if_signalled(run(RunConfig(eval_episodes=0, **kw)))


def _sample_latency(result) -> dict:
    latency = result["latency"]
    return latency.get("replay.SAMPLE") or latency.get("replay.sample") or {}


# (op, what the role's histogram holds, whether its messages make a round trip (the wire's share is
# one), whether the role's time is that round trip alone (then the rest and the percentages apply))
SHARE_OPS = (("INSERT", "actor's INSERT, begin to reply (it steps its env and waits for the learner meanwhile)",
              True, False),
             ("SAMPLE", "learner's SAMPLE round trip", True, True),
             ("UPDATE_PRIORITIES", "learner's one-way send", False, False))


def _p50(latency: dict, name: str) -> float | None:
    entry = latency.get(name) or {}
    return entry.get("p50") if entry.get("count") else None


def _op_shares(result: dict, placement: str, wire_us: dict[str, float]) -> list[dict]:
    """Per replay op of one run: the role's p50, the wire's (a round trip of a message that size),
    the node's own (serve less memory), the memory operation's, and the rest; p50s in us, measured."""
    latency = result["latency"]
    rows = []
    for op, seen, round_trip, alone in SHARE_OPS:
        measured = _p50(latency, f"replay.{op}")
        serve, memory = _p50(latency, f"replay_node.serve.{op}"), _p50(latency, f"replay_node.memory.{op}") or 0.0
        if op == "SAMPLE" and placement == "in-network":  # pushed ahead: the node's time is a push's (send included)
            seen, round_trip, alone = "learner's wait for a pushed batch (node: a push)", False, False
            serve = _p50(latency, "replay_node.push.BATCH")
        row = {"op": op, "seen": seen, "alone": alone, "measured_us": measured, "wire_us": wire_us[op] if round_trip
               else None, "node_us": None if serve is None else serve - memory,
               "memory_us": memory if serve is not None else None, "rest_us": None}
        if alone and measured is not None and serve is not None:
            row["rest_us"] = measured - wire_us[op] - serve
        rows.append(row)
    return rows


def _wire_round_trips(transport: str, sizes: dict[str, int], requests: int = 2000) -> dict[str, float]:
    """p50 us of the transport's own round trip of each op's message size (an echo, no node running)."""
    import numpy as np

    from rlbench.kit.access import wire_echo

    with wire_echo(transport) as round_trip:
        wire = {}
        for op, size in sizes.items():
            times = [round_trip(size) for _ in range(requests + 200)][200:]
            wire[op] = float(np.percentile(np.asarray(times) / 1e3, 50))
    return wire


def _message_sizes(batch_size: int) -> dict[str, int]:
    """Bytes each way of the round trips a CartPole run makes: an actor's INSERT, a learner's SAMPLE."""
    import numpy as np

    from rlbench.kit.access import message_bytes
    from rlbench.kit.bench import cartpole_batch
    from rlbench.runtime.distributed.roles import ACTOR_INSERT_TRANSITIONS

    rng = np.random.default_rng(0)
    return {"INSERT": message_bytes("INSERT", cartpole_batch(rng, ACTOR_INSERT_TRANSITIONS)),
            "SAMPLE": message_bytes("SAMPLE", cartpole_batch(rng, batch_size))}


def _format_share(value: float | None, measured: float | None) -> str:
    if value is None:
        return f"{'-':>13}"
    percent = f"{100 * value / measured:>4.0f}%" if measured else "     "
    return f"{value:>7.1f} {percent}"


# What the learner's "batch wait" is under each placement: three different things, never one figure.
BATCH_WAIT = {"local": "in-process sample from the memory",
              "server": "SAMPLE round trip: request, the node's draw, reply",
              "in-network": "wait for a batch the node already pushed (not a replay access)"}


def _learner_stall_us(result: dict, placement: str) -> float | None:
    """The learner's time not learning, per update: blocked in replay calls (distributed) or sampling
    and updating priorities (local)."""
    split = (result["loop"].get("time_split") or {}).get("learner" if placement != "local" else "local") or {}
    updates = result["throughput"]["updates"]
    return split.get("replay", 0.0) / updates * 1e6 if updates else None


def _auth_cost(transport: str, requests: int = 2000, rounds: int = 4) -> dict[str, dict[str, float]]:
    """INSERT (one transition) and SAMPLE (32) p50 us against a real replay node with the run's
    authentication on and off, in alternating rounds; and the handshake's cost per connection."""
    import time

    import numpy as np

    from rlbench.kit.access import replay_node
    from rlbench.kit.bench import cartpole_batch
    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed import messages
    from rlbench.runtime.distributed.channel import Channel

    one = cartpole_batch(np.random.default_rng(0), 1)
    times: dict[str, dict[str, list[int]]] = {side: {"INSERT": [], "SAMPLE": [], "handshake": []} for side in ("on", "off")}
    clock = time.perf_counter_ns
    component = get_registry().get("transport", transport)
    for round_ in range(rounds):
        for side in (("on", "off") if round_ % 2 == 0 else ("off", "on")):
            with replay_node(transport, authenticate=side == "on") as node:
                node.actor.add(cartpole_batch(np.random.default_rng(1), 512))
                for _ in range(requests // rounds):
                    t0 = clock()
                    node.actor.add(one)
                    t1 = clock()
                    node.learner.sample(32, 0.4)
                    t2 = clock()
                    times[side]["INSERT"].append(t1 - t0)
                    times[side]["SAMPLE"].append(t2 - t1)
                secret = node.secret
                for _ in range(5):  # a fresh connection's HELLO (and AUTH) until it may send
                    channel = Channel(component.create().connect(node.address, timeout=10),
                                      reliable=component.capabilities.reliable, timeout=10)
                    t0 = clock()
                    channel.authenticate("actor", 7, messages.role_key(secret, "actor", 7) if secret else None)
                    times[side]["handshake"].append(clock() - t0)
                    channel.close()
    return {side: {op: float(np.percentile(np.asarray(values[20:] if op != "handshake" else values) / 1e3, 50))
                   for op, values in ops.items()} for side, ops in times.items()}


@click.command("placement")
@click.option("--transport", default="shm", show_default=True, help="Transport for server and in-network.")
@click.option("--replay", default="prioritized", show_default=True)
@click.option("--steps", type=int, default=6000, show_default=True)
@click.option("--actors", type=int, default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def placement_command(transport: str, replay: str, steps: int, actors: int, seed: int, as_json: bool) -> None:
    """What each placement (local / server / in-network) changes end to end for the same job — env
    steps/s, updates/s, the learner's stall per update — beside the per-operation latencies, each
    labelled with what it measures; where each replay op's time went; what authentication costs.

    The learner trains every env step (samples-per-insert = batch size), so it is the bottleneck and
    sampling is never held by the rate limiter."""
    from rlbench.machine_state import summary_line, watch

    hp = {"learning_starts": 500, "batch_size": 64, "train_every": 1, "publish_every": 10}
    rows = []
    results = {}
    with watch(busy_processes=1 + 2 + actors) as machine:
        for placement in ("local", "server", "in-network"):
            result = results[placement] = _run(placement=placement, transport=transport, replay=replay, steps=steps,
                                               seed=seed, actors=1 if placement == "local" else actors,
                                               hyperparameters=dict(hp))
            sample = _sample_latency(result)
            throughput = result["throughput"]
            rows.append({"placement": placement, "transport": "-" if placement == "local" else transport,
                         "status": result["status"], "env_steps_per_s": throughput["steady_env_steps_per_s"],
                         "updates_per_s": throughput["steady_updates_per_s"],
                         "learner_stall_per_update_us": _learner_stall_us(result, placement),
                         "batch_wait": BATCH_WAIT[placement],
                         "sample_p50_us": sample.get("p50"), "sample_p99_us": sample.get("p99"),
                         "sample_count": sample.get("count", 0)})
        sizes = _message_sizes(hp["batch_size"])
        wire = _wire_round_trips(transport, sizes)  # after the runs: no replay node polls meanwhile
        auth = _auth_cost(transport)
    for row in rows[1:]:
        node = results[row["placement"]]["loop"]["roles"].get("replay", {})
        row["fast_path"] = node.get("fast_path")
        row["shares"] = _op_shares(results[row["placement"]], row["placement"], wire)
    server, in_network = rows[1], rows[2]
    change = {key: (in_network[key] / server[key] - 1) * 100
              for key in ("env_steps_per_s", "updates_per_s", "learner_stall_per_update_us")
              if server.get(key) and in_network.get(key) is not None}
    reduction = {q: (1 - in_network[f"sample_{q}_us"] / server[f"sample_{q}_us"]) * 100
                 for q in ("p50", "p99") if server.get(f"sample_{q}_us") and in_network.get(f"sample_{q}_us")}
    if as_json:
        click.echo(json.dumps({"rows": rows, "in_network_vs_server_change_pct": change,
                               "batch_wait_reduction_pct": reduction, "message_bytes": sizes,
                               "wire_round_trip_us": wire, "authentication_p50_us": auth,
                               "machine_state": machine.report()}, indent=2))
        return
    click.echo(f"DQN CartPole-v1, {steps} env steps, replay {replay}, learner-bound (train every step, batch 64); "
               "all figures measured; rates in the steady window (start-up excluded)")
    click.echo(summary_line(machine.report()))
    click.echo(f"{'placement':<11} {'transport':<9} {'env steps/s':>11} {'updates/s':>10} {'stall/update us':>16} "
               f"{'batch wait p50 us':>18} {'p99 us':>9}   what the batch wait is")
    for r in rows:
        stall = r["learner_stall_per_update_us"]
        click.echo(f"{r['placement']:<11} {r['transport']:<9} {r['env_steps_per_s'] or float('nan'):>11,.0f} "
                   f"{r['updates_per_s'] or float('nan'):>10,.0f} {stall if stall is not None else float('nan'):>16.1f} "
                   f"{r['sample_p50_us'] or float('nan'):>18.1f} {r['sample_p99_us'] or float('nan'):>9.1f}   "
                   f"{r['batch_wait']}")
    click.echo("in-network vs server, end to end: " + ", ".join(
        f"{label} {change[key]:+.1f} %" for key, label in (("env_steps_per_s", "env steps/s"),
                                                           ("updates_per_s", "updates/s"),
                                                           ("learner_stall_per_update_us", "learner stall per update"))
        if key in change))
    click.echo("the learner's batch wait, in-network (a pushed batch) vs server (a SAMPLE round trip) — unlike "
               "things, so no paper comparison: " + ", ".join(f"{q} {-pct:+.1f} %" for q, pct in reduction.items())
               + f"   ({PAPER_IN_NETWORK}, which is communication latency of a sampling request)")
    click.echo(f"\nauthentication (the run's HMAC handshake), replay node over {transport}, p50 us, alternating rounds: "
               + "; ".join(f"{op} on {auth['on'][op]:.1f} / off {auth['off'][op]:.1f}"
                           for op in ("INSERT", "SAMPLE", "handshake"))
               + " (the handshake is per connection; INSERT is one transition, SAMPLE 32)")
    click.echo(f"\nwhere the replay ops' time went (p50 us, all measured; % of what the role saw where that is the "
               f"round trip alone). wire: {transport}'s "
               f"own round trip of a message that size (INSERT {sizes['INSERT']} B, SAMPLE {sizes['SAMPLE']} B each "
               f"way: {wire['INSERT']:.1f} / {wire['SAMPLE']:.1f} us, an echo after the runs); node: its handling "
               "less the memory operation; rest: client codec, bookkeeping and both ends' loops")
    click.echo(f"{'placement':<11} {'op':<18} {'role sees':>9} {'wire':>13} {'node':>13} {'memory':>13} {'rest':>13}"
               "   what the role's time is")
    for row in rows[1:]:
        for share in row["shares"]:
            measured = share["measured_us"]
            whole = measured if share["alone"] else None  # a share is a part of the role's time only then
            click.echo(f"{row['placement']:<11} {share['op']:<18} "
                       f"{measured if measured is not None else float('nan'):>9.1f} "
                       + " ".join(_format_share(share[key], whole) for key in ("wire_us", "node_us", "memory_us",
                                                                                "rest_us"))
                       + f"   {share['seen']}")
    for row in rows[1:]:
        fast = row.get("fast_path") or {}
        click.echo(f"{row['placement']} replay node: fast path " + (
            "served " + ", ".join(f"{op} {n:,}" for op, n in fast["served"].items()) if fast.get("on")
            else f"off ({fast.get('why', 'not reported')})"))


@click.command("actors")
@click.option("--transport", default="shm", show_default=True)
@click.option("--placement", type=click.Choice(["server", "in-network"]), default="server", show_default=True)
@click.option("--max-actors", type=int, default=4, show_default=True)
@click.option("--steps-per-actor", type=int, default=60000, show_default=True)
@click.option("--train-every", type=int, default=512, show_default=True,
              help="env steps per learner batch of 32: the rate limiter's samples-per-insert is 32 / this")
@click.option("--publish-every", type=int, default=8, show_default=True, help="learner updates per weight publication")
@click.option("--json", "as_json", is_flag=True)
def actors_command(transport: str, placement: str, max_actors: int, steps_per_actor: int, train_every: int,
                   publish_every: int, as_json: bool) -> None:
    """Env steps/s against the number of actor processes, with the learner rate-limited to a light
    load, so the actors are the bottleneck (EMC2'20's sweep).

    On a 2-core machine every cycle the learner and the replay node spend is taken from the actors:
    a DQN update costs ~1.3 ms of torch here, so one batch per 256 env steps alone takes ~0.2 of a
    core at 2 actors' pace. The default, one batch per 512 steps, keeps the learner light."""
    hp = {"learning_starts": 500, "batch_size": 32, "train_every": train_every, "publish_every": publish_every}
    rows = []
    for actors in range(1, max_actors + 1):
        result = _run(placement=placement, transport=transport, actors=actors, steps=steps_per_actor * actors,
                      hyperparameters=dict(hp))
        actor_roles = [r for name, r in result["loop"]["roles"].items() if name.startswith("actor-")]
        rows.append({"actors": actors, "env_steps_per_s": result["loop"]["steady_env_steps_per_s"],
                     "with_start_up": result["throughput"]["env_steps_per_s"],
                     "actor_cpu_s": sum(r["cpu_s"] for r in actor_roles),
                     "achieved_samples_per_insert": result["loop"]["rate_limiter"]["samples_per_insert_achieved"],
                     "status": result["status"]})
    base = rows[0]["env_steps_per_s"]
    for r in rows:
        r["speedup_vs_1"] = r["env_steps_per_s"] / base if base else float("nan")
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"DQN CartPole-v1 over {transport}, placement {placement}; learner rate-limited to "
               f"{32 / train_every:.4g} samples/insert, weights published every {publish_every} updates")
    click.echo("env steps/s: steady state, between the first and the last INSERT the replay node received "
               "(process start-up excluded; with start-up in the last column)")
    click.echo(f"{'actors':>6} {'env steps/s':>12} {'x 1 actor':>10} {'actor cpu s':>12} {'achieved SPI':>13} {'with start-up':>14}")
    for r in rows:
        click.echo(f"{r['actors']:>6} {r['env_steps_per_s']:>12,.0f} {r['speedup_vs_1']:>10.2f} {r['actor_cpu_s']:>12.1f} "
                   f"{r['achieved_samples_per_insert']:>13.3f} {r['with_start_up']:>14,.0f}")
