"""The end-to-end matrix: workloads across transport x replay x compute x placement, each cell a real
short training run (rlbench.runner.run) with a fixed seed. A workload is an algorithm on an
environment with a budget: DQN, DDPG, Q-learning and SARSA on the classic tasks (named by their
algorithm, as they always were), and the jobs at their real sizes: DQN on MinAtar and Atari frames
(the CNN, frame-deduplicated memories, images on the wire) and DDPG on a MuJoCo body.

Shared by asv (suites/bench_e2e.py) and `rlbench bench matrix`, so both measure the same cells the
same way. The component names are a fixed, checked-in list (not whatever is registered here) so the
result grid is the same on every machine; a cell that cannot run here is skipped with the reason:
its component is not registered, the validator the CLI uses refuses the combination, or a probe
says the hardware is absent. Only click is imported at module level (`rlbench --help` stays fast).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import click

# -- the fixed, checked-in component lists (tests/test_suites.py fails if an in-repo one is missing) --
TRANSPORTS = ("inproc", "shm", "tcp", "udp", "dpdk", "ray", "uds")
REPLAYS = ("uniform", "prioritized", "fpga", "memmap", "gpu")
COMPUTES = ("cpu", "fpga", "upmem", "gpu")
# The Atari-57 games (those human-normalised scores are reported over), MinAtar's five games (v0: all 6
# actions, v1: each game's minimal set) and gymnasium's MuJoCo v5 bodies.
ATARI_GAMES = ("Alien", "Amidar", "Assault", "Asterix", "Asteroids", "Atlantis", "BankHeist", "BattleZone", "BeamRider",
               "Berzerk", "Bowling", "Boxing", "Breakout", "Centipede", "ChopperCommand", "CrazyClimber", "Defender",
               "DemonAttack", "DoubleDunk", "Enduro", "FishingDerby", "Freeway", "Frostbite", "Gopher", "Gravitar",
               "Hero", "IceHockey", "Jamesbond", "Kangaroo", "Krull", "KungFuMaster", "MontezumaRevenge", "MsPacman",
               "NameThisGame", "Phoenix", "Pitfall", "Pong", "PrivateEye", "Qbert", "Riverraid", "RoadRunner",
               "Robotank", "Seaquest", "Skiing", "Solaris", "SpaceInvaders", "StarGunner", "Surround", "Tennis",
               "TimePilot", "Tutankham", "UpNDown", "Venture", "VideoPinball", "WizardOfWor", "YarsRevenge", "Zaxxon")
MINATAR_GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
MUJOCO_BODIES = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "HumanoidStandup-v5",
                 "Swimmer-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5", "Reacher-v5", "Pusher-v5")
FAMILY_ENVIRONMENTS = (*(f"ALE/{game}-v5" for game in ATARI_GAMES),
                       *(f"MinAtar/{game}-{version}" for game in MINATAR_GAMES for version in ("v0", "v1")),
                       *MUJOCO_BODIES)
ENVIRONMENTS = ("CartPole-v1", "CartPole-v0", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0",
                "Pendulum-v1", "FrozenLake-v1", "FrozenLake8x8-v1", "Taxi-v3", "CliffWalking-v0", "Blackjack-v1",
                "gpu/CartPole-v1", "gpu/Pendulum-v1", "chain", *FAMILY_ENVIRONMENTS)
ALGORITHMS = ("dqn", "ddpg", "qlearning", "sarsa")
POLICIES = ("single-learner", "data-parallel", "device")
COMPONENTS = {"transport": TRANSPORTS, "replay": REPLAYS, "compute": COMPUTES, "environment": ENVIRONMENTS,
              "algorithm": ALGORITHMS, "policy": POLICIES}
PLACEMENTS = ("local", "server", "in-network")  # rlbench.protocols.PLACEMENTS, spelled out for a fixed grid

REPLAY_LOOP_ALGORITHMS = ("dqn", "ddpg")
TABULAR_ALGORITHMS = ("qlearning", "sarsa")
NO_REPLAY = "none"  # the replay column of tabular cells: they update from each transition in order
LOCAL_TRANSPORT = "inproc"  # placement local sends nothing over a transport: its one row sits here
SEED = 0


@dataclass(frozen=True)
class Workload:
    """What one short run is: algorithm, environment, budget, and the return it should reach. The
    hyperparameters apply over the algorithm's preset for the environment's family (run_hyperparameters)."""

    algo: str
    env: str
    steps: int
    threshold: float | None  # time to threshold = first time the mean of the last `window` episode returns >= this
    window: int
    hyperparameters: dict[str, Any] = field(default_factory=dict, hash=False)
    no_threshold: str = ""  # with threshold None: why no return this budget reaches says "it learned"

    def __post_init__(self) -> None:
        if (self.threshold is None) == (not self.no_threshold):
            raise ValueError(f"{self.algo} on {self.env}: give a threshold, or None and the reason there is none")

    def describe(self) -> str:
        """One line: environment, budget, and the threshold or why there is none."""
        target = (f"mean of last {self.window} returns >= {self.threshold:g}" if self.threshold is not None
                  else f"no threshold: {self.no_threshold}")
        return f"{self.algo} on {self.env}, {self.steps:,} steps; {target}"


# Named by their algorithm: the classic tasks (the dashboard's `algo` parameter of bench_e2e.ReplayLoop/Tabular).
WORKLOADS = {
    "dqn": Workload("dqn", "CartPole-v1", 3000, threshold=80.0, window=5,
                    hyperparameters={"learning_starts": 500, "exploration_steps": 1500, "publish_every": 10}),
    "ddpg": Workload("ddpg", "Pendulum-v1", 3000, threshold=-1000.0, window=5,
                     hyperparameters={"learning_starts": 500, "publish_every": 10}),
    "qlearning": Workload("qlearning", "Taxi-v3", 40_000, threshold=-200.0, window=20),
    "sarsa": Workload("sarsa", "Taxi-v3", 40_000, threshold=-200.0, window=20),
    # The jobs at their real sizes (bench_e2e.Workloads): the family's preset (MinAtar's DQN, CleanRL's
    # dqn_atari and DDPG) with learning from early on and a memory the size of the budget, so a short run
    # spends most of its steps learning at the job's real per-update cost (batch, network, frames).
    "dqn-minatar-breakout": Workload(
        "dqn", "MinAtar/Breakout-v1", 3000, threshold=None, window=5,
        # an update every 4 env steps (the preset's: every step), so the cell takes seconds rather than a minute
        hyperparameters={"learning_starts": 500, "buffer_size": 3000, "exploration_steps": 1500, "train_every": 4,
                         "publish_every": 10},
        no_threshold="MinAtar's DQN explores for its first 105,000 frames; after 3,000 steps returns stay at "
                     "a random policy's (0-2 a game)"),
    "dqn-atari-breakout": Workload(
        "dqn", "ALE/Breakout-v5", 2000, threshold=None, window=5,
        hyperparameters={"learning_starts": 500, "buffer_size": 2000, "exploration_steps": 1000, "publish_every": 10},
        no_threshold="CleanRL's dqn_atari learns from step 80,000 and explores over 1 M; after 2,000 steps "
                     "returns stay at a random policy's"),
    "ddpg-mujoco-halfcheetah": Workload(
        "ddpg", "HalfCheetah-v5", 3000, threshold=None, window=1,
        hyperparameters={"learning_starts": 1000, "buffer_size": 3000, "publish_every": 10},
        no_threshold="an episode is 1,000 steps (3 in the budget) and CleanRL's DDPG learns from step 25,000"),
}
REAL_WORKLOADS = ("dqn-minatar-breakout", "dqn-atari-breakout", "ddpg-mujoco-halfcheetah")
# What quick runs of the environment suite step: the classic environments, and of the families the ones the real
# workloads train on. A family's members share their code (one emulator and preprocessing, one MuJoCo binding):
# stepping all 78, 8 at a time, takes minutes (~5 s an Atari game on this 2-core machine, loaded). A full run
# (RLBENCH_ASV_MATRIX=full) steps them all.
QUICK_ENVIRONMENTS = tuple(env for env in ENVIRONMENTS if env not in FAMILY_ENVIRONMENTS
                           or env in {WORKLOADS[name].env for name in REAL_WORKLOADS})


@dataclass(frozen=True)
class Cell:
    workload: str  # a key of WORKLOADS
    placement: str
    transport: str
    replay: str
    compute: str

    @property
    def algo(self) -> str:
        return WORKLOADS[self.workload].algo

    @property
    def label(self) -> str:
        return "/".join((self.workload, self.placement, self.transport, self.replay, self.compute))

    def run_config(self, seed: int = SEED) -> Any:
        from rlbench.config import RunConfig

        workload = WORKLOADS[self.workload]
        return RunConfig(algo=workload.algo, env=workload.env, placement=self.placement, transport=self.transport,
                         replay=None if self.replay == NO_REPLAY else self.replay, compute=self.compute,
                         steps=workload.steps, seed=seed, eval_episodes=0,
                         hyperparameters=dict(workload.hyperparameters))


def replay_loop_cells(workloads: Iterable[str] = REPLAY_LOOP_ALGORITHMS, placements: Iterable[str] = PLACEMENTS,
                      transports: Iterable[str] = TRANSPORTS, replays: Iterable[str] = REPLAYS,
                      computes: Iterable[str] = COMPUTES) -> list[Cell]:
    return [Cell(*values) for values in itertools.product(workloads, placements, transports, replays, computes)]


def tabular_cells(algos: Iterable[str] = TABULAR_ALGORITHMS, placements: Iterable[str] = PLACEMENTS,
                  computes: Iterable[str] = COMPUTES) -> list[Cell]:
    return [Cell(algo, placement, LOCAL_TRANSPORT, NO_REPLAY, compute)
            for algo, placement, compute in itertools.product(algos, placements, computes)]


# The limited subset quick runs measure: each placement, each kind of accelerator path available on a
# plain Linux box, every algorithm, and images twice (MinAtar's frames through a replay node, the Nature CNN
# on Atari's). Same budgets and seed as the full matrix, so the values line up.
QUICK = (
    Cell("dqn", "local", "inproc", "prioritized", "cpu"),
    Cell("dqn", "server", "shm", "prioritized", "cpu"),
    Cell("dqn", "in-network", "shm", "prioritized", "cpu"),
    Cell("dqn", "local", "inproc", "fpga", "fpga"),
    Cell("ddpg", "local", "inproc", "uniform", "cpu"),
    Cell("qlearning", "local", "inproc", NO_REPLAY, "cpu"),
    Cell("sarsa", "local", "inproc", NO_REPLAY, "cpu"),
    Cell("qlearning", "local", "inproc", NO_REPLAY, "upmem"),
    Cell("dqn-minatar-breakout", "server", "shm", "prioritized", "cpu"),
    Cell("dqn-atari-breakout", "local", "inproc", "prioritized", "cpu"),
)


def skip_reason(cell: Cell, registry: Any) -> str | None:
    """Why this cell cannot run here (None: it can). The combination rules are the CLI's validator's."""
    from rlbench.errors import RlbenchError
    from rlbench.validate import validate

    named = {"algorithm": cell.algo, "transport": cell.transport, "compute": cell.compute}
    if cell.replay != NO_REPLAY:
        named["replay"] = cell.replay
    for kind, name in named.items():
        if name not in registry.names(kind):
            return f"{kind} {name!r} is not registered here (its plugin is not installed)"
    if cell.placement == "local" and cell.transport != LOCAL_TRANSPORT and cell.algo in REPLAY_LOOP_ALGORITHMS:
        return (f"placement local runs every role in one process and uses no transport: "
                f"measured once, under transport {LOCAL_TRANSPORT}")
    try:
        validate(cell.run_config(), registry)
    except RlbenchError as error:
        return str(error)
    return None


def time_to_threshold(curve: list[dict[str, float]], threshold: float, window: int) -> float:
    """Seconds until the mean of the last `window` episode returns first reaches `threshold`; NaN if never."""
    returns = [point["return"] for point in curve]
    for end in range(window, len(returns) + 1):
        if statistics.fmean(returns[end - window:end]) >= threshold:
            return float(curve[end - 1]["time_s"])
    return math.nan


def measure(cell: Cell, seed: int = SEED) -> dict[str, float]:
    """One real run of the cell; raises RuntimeError when the run does not complete."""
    from rlbench.runner import run, stop_series_if_signalled

    result = stop_series_if_signalled(run(cell.run_config(seed)))
    if result["status"] != "complete":
        raise RuntimeError(f"{cell.label}: run {result['status']}: {result['status_reason']}")
    latency = result["latency"]
    sample = latency.get("replay.SAMPLE") or latency.get("replay.sample") or {}
    workload = WORKLOADS[cell.workload]
    throughput = result["throughput"]
    return {"env_steps_per_s": float(throughput["env_steps_per_s"]),
            "updates_per_s": float(throughput["updates_per_s"]),
            "sample_p99_us": float(sample["p99"]) if sample.get("count") else math.nan,
            "time_to_threshold_s": math.nan if workload.threshold is None
            else time_to_threshold(result["learning_curve"], workload.threshold, workload.window)}


def run_cells(cells: Iterable[Cell], selected: Callable[[Cell], bool], seed: int = SEED,
              progress: Callable[[Cell, dict[str, Any]], None] | None = None) -> dict[str, dict[str, Any]]:
    """label -> {"metrics": {...}} | {"skipped": reason} | {"failed": message}, for every cell given.
    Cells that can run but are not `selected` are skipped as outside the chosen subset."""
    from rlbench.kit.bench import pin_one_thread
    from rlbench.plugins import get_registry

    # Placement local runs in this process: its learner's torch already runs on the cpu backend's one thread;
    # numpy's BLAS (the actors' inference, a CNN's matmuls) is pinned to match, as every role process's pools
    # are sized to its one CPU. Left at a thread per core, a CNN forward on a loaded machine took 40-100 ms
    # instead of 1-3 (its threads spin for a core the others hold).
    pin_one_thread()
    registry = get_registry()
    outcomes: dict[str, dict[str, Any]] = {}
    for cell in cells:
        reason = skip_reason(cell, registry)
        if reason is None and not selected(cell):
            reason = "outside the quick subset (RLBENCH_ASV_MATRIX=full or `rlbench bench matrix --full` runs it)"
        if reason is not None:
            outcomes[cell.label] = {"skipped": reason}
            continue
        try:
            outcomes[cell.label] = {"metrics": measure(cell, seed)}
        except Exception as error:  # one broken cell must not hide the others' figures
            outcomes[cell.label] = {"failed": f"{type(error).__name__}: {error}"}
        if progress is not None:
            progress(cell, outcomes[cell.label])
    return outcomes


def grid() -> list[Cell]:
    """Every cell of the matrix: the classic replay-loop and tabular rows, then the real workloads'."""
    return replay_loop_cells() + tabular_cells() + replay_loop_cells(REAL_WORKLOADS)


def in_quick_subset(cell: Cell) -> bool:
    return cell in QUICK


# -- `rlbench bench matrix` ----------------------------------------------------------------------------
def _baseline(cell: Cell) -> Cell:
    """The peer a cell's env steps/s is divided by: the same workload and replay, local, on the CPU."""
    return Cell(cell.workload, "local", LOCAL_TRANSPORT, cell.replay, "cpu")


def format_table(cells: list[Cell], outcomes: dict[str, dict[str, Any]], seed: int) -> str:
    headers = ("workload", "placement", "transport", "replay", "compute", "env steps/s", "x local cpu",
               "updates/s", "SAMPLE p99 us", "to threshold s")
    rows = []
    for cell in cells:
        metrics = outcomes[cell.label].get("metrics")
        if metrics is None:
            continue
        base = outcomes.get(_baseline(cell).label, {}).get("metrics")
        ratio = f"{metrics['env_steps_per_s'] / base['env_steps_per_s']:.2f}" if base else "-"

        def number(value: float, digits: int = 0) -> str:
            return "-" if math.isnan(value) else f"{value:,.{digits}f}"

        rows.append((cell.workload, cell.placement, "-" if cell.placement == "local" else cell.transport, cell.replay,
                     cell.compute, number(metrics["env_steps_per_s"]), ratio, number(metrics["updates_per_s"]),
                     number(metrics["sample_p99_us"], 1), number(metrics["time_to_threshold_s"], 2)))
    widths = [max(len(str(row[i])) for row in (headers, *rows)) for i in range(len(headers))]
    workloads = dict.fromkeys(cell.workload for cell in cells)
    lines = [f"end-to-end matrix, seed {seed}; numpy's BLAS and torch on one thread in this process; workloads:"]
    for name in workloads:
        workload = WORKLOADS[name]
        settings = ", ".join(f"{key} {value}" for key, value in workload.hyperparameters.items())
        lines.append(f"  {name}: {workload.describe()}" + (f" (hyperparameters: {settings})" if settings else ""))
    lines += ["x local cpu = env steps/s / that of the same workload and replay, placement local on cpu, this run",
             "  ".join(h.ljust(w) if i < 5 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    lines += ["  ".join(str(c).ljust(w) if i < 5 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
              for row in rows]
    failed = [(label, o["failed"]) for label, o in outcomes.items() if "failed" in o]
    lines += [f"FAILED {label}: {message}" for label, message in failed]
    reasons: dict[str, int] = {}
    for outcome in outcomes.values():
        if "skipped" in outcome:
            reasons[outcome["skipped"]] = reasons.get(outcome["skipped"], 0) + 1
    if reasons:
        lines.append(f"skipped {sum(reasons.values())} cells:")
        lines += [f"  {count:>4} x {reason}" for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


@click.command("matrix")
@click.option("--full", is_flag=True, help="Every valid cell (~420 runs here: hours); default: the quick subset.")
@click.option("--algo", "algos", multiple=True, type=click.Choice(ALGORITHMS), help="Only these algorithms (repeatable).")
@click.option("--workload", "workloads", multiple=True, type=click.Choice(list(WORKLOADS)),
              help="Only these workloads (repeatable); with --algo, those of both.")
@click.option("--seed", type=int, default=SEED, show_default=True, help="The seed asv's suites use is the default.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome of every cell as JSON.")
def command(full: bool, algos: tuple[str, ...], workloads: tuple[str, ...], seed: int, as_json: bool) -> None:
    """The end-to-end matrix asv's bench_e2e suite measures, outside asv, as one table."""
    cells = [c for c in grid() if (not algos and not workloads) or c.algo in algos or c.workload in workloads]

    def progress(cell: Cell, outcome: dict[str, Any]) -> None:
        click.echo(f"# {cell.label}: {'failed' if 'failed' in outcome else 'done'}", err=True)

    outcomes = run_cells(cells, (lambda cell: True) if full else in_quick_subset, seed, progress)
    if as_json:
        click.echo(json.dumps({"seed": seed, "full": full, "cells": outcomes}, indent=2))
    else:
        click.echo(format_table(cells, outcomes, seed))
    failed = sum("failed" in outcome for outcome in outcomes.values())
    if failed:
        from rlbench.errors import RlbenchError

        raise RlbenchError(f"{failed} cell(s) failed: see the FAILED lines")
