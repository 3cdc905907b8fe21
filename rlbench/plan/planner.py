"""Enumerate the mappings of a job, keep those that can run, predict and rank them; the plan file.

Mappings: replay memory x compute backend x placement x transport x distribution policy (single
learner, or data-parallel with each learner count that splits the batch) x actor count x host for
replay-loop algorithms (DQN, DDPG); compute backend (with each measured setting of its parallelism
option, e.g. DPUs) x dataset size x host for tabular algorithms offline. Online tabular learning is
one local process with nothing to place, so it is not planned.

A mapping is proposed only when every component is available on its host (measured there by the
profile) and `rlbench.validate.validate` accepts its configuration, the same check `rlbench run`
makes; each family left out is listed once, with the reason. Roles split across hosts are not
proposed: no profile measures the links between hosts. A profile measured while someone else's
work disturbed it is refused, naming the figures, unless the caller allows it.

Ranking is strictly by the predicted objective. Rows whose predictions are closer than the
predictions' spread (at least TIE_TOLERANCE) to their group's leader are marked as tied with it:
the model cannot tell them apart, and the user may prefer the simpler one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from rlbench.errors import RlbenchError
from rlbench.plan.model import (
    Mapping,
    ModelError,
    Power,
    Prediction,
    Schedule,
    core_each_ceiling,
    predict,
    schedule_of,
    supply_knee,
    with_actors,
)
from rlbench.plan.profile import Job, ProfileError, contended_figures, learner_counts

PLAN_SCHEMA = "rlbench.plan/1"
OBJECTIVES = ("throughput", "samples-per-joule")
TIE_TOLERANCE = 0.03  # predictions closer than this (or than their spread) are a tie
PAYS = 0.10  # a mapping must be predicted this much faster than another to be said to pay
WORTH = 0.5  # more learners can pay for a model when each added one could buy at least this much of one
FILTER_KEYS = ("placement", "transport", "replay", "compute", "actors", "policy", "learners")


@dataclass
class Row:
    mapping: Mapping
    prediction: Prediction
    rank: int = 0  # 0: not ranked (the default mapping, shown beside rows a filter kept)
    tie: int | None = None  # the rank of the row it ties with (its group's leader), if any


@dataclass
class Knee:
    family: str  # the mapping without its actor count
    compute: str  # the learner's device
    knee: int | None  # actors whose supply meets the rest of the mapping's demand (None: still short at the maximum)
    curve: list[tuple[int, float, float | None]]  # (actors, env steps/s, samples/J)
    supply: float | None = None  # env steps/s one actor supplies running free (from measured figures)
    demand: float | None = None  # env steps/s the learner, node or CPU take at most, at the knee


@dataclass
class Plan:
    job: Job
    objective: str
    schedule: Schedule
    power: Power
    this_host: str
    rows: list[Row]
    default: Row | None
    excluded: dict[str, str] = field(default_factory=dict)  # what was left out -> why (each once)
    knees: list[Knee] = field(default_factory=list)
    offline: bool = False
    contended: list[str] = field(default_factory=list)  # figures measured while others used the machine
    only: dict[str, str] = field(default_factory=dict)  # the filter the ranked rows passed
    candidates: list[Row] = field(default_factory=list)  # every mapping predicted, the filter's or not
    figures: dict[str, Any] = field(default_factory=dict)  # the job's profile figures on this host

    @property
    def chosen(self) -> Row:
        return self.rows[0]

    def gain_over_default(self, row: Row | None = None) -> float | None:
        """Predicted throughput of `row` (the chosen one) over the default mapping's, less 1."""
        row = row or self.chosen
        if self.default is None or not self.default.prediction.throughput:
            return None
        return row.prediction.throughput / self.default.prediction.throughput - 1


def _gate(config: Any, registry: Any, *, here: bool) -> str | None:
    """None when `rlbench run` would accept the configuration; else its one-line refusal. On another
    host, availability is that host's profile's business, not this machine's probes."""
    from rlbench.errors import UnavailableComponentError
    from rlbench.validate import validate

    try:
        validate(config, registry)
    except UnavailableComponentError as exc:
        return str(exc) if here else None
    except RlbenchError as exc:
        return str(exc)
    return None


def _usable(table: dict[str, Any], kind: str, name: str, excluded: dict[str, str]) -> bool:
    entry = table.get(name)
    if entry is None:
        excluded[f"{kind} {name}"] = "not in the profile (installed after profiling?): run `rlbench profile` again"
        return False
    if not entry.get("available"):
        excluded[f"{kind} {name}"] = entry.get("reason") or "unavailable when profiled"
        return False
    return True


def enumerate_mappings(job: Job, host: str, entry: dict[str, Any], figures: dict[str, Any], registry: Any, *,
                       here: bool, max_actors: int, datasets: tuple[int, ...],
                       excluded: dict[str, str]) -> list[Mapping]:
    algorithm = registry.get("algorithm", job.algo)
    base = {"algo": job.algo, "env": job.env, "num_envs": job.num_envs, "host": host,
            "hyperparameters": job.hyperparameters}
    if figures["kind"] == "tabular-offline":
        return _tabular_mappings(job, figures, registry, base, here=here, datasets=datasets, excluded=excluded)
    roles = algorithm.capabilities.roles
    memories = [c.name for c in registry.components("replay") if _usable(figures["replay"], "replay", c.name, excluded)]
    computes = []
    for component in registry.components("compute"):
        if not all(component.capabilities.supports(job.algo, role, algorithm.capabilities.needs_of(role))
                   for role in roles):
            does_not = component.capabilities.does_not
            excluded[f"compute {component.name}"] = f"cannot run the {job.algo} {' and '.join(roles)}" + \
                (f" ({does_not})" if does_not else "")
        elif _usable(figures["compute"], "compute", component.name, excluded):
            computes.append(component.name)
    transports = []
    for component in registry.components("transport"):
        if "server" not in algorithm.capabilities.placements:
            break
        if not component.capabilities.crosses_processes:  # said in `rlbench run`'s words
            probe_config = Mapping(**base, compute="cpu", replay="prioritized", placement="server",
                                   transport=component.name).config()
            excluded[f"transport {component.name}"] = _gate(probe_config, registry, here=here) or \
                "stays inside one process"
        elif _usable(entry.get("transports", {}), "transport", component.name, excluded):
            transports.append(component.name)
    policies = {c.name for c in registry.components("policy")}
    parallel = learner_counts(figures["hyperparameters"]["batch_size"]) if "data-parallel" in policies else ()
    if "data-parallel" in policies and not parallel:
        excluded["policy data-parallel"] = f"batch {figures['hyperparameters']['batch_size']} splits into none of " \
            "the learner counts a plan considers"
    mappings = []
    for memory in memories:
        for compute in computes:
            local = Mapping(**base, compute=compute, replay=memory, placement="local")
            refusal = _gate(local.config(), registry, here=here)
            if refusal:
                excluded.setdefault(refusal, "")
            else:
                mappings.append(local)
            for placement in (p for p in ("server", "in-network") if p in algorithm.capabilities.placements):
                for transport in transports:
                    groups = [("single-learner", 1)] + [("data-parallel", n) for n in parallel if placement == "server"]
                    for policy, learners in groups:
                        first = Mapping(**base, compute=compute, replay=memory, placement=placement,
                                        transport=transport, policy=policy, learners=learners)
                        refusal = _gate(first.config(), registry, here=here)
                        if refusal:
                            excluded.setdefault(refusal, "")
                            continue
                        mappings.extend(with_actors(first, n) for n in range(1, max_actors + 1))
    return mappings


def _tabular_mappings(job: Job, figures: dict[str, Any], registry: Any, base: dict[str, Any], *, here: bool,
                      datasets: tuple[int, ...], excluded: dict[str, str]) -> list[Mapping]:
    mappings = []
    for component in registry.components("compute"):
        if not component.capabilities.supports(job.algo, "tabular"):
            excluded[f"compute {component.name}"] = f"cannot run {job.algo} (tabular)"
    for setting in figures["settings"]:
        options = tuple(("compute", param, value) for param, value in sorted(setting["options"].items()))
        label = f"compute {setting['compute']}" + (f"[{','.join(f'{p}={v}' for _, p, v in options)}]" if options else "")
        if not setting.get("available"):
            excluded[label] = setting.get("reason") or "unavailable when profiled"
            continue
        for size in datasets:
            mapping = Mapping(**base, compute=setting["compute"], options=options, dataset=size)
            refusal = _gate(mapping.config(), registry, here=here)
            if refusal:
                excluded.setdefault(refusal, "")
            else:
                mappings.append(mapping)
    return mappings


def _value(row: Row, objective: str) -> float:
    p = row.prediction
    return p.throughput if objective == "throughput" else (p.samples_per_joule or 0.0)


def _departures(mapping: Mapping) -> int:
    """How many choices differ from what `rlbench run` picks by default."""
    return sum((mapping.placement != "local", mapping.compute != "cpu", bool(mapping.options),
                mapping.replay not in (None, "prioritized"), mapping.actors != 1, mapping.learners != 1))


def rank(rows: list[Row], objective: str) -> list[Row]:
    """Best first, strictly by the predicted objective (equal predictions: the one closer to the
    defaults first, then by label, so the order is reproducible). A row within the predictions'
    spread (at least TIE_TOLERANCE) of its group's leader is marked as tied with that leader."""
    ranked = sorted(rows, key=lambda r: (-_value(r, objective), _departures(r.mapping), r.mapping.label()))
    leader: Row | None = None
    for position, row in enumerate(ranked, 1):
        row.rank, row.tie = position, None
        if leader is not None and _value(leader, objective) > 0:
            tolerance = max(TIE_TOLERANCE, math.hypot(leader.prediction.spread, row.prediction.spread))
            if _value(row, objective) >= _value(leader, objective) * (1 - tolerance):
                row.tie = leader.rank
                continue
        leader = row
    return ranked


def parse_only(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`--only KEY=VALUE` items as a filter (keys: FILTER_KEYS); a misspelt key is refused."""
    import difflib

    only: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise RlbenchError(f"--only takes KEY=VALUE (keys: {', '.join(FILTER_KEYS)}), got {item!r}")
        if key not in FILTER_KEYS:
            close = difflib.get_close_matches(key, FILTER_KEYS, n=1)
            raise RlbenchError(f"--only: unknown key {key!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                               + f" (keys: {', '.join(FILTER_KEYS)})")
        only[key] = value.strip()
    return only


def passes(mapping: Mapping, only: dict[str, str]) -> bool:
    return all(str(getattr(mapping, key)) == value for key, value in only.items())


def make_plan(job: Job, profile: dict[str, Any], *, objective: str = "throughput", max_actors: int = 4,
              datasets: tuple[int, ...] = (), watts: dict[str, float] | None = None, registry: Any = None,
              this_host: str | None = None, allow_contended: bool = False,
              only: dict[str, str] | None = None) -> Plan:
    """Every runnable mapping of `job` on every host of `profile`, predicted and ranked (those passing
    `only`, with the default mapping kept beside them). A profile whose figures someone else's work
    disturbed is refused (ProfileError naming them) unless `allow_contended`."""
    from rlbench.plan.profile import resolved_hyperparameters, this_host_key

    if objective not in OBJECTIVES:
        raise RlbenchError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    import rlbench

    registry = registry or rlbench.get_registry()
    algorithm = registry.get("algorithm", job.algo)
    registry.get("environment", job.env)
    schedule = schedule_of(resolved_hyperparameters(job, registry))
    offline = algorithm.capabilities.loop != "replay"
    if offline and not datasets:
        raise RlbenchError(f"{job.algo} is planned for offline learning: give --dataset N (transitions, repeatable)")
    this_host = this_host or this_host_key()
    excluded: dict[str, str] = {}
    rows: list[Row] = []
    power = None
    hosts_with_job = {key: entry for key, entry in profile["hosts"].items() if job.key in entry.get("jobs", {})}
    if not hosts_with_job:
        raise RlbenchError(f"the profile has no figures for {job.key!r}: run `rlbench profile --job "
                           f"{job.algo}:{job.env}`" + (" with the same --hp" if job.hyperparameters else ""))
    contended = [f"{key}: {what}" if len(hosts_with_job) > 1 else what for key, entry in hosts_with_job.items()
                 for what in contended_figures(entry, [job.key])]
    if contended and not allow_contended:
        raise ProfileError("the profile was measured while other processes used the machine, so its figures are "
                           "theirs as much as this machine's: " + "; ".join(contended)
                           + ". Profile again on a quiet machine (`rlbench profile`), or plan from it anyway with "
                           "--allow-contended")
    for key, entry in hosts_with_job.items():
        figures = entry["jobs"][job.key]
        host_power = Power.of(entry, watts)
        power = power or host_power
        for mapping in enumerate_mappings(job, key, entry, figures, registry, here=key == this_host,
                                          max_actors=max_actors, datasets=datasets, excluded=excluded):
            try:
                rows.append(Row(mapping, predict(mapping, figures, entry, schedule, host_power)))
            except ModelError as exc:
                excluded.setdefault(f"{mapping.label()}: {exc}" if "profile" not in str(exc) else str(exc), "")
    if not rows:
        raise RlbenchError("no mapping of this job can run here: " + "; ".join(
            f"{k}: {v}" if v else k for k, v in excluded.items()))
    if len(hosts_with_job) > 1:
        excluded["roles split across hosts"] = "no profile measures the links between hosts; each mapping runs on one host"
    only = only or {}
    kept = [row for row in rows if passes(row.mapping, only)]
    if not kept:
        raise RlbenchError(f"no mapping passes --only {' '.join(f'{k}={v}' for k, v in only.items())} "
                           f"(of {len(rows)} that can run)")
    ranked = rank(kept, objective)
    plan = Plan(job, objective, schedule, power, this_host, ranked, None, excluded, offline=offline,
                contended=contended, only=only, candidates=rows,
                figures=(hosts_with_job.get(this_host) or {}).get("jobs", {}).get(job.key, {}))
    plan.default = _default_row(plan, rows)
    plan.knees = _knees(ranked)
    return plan


def _default_row(plan: Plan, rows: list[Row]) -> Row | None:
    """The mapping `rlbench run` picks with no options (cpu, local; prioritized replay; at the
    chosen mapping's host and dataset size), ranked or not."""
    chosen = plan.chosen.mapping
    for row in rows:
        m = row.mapping
        if m.host != chosen.host or m.compute != "cpu" or m.options or m.placement != "local" or m.actors != 1:
            continue
        if plan.offline and m.dataset == chosen.dataset:
            return row
        if not plan.offline and m.replay == "prioritized":
            return row
    return None


def _knees(rows: list[Row]) -> list[Knee]:
    families: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        if row.mapping.placement != "local" and row.prediction.env_steps_per_s is not None:
            families.setdefault(row.mapping.family, []).append(row)
    knees = []
    for members in families.values():
        members.sort(key=lambda r: r.mapping.actors)
        curve = [(r.mapping.actors, r.prediction.env_steps_per_s, r.prediction.samples_per_joule) for r in members]
        found = supply_knee([(r.mapping.actors, r.prediction) for r in members])
        at = next((r for r in members if r.mapping.actors == found), members[-1]).prediction
        knees.append(Knee(family_label(members[0].mapping), members[0].mapping.compute, found, curve,
                          at.actor_supply, at.demand))
    return knees


def family_label(mapping: Mapping) -> str:
    return with_actors(mapping, 1).label().rsplit(" 1 actor", 1)[0]


@dataclass
class LearnerGain:
    """What a second (or Nth) learner is predicted to buy: a data-parallel mapping against the same
    mapping with one learner."""

    parallel: Row
    single: Row
    speedup: float  # updates/s ratio
    # model.core_each_ceiling: (speed-up, whole-batch update us, share + collectives us) with a core for
    # each learner, whatever this host has; None where the profile lacks a figure
    ceiling: tuple[float, float, float] | None = None

    @property
    def can_pay(self) -> bool | None:
        """Whether more learners could pay for this model on cores of their own: each added learner
        buying at least half of one (None: not known)."""
        if self.ceiling is None:
            return None
        return self.ceiling[0] >= 1 + (self.parallel.mapping.learners - 1) * WORTH

    @property
    def pays(self) -> bool:
        return self.speedup >= 1 + PAYS


def learner_gains(plan: Plan) -> list[LearnerGain]:
    """For each learner count, the best data-parallel mapping on this host the plan ranks, beside its
    one-learner twin (ranked or not)."""
    singles = {row.mapping: row for row in plan.candidates or plan.rows if row.mapping.learners == 1}
    best: dict[int, LearnerGain] = {}
    for row in plan.rows:
        m = row.mapping
        if m.learners <= 1 or m.host != plan.this_host:
            continue
        twin = singles.get(replace(m, policy="single-learner", learners=1))
        if twin is None or not twin.prediction.updates_per_s:
            continue
        gain = LearnerGain(row, twin, row.prediction.updates_per_s / twin.prediction.updates_per_s,
                           core_each_ceiling(plan.figures, m.compute, plan.schedule.batch_size, m.learners))
        if m.learners not in best or row.prediction.throughput > best[m.learners].parallel.prediction.throughput:
            best[m.learners] = gain
    return [best[n] for n in sorted(best)]


def knee_of(plan: Plan, mapping: Mapping) -> Knee | None:
    return next((k for k in plan.knees if k.family == family_label(mapping)), None)


def best_knees(plan: Plan) -> list[Knee]:
    """Per learner device, the knee of its best family (by throughput at the knee)."""
    best: dict[str, Knee] = {}
    for item in plan.knees:
        top = max(x for _, x, _ in item.curve)
        if item.compute not in best or top > max(x for _, x, _ in best[item.compute].curve):
            best[item.compute] = item
    return list(best.values())


# ------------------------------------------------------------------------------------ plan file
def plan_document(plan: Plan, row: Row, registry: Any, *, profile_path: str, budget: dict[str, Any]) -> dict[str, Any]:
    """The run file of `row` (what `rlbench run --plan FILE` runs, unchanged) and its [plan] table."""
    from rlbench.config import run_document

    flags = {(o.kind, o.param): o.flag for o in registry.run_options}
    document = run_document(row.mapping.config(**budget), flags)
    p = row.prediction
    item = knee_of(plan, row.mapping)
    document["plan"] = {
        "schema": PLAN_SCHEMA, "created_unix": time.time(), "objective": plan.objective, "rank": row.rank,
        "mapping": row.mapping.label(), "host": row.mapping.host, "profile": profile_path,
        "predicted_env_steps_per_s": p.env_steps_per_s, "predicted_updates_per_s": p.updates_per_s,
        "predicted_spread": p.spread, "tied_with_rank": row.tie,
        "predicted_samples_per_joule": p.samples_per_joule, "energy": p.energy_kind, "bottleneck": p.bottleneck,
        "actors_knee": item.knee if item else None,
        "modelled_hardware_updates_per_s": (p.modelled or {}).get("updates_per_s"),
        "note": "predicted by rlbench.plan.model from the profile; `rlbench plan --validate K` measures it",
    }
    return document


def write_plan(path: str, document: dict[str, Any]) -> None:
    from pathlib import Path

    from rlbench.config import to_toml

    Path(path).write_text(to_toml(document))
