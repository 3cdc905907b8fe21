"""Plain-torch references for `rlbench gpu bench`: the same work written as torch users write it,
with none of rlbench's machinery, so each rlbench figure stands beside what a user could get alone.

Each comes eager (every kernel launched from the host) and captured (K calls in one CUDA graph, the
pattern of torch's CUDA-graph notes: warm up on a side stream, capture, replay), the two rows of
the H100 measurements (plugins/gpu/README.md, "What the hardware taught"). Captured needs CUDA.

- `ReferenceDQN`: MLP 4-128-128-2, Adam (fused; capturable when captured), proportional PER by
  cumsum + searchsorted over all priorities, importance weights, TD targets from a target network,
  new priorities written back by index.
- `ReferencePER`: the PER cycle alone: sample a batch by cumsum + searchsorted, write priorities back.
- `ReferenceCartPole`: gymnasium's CartPole dynamics over a batch, actions argmax of an MLP,
  ended rows reset by `torch.where`.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F


def mlp(sizes: tuple[int, ...], device: torch.device) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers).to(device)


class ReferencePER:
    def __init__(self, capacity: int, batch_size: int, device: torch.device, alpha: float = 0.6, beta: float = 0.4):
        self.capacity, self.batch_size, self.alpha, self.beta = capacity, batch_size, alpha, beta
        self.priorities = torch.rand(capacity, device=device) + 0.01

    def sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = self.priorities ** self.alpha
        cdf = scaled.cumsum(0)
        total = cdf[-1]
        draws = torch.rand(self.batch_size, device=cdf.device) * total
        indices = torch.searchsorted(cdf, draws).clamp(max=self.capacity - 1)
        weights = (self.capacity * scaled[indices] / total) ** -self.beta
        return indices, weights / weights.max()

    def cycle(self) -> None:
        indices, weights = self.sample()
        self.priorities[indices] = weights + 0.01  # stands in for new |TD errors|


class ReferenceDQN:
    def __init__(self, capacity: int, batch_size: int, device: torch.device, capturable: bool = False):
        self.per = ReferencePER(capacity, batch_size, device)
        self.q = mlp((4, 128, 128, 2), device)
        self.target = copy.deepcopy(self.q)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=1e-3, fused=True,
                                          capturable=capturable and device.type == "cuda")
        self.obs = torch.randn(capacity, 4, device=device)
        self.next_obs = torch.randn(capacity, 4, device=device)
        self.action = torch.randint(0, 2, (capacity,), device=device)
        self.reward = torch.ones(capacity, device=device)
        self.done = (torch.rand(capacity, device=device) < 0.05).float()

    def update(self) -> None:
        indices, weights = self.per.sample()
        q = self.q(self.obs[indices]).gather(1, self.action[indices].unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_q = self.target(self.next_obs[indices]).max(1).values
            target = self.reward[indices] + 0.99 * (1 - self.done[indices]) * next_q
        loss = (weights * F.smooth_l1_loss(q, target, reduction="none")).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.per.priorities[indices] = (target - q).detach().abs() + 1e-6


class ReferenceCartPole:
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02

    def __init__(self, num_envs: int, device: torch.device):
        self.state = (torch.rand(num_envs, 4, device=device) - 0.5) * 0.1
        self.steps = torch.zeros(num_envs, device=device)
        self.policy = mlp((4, 128, 128, 2), device)

    @torch.no_grad()
    def step(self) -> None:
        action = self.policy(self.state).argmax(1)
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = torch.where(action == 1, self.force_mag, -self.force_mag)
        cos, sin = torch.cos(theta), torch.sin(theta)
        total_mass, polemass_length = self.masspole + self.masscart, self.masspole * self.length
        temp = (force + polemass_length * theta_dot ** 2 * sin) / total_mass
        theta_acc = (self.gravity * sin - cos * temp) / (self.length * (4 / 3 - self.masspole * cos ** 2 / total_mass))
        x_acc = temp - polemass_length * theta_acc * cos / total_mass
        new = torch.stack((x + self.tau * x_dot, x_dot + self.tau * x_acc, theta + self.tau * theta_dot,
                           theta_dot + self.tau * theta_acc), 1)
        self.steps += 1
        done = (new[:, 0].abs() > 2.4) | (new[:, 2].abs() > 12 * 2 * math.pi / 360) | (self.steps >= 500)
        fresh = (torch.rand_like(new) - 0.5) * 0.1
        self.state.copy_(torch.where(done.unsqueeze(1), fresh, new))
        self.steps.masked_fill_(done, 0)


def captured(step: Callable[[], None], repeats: int, device: torch.device) -> Callable[[], None]:
    """`repeats` calls of step() in one CUDA graph, as torch's CUDA-graph notes capture a training step."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            step()
    return graph.replay


def eager(step: Callable[[], None], repeats: int, device: Any = None) -> Callable[[], None]:
    def run() -> None:
        for _ in range(repeats):
            step()
    return run
