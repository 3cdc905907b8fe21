"""`rlbench bench compute`: actor inference and learner update step of every available compute backend,
each beside a plain torch CPU forward of the same network, measured in one run with one thread: the MLPs
of CartPole's DQN and Pendulum's DDPG, and, on backends that run a CNN, the Nature DQN network on 84x84x4
uint8 frame stacks (a forward of batch 1 as an actor acts, of 32; a DQN update of batch 32 with CleanRL's
dqn_atari settings)."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import click
import numpy as np

from rlbench.bench.algo import dqn_command  # noqa: F401  (the CLI attaches `bench dqn` from this module)
from rlbench.kit.bench import torch_forward
from rlbench.metrics import Histogram

# (name, layer sizes, hidden activation, output activation): DQN's CleanRL Q-net and a DDPG actor.
NETWORKS = (("dqn-q 4-120-84-2", (4, 120, 84, 2), "relu", "identity"),
            ("ddpg-actor 3-256-256-1", (3, 256, 256, 1), "relu", "tanh"))
BATCHES = (1, 256)
# (name, input shape): the Atari frame stack CleanRL's dqn_atari.py trains on (Breakout's 4 actions)
CNN_NETWORKS = (("nature-cnn 4x84x84", (4, 84, 84)),)
CNN_BATCHES = (1, 32)  # an actor's step; a learner's batch (and about an actor's initial-priority chunk)
ATARI_ACTIONS = 4


def time_calls(fn: Callable[[], Any], iterations: int) -> dict[str, float]:
    for _ in range(min(50, iterations)):  # warm caches and allocators
        fn()
    histogram = Histogram()
    clock = time.perf_counter_ns
    for _ in range(iterations):
        t0 = clock()
        fn()
        histogram.record(clock() - t0)
    summary = histogram.summary()
    return {"p50_us": summary["p50"], "mean_us": summary["mean"], "p99_us": summary["p99"]}


def available_backends() -> list[tuple[str, Any]]:
    from rlbench.plugins import get_registry

    backends = []
    for component in get_registry().components("compute"):
        probe = component.probe()
        if not probe.available:
            click.echo(f"# compute {component.name}: skipped, unavailable: {probe.reason}", err=True)
            continue
        backends.append((component.name, component.create()))
    return backends


def measure_inference(backends, iterations: int) -> list[dict[str, Any]]:
    from rlbench.testing.compute import random_weights

    rng = np.random.default_rng(0)
    rows = []
    for net, sizes, hidden, output in NETWORKS:
        weights = random_weights(sizes, rng)
        peer = torch_forward(weights, hidden, output)
        for batch in BATCHES:
            x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
            n = iterations if batch == 1 else max(100, iterations // 10)
            torch_time = time_calls(lambda: peer(x), n)
            for name, backend in backends:
                if not any(role.endswith(":actor") for role in backend.capabilities.roles):
                    continue
                engine = backend.mlp_inference(sizes, hidden_activation=hidden, output_activation=output)
                engine.load(weights, 0)
                engine_time = time_calls(lambda: engine(x), n)
                rows.append({"backend": name, "network": net, "batch": batch, "engine": engine_time,
                             "torch_cpu": torch_time, "speedup_vs_torch_cpu": torch_time["p50_us"] / engine_time["p50_us"]})
    return rows


def measure_cnn_inference(backends, iterations: int) -> list[dict[str, Any]]:
    """cnn_inference of each backend that runs a CNN beside a torch CPU forward of the same weights (the
    learner's own module, as CleanRL's actor runs it), on uint8 frames."""
    import torch

    from rlbench.algorithms.networks import conv_net, export_weights
    from rlbench.kit.networks import nature_cnn

    rng = np.random.default_rng(0)
    rows = []
    for net, shape in CNN_NETWORKS:
        network = nature_cnn(shape, ATARI_ACTIONS)
        torch.manual_seed(0)
        peer = conv_net(network)
        weights = export_weights(peer)
        for batch in CNN_BATCHES:
            frames = rng.integers(0, 256, (batch, *shape), dtype=np.uint8)
            n = max(20, iterations // (10 * batch))

            def torch_cpu() -> np.ndarray:
                with torch.no_grad():
                    return peer(torch.from_numpy(frames)).numpy()

            torch_time = time_calls(torch_cpu, n)
            for name, backend in backends:
                if "cnn" not in backend.capabilities.networks or not any(
                        role.endswith(":actor") for role in backend.capabilities.roles):
                    continue
                engine = backend.cnn_inference(network)
                engine.load(weights, 0)
                engine_time = time_calls(lambda: engine(frames), n)
                rows.append({"backend": name, "network": net, "batch": batch, "engine": engine_time,
                             "torch_cpu": torch_time,
                             "speedup_vs_torch_cpu": torch_time["p50_us"] / engine_time["p50_us"]})
    return rows


def measure_learners(backends, iterations: int) -> list[dict[str, Any]]:
    from rlbench.algorithms.ddpg import DDPG
    from rlbench.algorithms.dqn import DQN
    from rlbench.protocols import EnvSpec, Sample

    rng = np.random.default_rng(0)
    cartpole = EnvSpec("CartPole-v1", 1, (4,), "float32", "discrete", n_actions=2)
    pendulum = EnvSpec("Pendulum-v1", 1, (3,), "float32", "continuous", action_shape=(1,),
                       action_low=(-2.0,), action_high=(2.0,))
    cases = ((DQN(), cartpole, {"hidden_sizes": (120, 84), "batch_size": 128}),
             (DDPG(), pendulum, {"batch_size": 128}))
    rows = []
    for algorithm, spec, overrides in cases:
        config = algorithm.Config(**overrides)
        batch = config.batch_size
        obs_dim = spec.observation_shape[0]
        actions = (rng.integers(spec.n_actions, size=batch) if spec.n_actions
                   else rng.uniform(-2, 2, (batch, 1)).astype(np.float32))
        sample = Sample(np.arange(batch), {
            "obs": rng.standard_normal((batch, obs_dim)).astype(np.float32), "action": actions,
            "reward": rng.standard_normal(batch).astype(np.float32),
            "next_obs": rng.standard_normal((batch, obs_dim)).astype(np.float32),
            "done": (rng.random(batch) < 0.05).astype(np.float32)}, np.ones(batch, np.float32))
        for name, backend in backends:
            if not backend.capabilities.supports(algorithm.name, "learner"):
                continue
            learner = algorithm.make_learner(spec, backend, config, 0)
            update = time_calls(lambda: learner.update(sample), iterations // 10 or 1)
            publish = time_calls(learner.weights, iterations // 10 or 1)
            rows.append({"backend": name, "algorithm": algorithm.name, "batch": batch,
                         "hidden": list(config.hidden_sizes), "update": update, "weights_export": publish})
    return rows


def measure_cnn_learners(backends, iterations: int) -> list[dict[str, Any]]:
    """A DQN update on a batch of 32 uint8 Atari frame stacks (CleanRL's dqn_atari settings: the Nature
    network, MSE, no double DQN) on each backend that runs a CNN learner, and its weights' export."""
    from rlbench.algorithms.dqn import DQN
    from rlbench.protocols import EnvSpec, Sample

    rng = np.random.default_rng(0)
    algorithm = DQN()
    config = algorithm.Config(**algorithm.presets["atari"])
    batch = config.batch_size
    rows = []
    for net, shape in CNN_NETWORKS:
        spec = EnvSpec("ALE/Breakout-v5", 1, shape, "uint8", "discrete", n_actions=ATARI_ACTIONS, frame_stack=shape[0])
        sample = Sample(np.arange(batch), {
            "obs": rng.integers(0, 256, (batch, *shape), dtype=np.uint8),
            "action": rng.integers(ATARI_ACTIONS, size=batch),
            "reward": rng.choice(np.array([-1.0, 0.0, 1.0], np.float32), batch),
            "next_obs": rng.integers(0, 256, (batch, *shape), dtype=np.uint8),
            "done": (rng.random(batch) < 0.01).astype(np.float32)}, np.ones(batch, np.float32))
        for name, backend in backends:
            capabilities = backend.capabilities
            if "cnn" not in capabilities.networks or not capabilities.supports(algorithm.name, "learner"):
                continue
            learner = algorithm.make_learner(spec, backend, config, 0)
            n = max(10, iterations // 100)
            update = time_calls(lambda: learner.update(sample), n)
            publish = time_calls(learner.weights, n)
            rows.append({"backend": name, "algorithm": algorithm.name, "network": net, "batch": batch,
                         "update": update, "weights_export": publish})
    return rows


@click.command("compute")
@click.option("--iterations", default=5000, show_default=True, help="timed calls at batch 1 (a tenth at batch 256 and for learner steps)")
@click.option("--json", "as_json", is_flag=True, help="print the measurements as JSON")
def command(iterations: int, as_json: bool) -> None:
    """Actor inference (MLPs at batch 1 and 256, the Nature CNN at 1 and 32) of each compute backend vs a
    torch CPU forward of the same network, and the learner update step, torch and numpy BLAS pinned to
    one thread."""
    from rlbench.kit.bench import pin_one_thread

    pinned = pin_one_thread()
    backends = available_backends()
    inference = measure_inference(backends, iterations) + measure_cnn_inference(backends, iterations)
    learners = measure_learners(backends, iterations) + measure_cnn_learners(backends, iterations)
    if as_json:
        click.echo(json.dumps({"threads": pinned, "inference": inference, "learner": learners}, indent=2))
        return
    click.echo(f"# threads: {pinned}; p50 latency in microseconds")
    click.echo(f"{'backend':<10} {'network':<24} {'batch':>5} {'engine':>9} {'torch cpu':>10} {'torch/engine':>13}")
    for row in inference:
        click.echo(f"{row['backend']:<10} {row['network']:<24} {row['batch']:>5} {row['engine']['p50_us']:>9.1f} "
                   f"{row['torch_cpu']['p50_us']:>10.1f} {row['speedup_vs_torch_cpu']:>12.2f}x")
    click.echo(f"\n{'backend':<10} {'learner':<8} {'network':<20} {'batch':>5} {'update p50':>11} "
               f"{'weights() p50':>14}")
    for row in learners:
        network = row.get("network") or "mlp " + "-".join(str(h) for h in row["hidden"])
        click.echo(f"{row['backend']:<10} {row['algorithm']:<8} {network:<20} {row['batch']:>5} "
                   f"{row['update']['p50_us']:>11.1f} {row['weights_export']['p50_us']:>14.1f}")
