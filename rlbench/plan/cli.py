"""`rlbench profile` and `rlbench plan` (attached to the CLI as `profile_command` and `plan_command`).

Only click and the standard library are imported at module level: the CLI imports this module to list
its commands.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from rlbench.plan.profile import (  # standard library only
    DEFAULT_CALIBRATED,
    DEFAULT_DATASETS,
    TRANSPORT_TIME_LIMIT_S,
)

DEFAULT_DATASETS_TEXT = ",".join(map(str, DEFAULT_DATASETS))


def _echo_err(line: str) -> None:
    click.echo(line, err=True)


def _parse_hp(values: tuple[str, ...]) -> dict[str, Any]:
    from rlbench.cli import (
        _parse_hyperparameters,  # `rlbench run --hp`'s parser: the same syntax
    )

    return _parse_hyperparameters(values)


def _parse_watts(values: tuple[str, ...]) -> dict[str, float]:
    watts = {}
    for item in values:
        device, sep, raw = item.partition("=")
        try:
            watts[device.strip()] = float(raw)
        except ValueError:
            raise click.BadParameter(f"{item!r} is not DEVICE=WATTS (e.g. cpu=12.5)", param_hint="--watts") from None
        if not sep or watts[device.strip()] <= 0:
            raise click.BadParameter(f"{item!r} is not DEVICE=WATTS with positive watts", param_hint="--watts")
    return watts


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of sizes") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{text!r}: sizes must be positive")
    return sizes


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _bytes(size: float) -> str:
    return f"{size / 1e6:,.2f} MB" if size >= 1e6 else f"{size / 1e3:,.1f} KB" if size >= 1e3 else f"{size:,.0f} B"


def _rate(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    if value >= 1e6:
        return f"{value / 1e6:,.1f}M"
    return f"{value:,.{digits}f}"


# ------------------------------------------------------------------------------------------ profile
@click.command("profile")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--job", "jobs", multiple=True, metavar="ALGO:ENV",
              help="A job to profile (repeatable) [default: dqn:CartPole-v1 and qlearning:Taxi-v3].")
@click.option("--hp", multiple=True, metavar="KEY=VALUE", help="Hyperparameter override of the jobs (repeatable).")
@click.option("--num-envs", type=click.IntRange(min=1), default=1, show_default=True, help="Environments per actor.")
@click.option("--dataset", "datasets", default=None, metavar="N,N",
              help=f"Dataset sizes tabular jobs are timed at [default: {DEFAULT_DATASETS_TEXT}].")
@click.option("--calibrate", default=",".join(DEFAULT_CALIBRATED), show_default=True, metavar="NAME,NAME",
              help="Transports with calibration runs (a real short run per placement); the others are predicted "
                   "from their replay-node figures and the calibrated loops' costs.")
@click.option("--transport-seconds", type=click.FloatRange(min=1), default=TRANSPORT_TIME_LIMIT_S, show_default=True,
              help="Time limit of each transport's measurements; a transport exceeding it is left out, with why.")
@click.option("--transports", "transport_names", default=None, metavar="NAME,NAME",
              help="Measure only these transports [default: all but those that start a cluster first (ray)].")
@click.option("--merge", is_flag=True, help="Combine the profile FILES (several hosts) into -o instead of measuring.")
@click.option("-o", "--out", default=None, type=click.Path(dir_okay=False),
              help="Where to write the profile [default: this machine's cached profile].")
@click.option("--json", "as_json", is_flag=True, help="Print the profile document as JSON.")
@click.option("--ray-address", default=None, metavar="auto|HOST:PORT",
              help="Profile every host of this Ray cluster instead of this machine, each on one of its own nodes.")
@click.option("--nodes", "node_names", default=None, metavar="NODE,NODE",
              help="With --ray-address: only the hosts of these nodes (IP, node id, host name, resource or label).")
def profile_command(files: tuple[str, ...], jobs: tuple[str, ...], hp: tuple[str, ...], num_envs: int,
                    datasets: str | None, calibrate: str, transport_seconds: float, transport_names: str | None,
                    merge: bool, out: str | None, as_json: bool, ray_address: str | None,
                    node_names: str | None) -> None:
    """Measure what each primitive costs on this machine (replay add/sample/update per memory, learner
    update and inference per compute backend, env step, round trip and bandwidth per transport, the
    replay node's per-message costs, a calibration run per placement) for the jobs a plan needs, and
    cache the profile for `rlbench plan`. Under two minutes for the default jobs. With --ray-address,
    each host of the cluster is measured on itself and all go into one profile."""
    from rlbench.plan import profile as profiles

    if node_names and not ray_address:
        raise click.UsageError("--nodes chooses nodes of a Ray cluster: give --ray-address too")
    if merge and ray_address:
        raise click.UsageError("--merge combines FILES and measures nothing: it takes no --ray-address")
    if merge:
        if len(files) < 2 or not out:
            raise click.UsageError("--merge takes two or more profile FILES and -o OUT")
        document = profiles.merge_profiles([profiles.load_profile(f) for f in files])
        profiles.save_profile(document, out)
        click.echo(f"merged {len(files)} profiles ({len(document['hosts'])} hosts: "
                   f"{', '.join(document['hosts'])}) into {out}")
        return
    if files:
        raise click.UsageError("profile FILES are only read with --merge")
    overrides = _parse_hp(hp)
    parsed = [profiles.Job.parse(text) for text in (jobs or profiles.DEFAULT_JOBS)]
    parsed = [profiles.Job.of(j.algo, j.env, overrides, num_envs) for j in parsed]
    sizes = _sizes(datasets) if datasets else profiles.DEFAULT_DATASETS
    path = out or str(profiles.default_path())
    names = _names(calibrate)
    settings = {"datasets": sizes, "calibrate": names, "transport_seconds": transport_seconds,
                "transports": _names(transport_names) if transport_names else None}
    if ray_address:
        _profile_cluster(ray_address, tuple(n.strip() for n in (node_names or "").split(",") if n.strip()),
                         parsed, settings, path, as_json)
        return
    document = _measure_into(path, parsed, **settings)
    if as_json:
        click.echo(json.dumps(document, indent=1, default=str))
        return
    entry = document["hosts"][profiles.this_host_key()]
    click.echo(format_profile(entry, [j.key for j in parsed]))
    click.echo(f"profile written to {path} ({entry['profiling_s']:.1f} s)")


def _profile_cluster(address: str, node_names: tuple[str, ...], jobs: list[Any], settings: dict[str, Any],
                     path: str, as_json: bool) -> None:
    """`rlbench profile --ray-address`: every host measured on itself, merged into the profile at `path`."""
    from rlbench.errors import RlbenchError
    from rlbench.cluster import profile as cluster_profile
    from rlbench.cluster.ray import connect, import_ray

    t0 = time.perf_counter()
    ray = import_ray()
    connected = connect(ray, address, 1)
    try:
        measured, failed = cluster_profile.profile_cluster(
            ray, jobs, settings, node_names=node_names,
            progress=lambda line: _echo_err(f"[{time.perf_counter() - t0:5.1f} s] {line}"))
    finally:
        if connected:
            ray.shutdown()
    if measured:
        document = _save_entries(path, measured)
        if as_json:
            click.echo(json.dumps(document, indent=1, default=str))
        else:
            for entry in measured.values():
                click.echo(format_profile(entry, [j.key for j in jobs]))
            click.echo(f"profile of {len(measured)} host(s) written to {path} ({time.perf_counter() - t0:.1f} s)")
    if failed:
        raise RlbenchError("not profiled: " + "; ".join(failed))


def _measure_into(path: str, jobs: list[Any], **settings: Any) -> dict[str, Any]:
    """Measure `jobs` here and merge them into the profile at `path` (other jobs and hosts kept)."""
    from rlbench.plan import profile as profiles

    t0 = time.perf_counter()
    key, entry = profiles.profile_host(jobs, **settings,
                                       progress=lambda line: _echo_err(f"[{time.perf_counter() - t0:5.1f} s] {line}"))
    return _save_entries(path, {key: entry})


def _save_entries(path: str, entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The profile at `path` with these hosts' new measurements merged in (other jobs and hosts kept), saved."""
    from pathlib import Path

    from rlbench.plan import profile as profiles

    document = profiles.load_profile(path) if Path(path).exists() else None
    for key, entry in entries.items():
        document = profiles.add_host_entry(document, key, entry)
    profiles.save_profile(document, path)
    return document


def profiles_contended(entry: dict[str, Any], keys: list[str]) -> list[str]:
    from rlbench.plan.profile import contended_figures

    return contended_figures(entry, keys)


def format_profile(entry: dict[str, Any], keys: list[str]) -> str:
    fingerprint = entry["fingerprint"]
    lines = [f"host {entry['host']}: {fingerprint.get('cpu')}, {fingerprint.get('cores_usable') or fingerprint.get('cores')} "
             f"cores; power: " + (f"RAPL {entry['power']['idle_w']:.1f} W idle + {entry['power']['per_busy_core_w']:.1f} "
                                  "W per busy core" if entry["power"].get("kind") == "measured"
                                  else f"not measured ({entry['power'].get('reason')})")]
    for name, transport in entry.get("transports", {}).items():
        if transport.get("available"):
            cases = ", ".join(f"{_bytes(c['size'])} {c['p50_us']:,.0f} us" + (f" ({c['mb_per_s']:,.0f} MB/s one way)"
                                                                            if c["size"] >= 1e5 else "")
                              for c in transport["cases"])
            lines.append(f"  transport {name:<6} round trip p50: {cases}")
        elif transport.get("crosses_processes"):
            lines.append(f"  transport {name:<6} not measured: {transport.get('reason')}")
    for key in keys:
        job = entry["jobs"][key]
        lines.append(f"job {key} ({job['profiling_s']:.1f} s)")
        if job["kind"] == "tabular-offline":
            for s in job["settings"]:
                opts = ",".join(f"{k}={v}" for k, v in s["options"].items())
                name = s["compute"] + (f"[{opts}]" if opts else "")
                if not s.get("available"):
                    lines.append(f"  {name:<18} unavailable: {s.get('reason')}")
                    continue
                modelled = s.get("modelled")
                lines.append(f"  {name:<18} fit_offline {s['fixed_s'] * 1e3:8.2f} ms + {s['per_update_s'] * 1e9:7.2f} ns/update"
                             + (f"   [modelled hardware: {modelled['fixed_s'] * 1e3:.2f} ms + "
                                f"{modelled['per_update_s'] * 1e9:.2f} ns/update]" if modelled else ""))
            continue
        lines.append(f"  env step {job['env_step_us']:.1f} us")
        sizes = job.get("messages") or {}
        if sizes:
            lines.append("  messages: " + ", ".join(f"{name} {_bytes(size)}" for name, size in sizes.items())
                         + (f" (an image's {job['frames']} frames per observation: each once in an INSERT, k + 1 "
                            "per row in a BATCH)" if job.get("frames") else ""))
        for name, c in job["compute"].items():
            lines.append(f"  compute {name:<8} " + (f"inference {c['inference_us']:.1f} us, learner update "
                                                    f"{c['learner_update_us']:.0f} us, publish {c['publish_us']:.1f} us"
                                                    if c.get("available") else f"unavailable: {c.get('reason')}"))
        for name, m in job["replay"].items():
            lines.append(f"  replay {name:<12} " + (f"add {m['add_step_us']:.1f} / insert {m['add_insert_us']:.1f} / "
                                                    f"sample {m['sample_us']:.1f} / update {m['update_us']:.1f} us"
                                                    if m.get("available") else f"unavailable: {m.get('reason')}"))
        for name, node in (job.get("replay_node") or {}).items():
            if "failed" in node:
                lines.append(f"  replay node {name:<18} failed: {node['failed']}")
                continue
            trip = node.get("sample_rtt_us") or node.get("push_round_us")
            lines.append(f"  replay node {name:<18} INSERT {node['insert_rtt_us']:.0f} us, "
                         f"{'SAMPLE' if 'sample_rtt_us' in node else 'push round'} {trip:.0f} us, "
                         f"FETCH {node['fetch_rtt_us']:.0f} us")
        for world, reduce in ((job.get("allreduce") or {}).get("by_learners") or {}).items():
            if not reduce.get("available"):
                lines.append(f"  all-reduce among {world} learners failed: {reduce['reason']}")
                continue
            lines.append(f"  all-reduce (gloo, {world} learners, {reduce['parameters']:,} parameters) "
                         f"{reduce['allreduce_us']:.0f} us + agreement {reduce.get('agreement_us', 0):.0f} us")
        for name, run in (job.get("calibration") or {}).items():
            if "failed" in run:
                lines.append(f"  calibration {name:<22} failed: {run['failed']}")
                continue
            spread = (run.get("spread") or {}).get("env_steps_per_s")
            line = (f"  calibration {name:<22} {run['env_steps_per_s']:9,.0f} env steps/s"
                    + (f" ±{spread:.1%}" if spread is not None else "") + f" ({run['repeats']} runs"
                    + (f", {run['left_out']} disturbed left out" if run.get("left_out") else ""))
            if run.get("free_step_us"):
                line += f"; actor alone {run['free_step_us']:.1f} us/step"
            if run.get("learner_compute_us"):
                line += f"; learner update {run['learner_compute_us']:.0f} us"
            if run.get("learner_wait_us"):  # what a transport's own run (`U/server/wait`) is read for
                line += f", wait {run['learner_wait_us']:.0f} us"
            if run.get("learner_allreduce_us"):  # and its lock-step run (`U/server/data-parallel-2`)
                line += f", all-reduce {run['learner_allreduce_us']:.0f} us"
            lines.append(line + ")" + (f"  CONTENDED: {run['contended']}" if run.get("contended") else ""))
    contended = profiles_contended(entry, keys)
    if contended:
        lines.append("WARNING: figures measured while other processes used the machine (`rlbench plan` refuses "
                     "them unless --allow-contended): " + "; ".join(contended))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- plan
@click.command("plan")
@click.option("--algo", default="dqn", show_default=True, help="Algorithm.")
@click.option("--env", default="CartPole-v1", show_default=True, help="Environment id.")
@click.option("--hp", multiple=True, metavar="KEY=VALUE", help="Hyperparameter override (repeatable).")
@click.option("--num-envs", type=click.IntRange(min=1), default=1, show_default=True, help="Environments per actor.")
@click.option("--dataset", "datasets", default=None, metavar="N,N",
              help=f"Offline tabular: dataset sizes to plan for [default: {DEFAULT_DATASETS_TEXT}].")
@click.option("--objective", type=click.Choice(["throughput", "samples-per-joule"]), default="throughput",
              show_default=True)
@click.option("--max-actors", type=click.IntRange(min=1), default=None,
              help="Most actor processes to consider [default: twice the usable cores, at most 8].")
@click.option("--only", "only_items", multiple=True, metavar="KEY=VALUE",
              help="Rank only mappings with this placement, transport, replay, compute, actors, policy or learners "
                   "(repeatable; the default mapping stays beside them).")
@click.option("--profile", "profile_file", type=click.Path(dir_okay=False), default=None,
              help="Profile to use [default: this machine's cached one, measured now if absent].")
@click.option("--allow-contended", is_flag=True,
              help="Plan from a profile measured while other processes used the machine (it is refused otherwise).")
@click.option("--watts", multiple=True, metavar="DEVICE=W",
              help="Rated power per busy core where no meter exists (modelled), e.g. cpu=12.5.")
@click.option("--top", type=click.IntRange(min=1), default=12, show_default=True, help="Ranked rows to print.")
@click.option("--validate", "validate_k", type=click.IntRange(min=0), default=0, metavar="K",
              help="Run the top K mappings and the default one; print predicted vs measured.")
@click.option("--holdout", "holdout_n", type=click.IntRange(min=0), default=0, metavar="N",
              help="Also run N mappings drawn at random from those the profile did not calibrate on.")
@click.option("--check", "check_first", is_flag=True,
              help="Run the first choice and the default for the same steps and seed: measured gain vs predicted.")
@click.option("--check-policies", "check_learners", type=click.IntRange(min=2), default=None, metavar="N",
              help="Run `rlbench bench policies`' runs of one and of N data-parallel learners: measured speed-up "
                   "vs predicted.")
@click.option("--sweep", type=click.Choice(["actors"]), default=None,
              help="Run the chosen family (or the best distributed one) at 1..--max-actors actors.")
@click.option("--seconds", type=click.FloatRange(min=0.2), default=4.0, show_default=True,
              help="Steady window of each validation, check or sweep run (after its warm-up), at the predicted rate.")
@click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True,
              help="Undisturbed runs per validated or checked mapping (seeds SEED, SEED+1, ...; up to 2 more while they "
                   "disagree by more than 10 % or other processes disturbed them); their spread is reported.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the runs and of the holdout draw.")
@click.option("-o", "--out", default="plan.toml", show_default=True, type=click.Path(dir_okay=False),
              help="Where to write the chosen plan (a run file: `rlbench run --plan FILE`).")
@click.option("--no-out", is_flag=True, help="Do not write the plan file.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Env-step budget written into the plan file.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (and validation) as JSON.")
def plan_command(algo: str, env: str, hp: tuple[str, ...], num_envs: int, datasets: str | None, objective: str,
                 max_actors: int | None, only_items: tuple[str, ...], profile_file: str | None, allow_contended: bool,
                 watts: tuple[str, ...], top: int, validate_k: int, holdout_n: int, check_first: bool,
                 check_learners: int | None, sweep: str | None, seconds: float, repeats: int, seed: int, out: str,
                 no_out: bool, steps: int | None, as_json: bool) -> None:
    """Choose where each task of a job runs (replay memory, compute backend, transport, placement,
    distribution policy, actor count, host) from the measured profile: every runnable mapping
    predicted (the model is in rlbench/plan/model.py), ranked, with its bottleneck; the actor
    balance point; whether a second learner pays; the chosen plan written as a run file.
    --validate K and --holdout N run mappings and print how wrong the prediction was; --check runs
    the first choice against the default."""
    from pathlib import Path

    from rlbench.plan import profile as profiles
    from rlbench.plan.planner import make_plan, parse_only, plan_document, write_plan

    t0 = time.perf_counter()
    job = profiles.Job.of(algo, env, _parse_hp(hp), num_envs)
    path = profile_file or str(profiles.default_path())
    if profile_file:
        document = profiles.load_profile(profile_file)
    else:
        document = profiles.load_profile(path) if Path(path).exists() else None
        entry = (document or {}).get("hosts", {}).get(profiles.this_host_key(), {})
        if job.key not in entry.get("jobs", {}):
            _echo_err(f"no profile of {job.key!r} on this machine yet: profiling it now (cached at {path})")
            document = _measure_into(path, [job], datasets=_sizes(datasets) if datasets else profiles.DEFAULT_DATASETS)
    registry = _registry()
    cores = _host_cores(document)
    max_actors = max_actors or min(8, 2 * cores)
    sizes = _sizes(datasets) if datasets else _profiled_sizes(document, job)
    plan = make_plan(job, document, objective=objective, max_actors=max_actors, datasets=sizes,
                     watts=_parse_watts(watts), registry=registry, allow_contended=allow_contended,
                     only=parse_only(only_items))
    planning_s = time.perf_counter() - t0
    budget = {"steps": steps} if steps else {}
    wrote = None
    if not no_out:
        write_plan(out, plan_document(plan, plan.chosen, registry, profile_path=path, budget=budget))
        wrote = out
    report: dict[str, Any] = {"plan": plan_json(plan, top), "planning_s": planning_s, "plan_file": wrote,
                              "profile": path}
    if not as_json:
        click.echo(format_plan(plan, top=top, profile_path=path, planning_s=planning_s, document=document))
        if wrote:
            click.echo(f"chosen: #1 {plan.chosen.mapping.label()} -> wrote {wrote} (run it: rlbench run --plan {wrote})")
    from rlbench.plan import validation

    rows: list[tuple[Any, int | None, str]] = []
    if validate_k:
        rows += [(row, rank, "top" if rank else "default") for row, rank in validation.validation_rows(plan, validate_k)]
    if holdout_n:
        if plan.offline:
            raise click.UsageError("--holdout draws replay-loop mappings; an offline plan has none to hold out")
        rows += [(row, None, "holdout") for row in
                 validation.holdout_rows(plan, document, holdout_n, seed=seed, exclude=[r for r, _, _ in rows])]
    if rows:
        # each measured against the default in the same rounds: the host's pace cancels in the ratio
        checks = validation.validate(plan, rows, seconds=seconds, seed=seed, repeats=repeats, progress=_echo_err,
                                     reference=None if plan.offline else plan.default)
        summary = validation.summary(checks, plan.default.mapping if plan.default else None)
        report["validation"] = {"checks": [check_json(c) for c in checks], "summary": summary}
        if not as_json:
            click.echo(format_checks(checks, summary, seconds=seconds, offline=plan.offline))
    if check_first:
        outcome = validation.first_choice_check(plan, seconds=seconds, seed=seed, repeats=repeats, progress=_echo_err)
        report["check"] = gain_json(outcome, plan)
        if not as_json:
            click.echo(format_gain(outcome, plan))
    if check_learners:
        outcome = validation.policy_check(plan, check_learners, seed=seed, progress=_echo_err)
        report["check_policies"] = gain_json(outcome, plan)
        if not as_json:
            click.echo(format_gain(outcome, plan))
    if sweep:
        report["sweep"] = _sweep(plan, max_actors, seconds, seed, repeats, as_json)
    if as_json:
        click.echo(json.dumps(report, indent=1, default=str))


def _registry() -> Any:
    import rlbench

    return rlbench.get_registry()


def _host_cores(document: dict[str, Any]) -> int:
    from rlbench.plan.profile import this_host_key

    entry = document["hosts"].get(this_host_key()) or next(iter(document["hosts"].values()))
    fingerprint = entry.get("fingerprint") or {}
    return int(fingerprint.get("cores_usable") or fingerprint.get("cores") or 1)


def _profiled_sizes(document: dict[str, Any], job: Any) -> tuple[int, ...]:
    for entry in document["hosts"].values():
        figures = entry.get("jobs", {}).get(job.key)
        if figures and figures.get("sizes"):
            return tuple(figures["sizes"])
    return ()


def _sweep(plan: Any, max_actors: int, seconds: float, seed: int, repeats: int, as_json: bool) -> dict[str, Any]:
    from rlbench.plan import validation
    from rlbench.plan.model import knee
    from rlbench.plan.planner import knee_of

    if plan.offline:
        raise click.UsageError("--sweep actors needs a replay-loop algorithm (offline tabular runs have no actors)")
    chosen = plan.chosen.mapping
    if chosen.placement == "local":  # the best distributed family, with the chosen learner device if it has one
        candidates = [r.mapping for r in plan.rows if r.mapping.placement != "local" and r.mapping.host == plan.this_host]
        if not candidates:
            raise click.UsageError("no distributed mapping to sweep on this host")
        chosen = next((m for m in candidates if m.compute == chosen.compute), candidates[0])
    checks = validation.sweep_actors(plan, chosen, max_actors, seconds=seconds, seed=seed, repeats=repeats,
                                     progress=_echo_err)
    item = knee_of(plan, chosen)
    rates = [(c.mapping.actors, c.measured) for c in checks if c.measured]
    measured_knee = knee(rates) if rates else None
    if not as_json:
        click.echo(format_sweep(checks, item, measured_knee))
    return {"family": item.family if item else chosen.label(), "predicted_knee": item.knee if item else None,
            "measured_knee": measured_knee, "checks": [check_json(c) for c in checks]}


# -------------------------------------------------------------------------------------- rendering
def plan_json(plan: Any, top: int) -> dict[str, Any]:
    from rlbench.plan.planner import best_knees, learner_gains

    def row_json(row: Any) -> dict[str, Any]:
        p = row.prediction
        return {"rank": row.rank or None, "tied_with_rank": row.tie, "mapping": row.mapping.label(),
                "host": row.mapping.host,
                "config": {k: v for k, v in row.mapping.config().to_dict().items() if v not in (None, {}, [])},
                "env_steps_per_s": p.env_steps_per_s, "updates_per_s": p.updates_per_s, "spread": p.spread,
                "samples_per_joule": p.samples_per_joule, "energy": p.energy_kind, "bottleneck": p.bottleneck,
                "bounds": p.bounds, "busy_cores": p.busy_cores, "modelled_hardware": p.modelled}

    return {"job": plan.job.key, "objective": plan.objective, "mappings": len(plan.rows),
            "only": plan.only, "contended_profile": plan.contended,
            "ranked": [row_json(r) for r in plan.rows[:top]],
            "default": row_json(plan.default) if plan.default else None,
            "predicted_gain_over_default": plan.gain_over_default(),
            "excluded": [f"{k}: {v}" if v else k for k, v in plan.excluded.items()],
            "knees": [{"family": k.family, "learner": k.compute, "knee": k.knee, "curve": k.curve,
                       "actor_supply": k.supply, "demand": k.demand} for k in best_knees(plan)],
            "learners": [{"mapping": g.parallel.mapping.label(), "single": g.single.mapping.label(),
                          "predicted_speedup": g.speedup, "pays": g.pays,
                          "core_each_ceiling_modelled": g.ceiling[0] if g.ceiling else None, "can_pay": g.can_pay}
                         for g in learner_gains(plan)]}


def check_json(check: Any) -> dict[str, Any]:
    return {"kind": check.kind, "rank": check.rank, "mapping": check.mapping.label(), "predicted": check.predicted,
            "predicted_spread": check.prediction.spread, "measured": check.measured, "spread": check.spread,
            "runs": check.runs, "left_out": check.left_out, "error": check.error,
            "measured_updates_per_s": check.measured_updates_per_s, "predicted_updates_per_s": check.prediction.updates_per_s, "status": check.status, "steps": check.steps,
            "window_s": check.window_s, "contended": check.contended, "machine_state": check.machine,
            "learner_per_update_us": [{"part": part, "predicted": predicted, "measured": measured}
                                      for part, predicted, measured in check.learner_split],
            "to_default": {"reference": check.reference, "predicted": check.predicted_ratio,
                           "measured": check.measured_ratio, "spread": check.ratio_spread, "runs": check.ratios,
                           "error": check.ratio_error}}


def gain_json(outcome: Any, plan: Any) -> dict[str, Any]:
    if isinstance(outcome, str):
        return {"ran": False, "why": outcome}
    return {"ran": True, "what": outcome.what, "unit": outcome.unit, "predicted_gain": outcome.predicted_gain,
            "measured_gain": outcome.measured_gain, "error": outcome.error,
            "candidate": check_json(outcome.candidate), "baseline": check_json(outcome.baseline)}


def _table(headers: list[str], rows: list[list[str]], left: int = 2) -> list[str]:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).ljust(w) if i < left or i == len(cells) - 1 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(headers), *[line(r) for r in rows]]


def _rank_cell(plan: Any, row: Any) -> str:
    cell = str(row.rank) if row.rank else "-"
    if row.tie:
        cell += f"={row.tie}"
    return cell + ("*" if row is plan.default else "")


def format_plan(plan: Any, *, top: int, profile_path: str, planning_s: float, document: dict[str, Any]) -> str:
    from rlbench.plan.planner import PAYS, best_knees, learner_gains

    s = plan.schedule
    host = document["hosts"].get(plan.this_host) or next(iter(document["hosts"].values()))
    fp = host.get("fingerprint", {})
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(host.get("created_unix", 0)))
    lines = [f"rlbench plan: {plan.job.algo} on {plan.job.env}"
             + (f" (hp {', '.join(f'{k}={v}' for k, v in plan.job.hyperparameters)})" if plan.job.hyperparameters else "")
             + f", objective {plan.objective}"
             + (f", only {' '.join(f'{k}={v}' for k, v in plan.only.items())}" if plan.only else ""),
             f"profile {profile_path}: host {host.get('host')} ({fp.get('cores_usable') or fp.get('cores')} cores), "
             f"profiled {when}" + (f"; {len(document['hosts'])} hosts" if len(document["hosts"]) > 1 else ""),
             f"schedule: batch {s.batch_size}, train every {s.train_every} env steps (samples/insert "
             f"{s.batch_size / s.train_every:g}), publish every {s.publish_every} updates"
             if not plan.offline else f"schedule: {s.epochs} epochs over each dataset",
             *(["WARNING: planned from a contended profile (--allow-contended): " + "; ".join(plan.contended)]
               if plan.contended else []),
             _energy_line(plan.power, host), ""]
    joule = "samples/J" + ("*" if plan.power.kind == "modelled" else "")
    multi_host = len({r.mapping.host for r in plan.rows}) > 1
    if plan.offline:
        headers = ["rank", "mapping", "updates/s here", "hw updates/s (modelled)", joule, "bottleneck"]
    else:
        headers = ["rank", "mapping", "env steps/s", "±", "updates/s", joule, "cores", "bottleneck"]
    if multi_host:
        headers.insert(2, "host")
    shown = plan.rows[:top]
    if plan.default is not None and plan.default not in shown:
        shown = [*shown, plan.default]
    body = []
    for row in shown:
        p = row.prediction
        rank = _rank_cell(plan, row)
        if plan.offline:
            hw = _rate((p.modelled or {}).get("updates_per_s")) if p.modelled else "-"
            cells = [rank, row.mapping.label(), _rate(p.updates_per_s), hw, _rate(p.samples_per_joule), p.bottleneck]
        else:
            cells = [rank, row.mapping.label(), _rate(p.env_steps_per_s), f"{p.spread:.0%}", _rate(p.updates_per_s),
                     _rate(p.samples_per_joule), f"{p.busy_cores:.2f}", p.bottleneck]
        if multi_host:
            cells.insert(2, row.mapping.host)
        body.append(cells)
    lines += _table(headers, body)
    lines.append(f"{len(plan.rows)} mappings predicted in {planning_s:.2f} s; {min(top, len(plan.rows))} shown "
                 "(--top N for more); ranked strictly by the prediction; N=M: tied with rank M (closer than the "
                 "predictions' spread); * = the default mapping (what `rlbench run` picks with no options); "
                 "± = the prediction's spread (modelled, from the profile's spreads)")
    gain = plan.gain_over_default()
    if gain is not None and plan.default is not plan.chosen:
        verdict = "worth --check" if gain >= PAYS else f"under {PAYS:.0%}: the default is as good as the model can tell"
        lines.append(f"first choice over the default: predicted {gain:+.1%} ({verdict})")
    if plan.power.kind == "modelled":
        lines.append("* modelled: energy from a rated power, not a meter")
    if plan.offline:
        lines.append("updates/s here: fit_offline as it runs on this host (an emulated device's emulator, measurable); "
                     "hw (modelled): the plugin's cost model of the real device, never validated here")
    gains = learner_gains(plan)
    if gains:
        lines += ["", "more learners (policy data-parallel, predicted updates/s against one learner):"]
        for g in gains:
            lines.append(f"  {g.parallel.mapping.learners} learners ({g.parallel.mapping.label()}): "
                         f"x{g.speedup:.2f} of one learner's {_rate(g.single.prediction.updates_per_s)} updates/s -> "
                         + ("pays" if g.pays else f"does not pay (bound: {g.parallel.prediction.bottleneck})"))
            if g.ceiling is not None:
                most, whole, share = g.ceiling
                lines.append(f"    with a core for each learner, at most x{most:.2f} (modelled: an update on "
                             f"{plan.schedule.batch_size:,} transitions {whole / 1e3:.2f} ms against {share / 1e3:.2f} "
                             f"ms on a 1/{g.parallel.mapping.learners} share with the collectives)"
                             + ("" if g.can_pay else
                                ": data-parallel cannot pay for this model; it starts to where the update is mostly "
                                "per-sample compute (a larger model or batch, e.g. the Atari CNN)"))
    if plan.excluded:
        lines += ["", "left out (each family once):"]
        lines += [f"  {k}: {v}" if v else f"  {k}" for k, v in plan.excluded.items()]
    knees = best_knees(plan)
    if knees:
        lines += ["", "actor balance point (EMC2'20): the actors past which more do not pay: their supply (one actor "
                  "running free, measured) meets what the learner, node or CPU take, or one more adds under 5 %"]
        for item in knees:
            curve = ", ".join(f"{a}: {_rate(x)}" + (f" ({_rate(j)}/J)" if j else "") for a, x, j in item.curve)
            where = (f"{item.knee} actor{'s' if item.knee > 1 else ''}" if item.knee
                     else f"supply still short at {item.curve[-1][0]}")
            supply = (f" (one actor supplies {_rate(item.supply)}/s, the rest takes {_rate(item.demand)}/s)"
                      if item.supply and item.demand else "")
            lines.append(f"  learner on {item.compute} ({item.family}): {where}{supply}   [{curve}]")
    return "\n".join(lines)


def _energy_line(power: Any, host: dict[str, Any]) -> str:
    if power.kind != "modelled":
        return f"energy: predicted {power.kind}: {power.idle_w:.1f} W idle + {power.per_core_w:.1f} W per busy core"
    why = (host.get("power") or {}).get("reason") or "a rated figure was asked for"
    return (f"energy: modelled, a rated {power.per_core_w:g} W per busy core (no meter: {why}; "
            "--watts cpu=W to change it)")


def _machine_cell(check: Any) -> str:
    from rlbench.plan.measure import machine_note

    return machine_note(check.machine) + (f" ({check.contended})" if check.contended else "") + \
        (f"; {check.left_out} disturbed run{'s' if check.left_out > 1 else ''} left out" if check.left_out else "")


def format_checks(checks: list[Any], summary: dict[str, Any], *, seconds: float, offline: bool) -> str:
    from rlbench.plan.validation import HOST_DRIFT

    what = "fit_offline updates/s" if offline else f"env steps/s in each run's steady window (about {seconds:g} s)"
    rated = any(c.measured_ratio is not None for c in checks)
    body = []
    for c in checks:
        error = c.error
        label = {"top": str(c.rank), "default": "default", "holdout": "holdout"}.get(c.kind, c.kind)
        cells = [label, c.mapping.label(), _rate(c.predicted) + f" ±{c.prediction.spread:.0%}",
                 _rate(c.measured) + (f" ±{c.spread:.0%}" if c.spread is not None else ""),
                 "n/a" if error is None else f"{error:+.1%}"]
        if rated:
            ratio = c.ratio_error
            cells += [f"x{c.predicted_ratio:.2f}" if c.predicted_ratio else "n/a",
                      "(itself)" if c.reference else (f"x{c.measured_ratio:.2f} ±{c.ratio_spread:.0%}"
                                                      if c.measured_ratio else "n/a"),
                      "" if c.reference else ("n/a" if ratio is None else f"{ratio:+.1%}")]
        body.append([*cells, _machine_cell(c), c.status])
    lines = ["", f"validation: predicted (modelled) vs measured {what}"
             + ("; and each as a ratio to the default mapping measured in the same rounds (the host's pace "
                "cancels in it)" if rated else "")]
    headers = ["run", "mapping", "predicted", "measured", "error"]
    if rated:
        headers += ["to default: predicted", "measured", "error"]
    lines += _table([*headers, "machine", "status"], body)
    for name, title in (("top_and_default", "top K and default"), ("holdout", "holdout (never calibrated)")):
        part = summary[name]
        absolute = (f"median |error| {part['median_abs_error']:.1%}, max {part['max_abs_error']:.1%} over "
                    f"{part['measured']} mappings" if part["median_abs_error"] is not None else "")
        if part.get("median_abs_ratio_error") is not None:
            lines.append(f"{title}: as ratios to the default, median |error| {part['median_abs_ratio_error']:.1%}, "
                         f"max {part['max_abs_ratio_error']:.1%} over {part['ratios_measured']} mappings"
                         + (f" (absolute: {absolute})" if absolute else ""))
        elif absolute:
            lines.append(f"{title}: {absolute}")
    order = summary.get("ranking") or {}
    if order.get("pairs"):
        lines.append(f"ranking: {order['in_predicted_order']} of {order['pairs']} pairs of mappings measured in the "
                     "order of their predicted ratios")
    if summary["contended_runs"]:
        lines.append(f"WARNING: {summary['contended_runs']} of {len(checks)} runs were measured while other processes "
                     "used the machine: their errors are the machine's as much as the model's")
    pace = summary.get("host_pace")
    if pace is not None:
        drifted = abs(pace - 1) > HOST_DRIFT
        lines.append(f"{'WARNING: ' if drifted else ''}the host's pace: the default mapping measured {pace:.0%} of its "
                     "prediction, which the profile's local calibration runs set"
                     + (": the host ran at another pace than while it was profiled, and every error above carries "
                        "that drift; profile again while it is steady to tell the model's error from it"
                        if drifted else ""))
    if summary["first_vs_best"] is not None:
        lines.append(f"first choice ({summary['first_choice']}) measured {summary['first_vs_best']:.1%} of the best "
                     f"measured ({summary['best_measured']})")
    return "\n".join(lines)


def format_gain(outcome: Any, plan: Any) -> str:
    if isinstance(outcome, str):
        return f"\ncheck: not run: {outcome}"
    c, b = outcome.candidate, outcome.baseline
    lines = ["", f"check: {outcome.what} ({outcome.unit}, the same env steps and seed)"]
    body = [[c.mapping.label(), _rate(c.predicted), _rate(c.measured), _machine_cell(c)],
            [b.mapping.label(), _rate(b.predicted), _rate(b.measured), _machine_cell(b)]]
    lines += _table(["mapping", "predicted", "measured", "machine"], body, left=1)
    predicted, measured, error = outcome.predicted_gain, outcome.measured_gain, outcome.error
    if predicted is not None and measured is not None:
        lines.append(f"gain: predicted {predicted:+.1%} (x{1 + predicted:.2f}), measured {measured:+.1%} "
                     f"(x{1 + measured:.2f}); measured / predicted {error:+.1%}")
    else:
        lines.append("gain: not measured (a run had too few episodes in its steady window)")
    return "\n".join(lines)


def format_sweep(checks: list[Any], item: Any, measured_knee: int | None) -> str:
    lines = ["", f"actor sweep: {item.family if item else ''} (predicted vs measured env steps/s)"]
    top = max([c.predicted or 0 for c in checks] + [c.measured or 0 for c in checks] + [1])
    width = 40
    for c in checks:
        predicted, measured = c.predicted or 0, c.measured or 0
        lines.append(f"  {c.mapping.actors:>2} actors  predicted {_rate(predicted):>8}  measured {_rate(measured):>8}  "
                     f"error {'n/a' if c.error is None else format(c.error, '+.1%'):>7}")
        lines.append(f"             P |{'#' * int(width * predicted / top):<{width}}|")
        lines.append(f"             M |{'=' * int(width * measured / top):<{width}}|")
    predicted_knee = item.knee if item else None
    lines.append(f"knee: predicted {predicted_knee or 'none (supply still short)'}, measured "
                 f"{measured_knee or 'none (still growing)'}")
    return "\n".join(lines)
