"""End-to-end runtime benchmarks: placement (local / server / in-network) and actor scaling (on any
environment: with images, every actor runs the CNN).

Both run the real runner on the same job in one invocation and print peers side by side.
`placement` also says where each replay operation's time went: the transport's own round trip of
a message that size (an echo, measured in the same invocation after the runs), the replay node's
handling and the memory operation inside it (the node's histograms), and the rest.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

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


CLASSIC_STEPS_PER_ACTOR = 60_000  # CartPole's: ~10,000 env steps/s per actor here
PRESET_STEPS_PER_ACTOR = 4_000  # a job at its real size: an Atari actor steps a few hundred a second here (~3 min
# for 1 to 3 actors)
ACTING_EPSILON = 0.01  # the short run's actors act on the network's Q-values 99 % of the time, as a trained agent's


def has_preset(algorithm: Any, family: str) -> bool:
    """Whether the algorithm brings settings for the environment's family (sized for millions of steps)."""
    return family in getattr(algorithm, "presets", {})


def actor_job(algorithm: Any, family: str, total_steps: int, train_every: int, publish_every: int) -> dict[str, Any]:
    """The bench's job: the learner light, so the actors are the bottleneck. Over a family's preset, also
    a memory of the run's size (not the preset's 1 M) and greedy acting: an Atari preset's epsilon stays
    ~1 for a short run's whole length, and its actors would never run their network."""
    hp = {"learning_starts": 500, "batch_size": 32, "train_every": train_every, "publish_every": publish_every}
    if has_preset(algorithm, family):
        hp["buffer_size"] = total_steps
        if "epsilon_start" in {f.name for f in dataclasses.fields(algorithm.Config)}:
            hp.update(epsilon_start=ACTING_EPSILON, epsilon_end=ACTING_EPSILON)
    return hp


def _role_time(result: dict) -> dict[str, dict[str, float]]:
    """Where each role's time went: the actors' (summed) wall seconds per env step in env, inference,
    replay (blocked on the node), weights and bookkeeping (CPU outside those), and the share of their
    windows spent off the CPU; the learner's and the replay node's shares of their windows."""
    splits, roles = result["loop"].get("time_split") or {}, result["loop"].get("roles") or {}
    actors = [name for name in splits if name.startswith("actor-")]
    steps = sum(roles[name]["produced"] for name in actors) or 1
    window = sum(splits[name]["window_s"] for name in actors) or float("nan")
    out = {"actors_us_per_step": {part: 1e6 * sum(splits[name][part] for name in actors) / steps
                                  for part in ("env", "inference", "replay", "weights", "bookkeeping")},
           "actors_off_cpu_share": sum(splits[name]["waiting"] for name in actors) / window}
    learner, node = splits.get("learner", {}), splits.get("replay", {})
    if learner.get("window_s"):
        out["learner_share"] = {part: learner[part] / learner["window_s"]
                                for part in ("learner", "replay", "weights", "waiting")}
    if node.get("window_s"):
        out["node_share"] = {part: node[part] / node["window_s"] for part in ("replay", "bookkeeping", "idle")}
    return out


def _cpu_per_step(result: dict) -> dict[str, float]:
    """CPU seconds per env step in the measured windows: one actor's (the mean), the replay node's and
    the learner's: what each role would need of a core of its own."""
    splits, roles = result["loop"].get("time_split") or {}, result["loop"].get("roles") or {}
    actors = [name for name in splits if name.startswith("actor-")]
    steps = sum(roles[name]["produced"] for name in actors)
    if not steps:
        return {}
    out = {"actor": sum(splits[name]["cpu_s"] for name in actors) / steps}
    for role in ("replay", "learner"):
        if splits.get(role, {}).get("cpu_s"):
            out[role] = splits[role]["cpu_s"] / steps
    return out


CORE_EACH_ACTORS = (1, 2, 4, 8, 16)  # the actor counts the estimate with a core per role is printed for


def core_each_estimate(cpu_per_step: dict[str, float], actors: int) -> tuple[float, str]:
    """Env steps/s with `actors` actors and every role on a core of its own, from CPU time per env step
    (an estimate, not a measurement): the actors supply actors / actor CPU per step, the node and the
    learner take at most 1 / theirs; the smallest binds."""
    bounds = {"actors": actors / cpu_per_step["actor"]}
    bounds.update({role: 1 / cpu_per_step[role] for role in ("replay", "learner") if cpu_per_step.get(role)})
    binding = min(bounds, key=bounds.get)
    return bounds[binding], binding


def actor_sweep(env: str, algo: str, transport: str, placement: str, replay: str | None, max_actors: int,
                steps_per_actor: int | None, train_every: int, publish_every: int) -> dict[str, Any]:
    """Runs with 1 .. max_actors actors against one learner: the job, its settings, a row per count."""
    from rlbench.config import RunConfig
    from rlbench.errors import RlbenchError
    from rlbench.plugins import get_registry
    from rlbench.validate import DEFAULT_REPLAY, validate

    registry = get_registry()
    algorithm = registry.get("algorithm", algo).create()
    family = registry.get("environment", env).capabilities.family
    preset = has_preset(algorithm, family)
    if steps_per_actor is None:
        steps_per_actor = PRESET_STEPS_PER_ACTOR if preset else CLASSIC_STEPS_PER_ACTOR
    hp = actor_job(algorithm, family, steps_per_actor * max_actors, train_every, publish_every)
    for actors in (1, max_actors):  # refused before the first run, with the validator's reason
        validate(RunConfig(algo=algo, env=env, placement=placement, transport=transport, replay=replay, actors=actors,
                           steps=steps_per_actor * actors, eval_episodes=0, hyperparameters=dict(hp)), registry)
    rows = []
    for actors in range(1, max_actors + 1):
        result = _run(algo=algo, env=env, placement=placement, transport=transport, replay=replay, actors=actors,
                      steps=steps_per_actor * actors, hyperparameters=dict(hp))
        if result["status"] != "complete":
            raise RlbenchError(f"the run with {actors} actor(s) ended {result['status']}: {result['status_reason']}")
        actor_roles = [r for name, r in result["loop"]["roles"].items() if name.startswith("actor-")]
        rows.append({"actors": actors, "env_steps_per_s": result["loop"]["steady_env_steps_per_s"],
                     "with_start_up": result["throughput"]["env_steps_per_s"],
                     "actor_cpu_s": sum(r["cpu_s"] for r in actor_roles),
                     "achieved_samples_per_insert": result["loop"]["rate_limiter"]["samples_per_insert_achieved"],
                     "status": result["status"], "role_time": _role_time(result), "cpu_per_step": _cpu_per_step(result),
                     "machine_state": result.get("machine_state", {})})
    base = rows[0]["env_steps_per_s"]
    for r in rows:
        r["speedup_vs_1"] = r["env_steps_per_s"] / base if base else float("nan")
    return {"algo": algo, "env": env, "family": family, "transport": transport, "placement": placement,
            "replay": replay,
            "prioritized": registry.get("replay", replay or DEFAULT_REPLAY).capabilities.prioritized,
            "steps_per_actor": steps_per_actor, "train_every": train_every, "publish_every": publish_every,
            "preset_overridden": preset, "hyperparameters": hp, "rows": rows}


def format_actor_sweep(sweep: dict[str, Any]) -> str:
    """The sweep as printed: its job and settings, a row per actor count, the knee, the machine's state
    during each run, and where each role's time went."""
    from rlbench.machine_state import summary_line
    from rlbench.plan.model import KNEE_GAIN, knee

    rows = sweep["rows"]
    replay = f", replay {sweep['replay']}" if sweep["replay"] else ""
    lines = [f"{sweep['algo'].upper()} {sweep['env']} over {sweep['transport']}, "
             f"placement {sweep['placement']}{replay}; "
             f"learner rate-limited to {32 / sweep['train_every']:.4g} samples/insert, weights published every "
             f"{sweep['publish_every']} updates"]
    if sweep["preset_overridden"]:
        lines.append(f"{sweep['algo']}'s {sweep['family']} preset, overridden for a short run: "
                     + ", ".join(f"{key} {value:,}" if isinstance(value, int) else f"{key} {value}"
                                 for key, value in sweep["hyperparameters"].items())
                     + f"; {sweep['steps_per_actor']:,} env steps per actor")
    lines += ["env steps/s: steady state, between the first and the last INSERT the replay node received "
              "(process start-up excluded; with start-up in the last column)",
              f"{'actors':>6} {'env steps/s':>12} {'x 1 actor':>10} {'actor cpu s':>12} {'achieved SPI':>13} "
              f"{'with start-up':>14}"]
    lines += [f"{r['actors']:>6} {r['env_steps_per_s']:>12,.0f} {r['speedup_vs_1']:>10.2f} {r['actor_cpu_s']:>12.1f} "
              f"{r['achieved_samples_per_insert']:>13.3f} {r['with_start_up']:>14,.0f}" for r in rows]
    found, largest = knee([(r["actors"], r["env_steps_per_s"]) for r in rows]), rows[-1]["actors"]
    if largest < 2:
        lines.append("knee: not measured (one actor count; --max-actors 2 or more finds it)")
    else:
        lines.append(f"knee: {f'{found} actor(s)' if found else f'none, still growing at {largest} actors'} "
                     f"(the count past which one more actor adds less than {KNEE_GAIN:.0%} env steps/s)")
    lines += [f"{r['actors']} actor(s), {summary_line(r['machine_state'])}" for r in rows if r["machine_state"]]
    basis = rows[-1]
    if basis.get("cpu_per_step", {}).get("actor"):  # what a machine with a core per role would do: estimated
        cpu = basis["cpu_per_step"]
        estimates = [(n, *core_each_estimate(cpu, n)) for n in CORE_EACH_ACTORS]
        lines.append(f"estimated, not measured: with a core for each role, from the CPU time per env step of the "
                     f"{basis['actors']}-actor run (an actor {1e6 * cpu['actor']:.0f} us"
                     + "".join(f", the {role} {1e6 * cpu[role]:.0f} us" for role in ("replay", "learner") if role in cpu)
                     + "): " + ", ".join(f"{n} actor(s) {rate:,.0f}/s ({binding})" for n, rate, binding in estimates))
    priorities = ("; with a prioritized memory it holds the actors' initial priorities, a forward of each INSERT's "
                  "obs and next_obs that the actor does not time as inference" if sweep["prioritized"] else "")
    lines += ["", "where each role's time went. actors: wall us per env step, all actors together (replay: blocked on "
              "the node's replies and its rate limiter; bookkeeping: CPU outside env, inference, replay and weights"
              f"{priorities}), and the share of their time off the CPU (descheduled or blocked, overlapping the "
              "others). learner and replay node: shares of their windows"]
    parts = ("env", "inference", "replay", "weights", "bookkeeping")
    lines.append(f"{'actors':>6} " + " ".join(f"{part:>11}" for part in parts) + f" {'off CPU':>8}"
                 f"   {'learner: update':>15} {'sample':>7} {'publish':>8} {'off CPU':>8}"
                 f"   {'node: memory':>12} {'handling':>9} {'idle':>6}")

    def shares(values: dict[str, float], widths: dict[str, int]) -> str:
        return " ".join(f"{values[part]:>{width}.0%}" if part in values else f"{'-':>{width}}"
                        for part, width in widths.items())

    for r in rows:
        spent = r["role_time"]
        lines.append(f"{r['actors']:>6} " + " ".join(f"{spent['actors_us_per_step'][part]:>11.1f}" for part in parts)
                     + f" {spent['actors_off_cpu_share']:>8.0%}   "
                     + shares(spent.get("learner_share", {}), {"learner": 15, "replay": 7, "weights": 8, "waiting": 8})
                     + "   " + shares(spent.get("node_share", {}), {"replay": 12, "bookkeeping": 9, "idle": 6}))
    return "\n".join(lines)


@click.command("actors")
@click.option("--env", default="CartPole-v1", show_default=True,
              help="Environment: an image one runs the CNN on every actor (ALE/Breakout-v5, MinAtar/Breakout-v1).")
@click.option("--algo", type=click.Choice(["dqn", "ddpg"]), default="dqn", show_default=True,
              help="ddpg for a continuous-action environment (HalfCheetah-v5).")
@click.option("--transport", default="shm", show_default=True)
@click.option("--placement", type=click.Choice(["server", "in-network"]), default="server", show_default=True)
@click.option("--replay", default=None, help="[default: prioritized, the run's] uniform: the actors compute no "
              "initial priorities (with prioritized: two more forwards per step, batched per INSERT)")
@click.option("--max-actors", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--steps-per-actor", type=click.IntRange(min=1), default=None,
              help=f"[default: {CLASSIC_STEPS_PER_ACTOR:,}; {PRESET_STEPS_PER_ACTOR:,} for a job with a preset "
                   "(Atari, MinAtar, MuJoCo)]")
@click.option("--train-every", type=click.IntRange(min=1), default=512, show_default=True,
              help="env steps per learner batch of 32: the rate limiter's samples-per-insert is 32 / this")
@click.option("--publish-every", type=click.IntRange(min=1), default=8, show_default=True,
              help="learner updates per weight publication")
@click.option("--json", "as_json", is_flag=True)
def actors_command(env: str, algo: str, transport: str, placement: str, replay: str | None, max_actors: int,
                   steps_per_actor: int | None, train_every: int, publish_every: int, as_json: bool) -> None:
    """Env steps/s against the number of actor processes, with the learner rate-limited to a light
    load, so the actors are the bottleneck (EMC2'20's sweep); the knee, and where each role's time went.

    On a 2-core machine every cycle the learner and the replay node spend is taken from the actors:
    a DQN update costs ~1.3 ms of torch here, so one batch per 256 env steps alone takes ~0.2 of a
    core at 2 actors' pace. The default, one batch per 512 steps, keeps the learner light. With an
    image environment each actor runs the CNN (the compute backend's cnn_inference) on every step,
    and the job's preset is overridden for a short run (printed)."""
    sweep = actor_sweep(env, algo, transport, placement, replay, max_actors, steps_per_actor, train_every,
                        publish_every)
    click.echo(json.dumps(sweep, indent=2, default=str) if as_json else format_actor_sweep(sweep))
