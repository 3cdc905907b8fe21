"""What a runtime loop gets: the built components, the budget, and where to record."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rlbench.config import RunConfig
from rlbench.metrics import Recorder


@dataclass
class Accounting:
    """Every transition an actor produces is stored or dropped, and a drop has a cause."""

    produced: int = 0
    stored: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, cause: str, n: int = 1) -> None:
        self.dropped[cause] = self.dropped.get(cause, 0) + n

    def to_dict(self) -> dict[str, Any]:
        dropped = sum(self.dropped.values())
        return {"produced": self.produced, "stored": self.stored, "dropped": dropped,
                "dropped_by_cause": dict(self.dropped), "balanced": self.produced == self.stored + dropped}


@dataclass
class LearningCurve:
    """Episode returns over env steps and wall time."""

    t0: float = field(default_factory=time.perf_counter)
    points: list[dict[str, float]] = field(default_factory=list)

    def episode(self, step: int, episode_return: float, length: int) -> None:
        self.points.append({"step": int(step), "time_s": round(time.perf_counter() - self.t0, 4),
                            "return": float(episode_return), "length": int(length)})


@dataclass
class Budget:
    total_steps: int
    seconds: float | None = None
    t0: float = field(default_factory=time.perf_counter)
    interrupted: str = ""  # why the run was stopped early (set by the runner on Ctrl-C, SIGTERM, SIGHUP)
    stop_signal: int = 0  # the signal that stopped it, for the exit code
    on_progress: Callable[[int], None] | None = None

    def exhausted(self, step: int) -> bool:
        if self.interrupted or step >= self.total_steps:
            return True
        return self.seconds is not None and time.perf_counter() - self.t0 >= self.seconds

    def progress(self, step: int) -> None:
        if self.on_progress is not None:
            self.on_progress(step)


@dataclass
class LoopStats:
    env_steps: int = 0
    updates: int = 0
    samples: int = 0  # transitions sampled from replay
    # perf_counter when the first and the last env step happened: the steady window, start-up excluded
    first_step_t: float | None = None
    last_step_t: float | None = None
    startup_s: float | None = None  # when the window's clock is another host's: start-up as the launcher saw it
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PeriodicEvaluation:
    """`--eval-every N`: greedy episodes of the learner's current weights every N env steps, on an
    environment copy of their own, by a second actor, so the training actor (its weights, its
    exploration) is untouched. Each point records env steps, updates, and the training wall and CPU
    time so far; time spent evaluating is taken off the training clocks (learning curve, budget), so
    a run with evaluation reports the same training time as one without."""

    every: int
    play: Callable[[Any], dict[str, Any]]  # greedy episodes of an actor on its own environment copy
    make_actor: Callable[[], Any]
    points: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0  # wall time spent evaluating
    cpu_s: float = 0.0  # this process's CPU time spent evaluating
    cpu0: float = field(default_factory=time.process_time)
    next_at: int = 0
    actor: Any = None

    def __post_init__(self) -> None:
        self.next_at = self.every

    def training_cpu_s(self) -> float:
        """This process's CPU time so far, less what evaluating took."""
        return time.process_time() - self.cpu0 - self.cpu_s

    def record(self, step: int, updates: int, time_s: float, cpu_s: float, outcome: dict[str, Any]) -> None:
        self.points.append({"step": int(step), "updates": int(updates), "time_s": round(time_s, 4),
                            "cpu_s": round(cpu_s, 4),
                            "return": outcome["mean_return"], "std_return": outcome["std_return"],
                            "episodes": outcome["episodes"]})


@dataclass
class RunContext:
    config: RunConfig
    algorithm: Any  # rlbench.protocols.Algorithm
    hp: Any  # the algorithm's Config instance
    env: Any  # rlbench.protocols.Environment
    compute: Any  # rlbench.protocols.ComputeBackend
    replay: Any | None  # rlbench.protocols.ReplayMemory
    budget: Budget
    replay_capabilities: Any = None  # rlbench.protocols.ReplayCapabilities of the chosen memory
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # plugin options by kind, as validated
    recorder: Recorder = field(default_factory=Recorder)
    accounting: Accounting = field(default_factory=Accounting)
    curve: LearningCurve = field(default_factory=LearningCurve)
    actor: Any = None  # filled by the loop; the runner evaluates it greedily afterwards
    evaluation: PeriodicEvaluation | None = None  # --eval-every

    def evaluate_if_due(self, step: int, learner: Any) -> None:
        """Called by a loop between iterations: the learner's current weights, evaluated when
        --eval-every's next point is due (the end of training is the runner's final evaluation)."""
        ev = self.evaluation
        if ev is None or step < ev.next_at or self.budget.exhausted(step):
            return
        ev.next_at = (step // ev.every + 1) * ev.every
        t0, cpu0, training_cpu = time.perf_counter(), time.process_time(), ev.training_cpu_s()
        if ev.actor is None:
            ev.actor = ev.make_actor()
        ev.actor.load_weights(learner.weights(), learner.updates)
        outcome = ev.play(ev.actor)
        ev.cpu_s += time.process_time() - cpu0
        ev.record(step, learner.updates, t0 - self.curve.t0, training_cpu, outcome)
        spent = time.perf_counter() - t0
        ev.seconds += spent
        self.curve.t0 += spent  # the training clocks go on as if no evaluation had happened
        self.budget.t0 += spent
