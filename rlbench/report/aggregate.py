"""Aggregates across environments (rliable's core figures): a method is a combination of every axis
but `env`; its runs on each environment are normalised, (score - random) / (reference - random),
and pooled with environments as strata: median, IQM, mean and optimality gap with their stratified
bootstrap intervals, the performance profile with its band, and the probability that one method
beats another, averaged over the environments both ran."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlbench.report.collect import Combination, Group, Run
from rlbench.report.measures import normalised_score, unscored_envs


@dataclass
class Method:
    label: str
    runs_by_env: dict[str, list[Run]] = field(default_factory=dict)

    def scores(self, group: Group) -> dict[str, list[float]]:
        return {env: [normalised_score(run, group) for run in runs] for env, runs in self.runs_by_env.items()}


def methods(group: Group) -> list[Method]:
    """The study's combinations with the env axis taken out, in the study's order."""
    others = [axis for axis in group.axes if axis != "env"]
    found: dict[str, Method] = {}
    for combination in group.combinations:
        label = " ".join(f"{a}={combination.values.get(a)}" for a in others) or "all runs"
        method = found.setdefault(label, Method(label))
        for run in combination.runs:
            method.runs_by_env.setdefault(run.env, []).append(run)
    return [m for m in found.values() if m.runs_by_env]


def available(group: Group) -> str:
    """"" when the study can be aggregated over environments, else why not."""
    missing = unscored_envs(group)
    if missing:
        return (f"no random and reference scores for {', '.join(missing)}: add them to the study file "
                f"([sweep.reference_scores] \"{missing[0]}\" = {{random = R, reference = S}})")
    if not any(run.data.get("evaluation") for run in group.runs()):
        return "no run has a final greedy evaluation (--eval-episodes 0)"
    return ""


def aggregate_estimates(group: Group) -> list[tuple[Method, dict[str, object]]]:
    """Each method's median, IQM, mean and optimality gap of normalised final scores, with their
    stratified bootstrap intervals; below MIN_RUNS runs in an environment, where an aggregate has
    none, with the range from every environment's worst run to every environment's best."""
    from rlbench.report.stats import AGGREGATES, aggregate_range, interval

    rows = []
    for method in methods(group):
        strata = list(method.scores(group).values())
        estimates = {}
        for name, statistic in AGGREGATES.items():
            e = interval(strata, statistic, per_task=True)
            estimates[name] = aggregate_range(strata, statistic) if e.kind == "none" and e.n else e
        rows.append((method, estimates))
    return rows


def shown_aggregates(group: Group) -> tuple[list[tuple[str, str]], str]:
    """(column title, aggregate name) for each aggregate worth showing, and a note on any left out:
    over two environments the median of the per-environment means is their mean, so one column
    says "median = mean" instead of two identical ones."""
    envs = len(group.envs())
    if envs == 2:
        return ([("median = mean", "mean"), ("IQM", "IQM"), ("optimality gap", "optimality gap")],
                "Over two environments the median of the per-environment means is their mean: one column for both.")
    return [(name, name) for name in ("median", "IQM", "mean", "optimality gap")], ""


def improvement(group: Group, x: Method, y: Method):
    """P(X beats Y), averaged over the environments both ran."""
    from rlbench.report.stats import probability_of_improvement

    xs, ys = x.scores(group), y.scores(group)
    envs = [env for env in xs if env in ys]
    return probability_of_improvement([xs[e] for e in envs], [ys[e] for e in envs])


def verdict_combinations(group: Group) -> list[Combination]:
    """What verdicts compare: the combinations, or with an env axis the methods (each one's runs on
    every environment, which the probability of improvement takes task by task)."""
    if "env" not in group.axes:
        return [c for c in group.combinations if c.runs]
    merged = []
    for method in methods(group):
        runs = [run for env_runs in method.runs_by_env.values() for run in env_runs]
        merged.append(Combination(method.label, {}, runs))
    return merged
