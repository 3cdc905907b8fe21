"""rlbench profile / plan: the model's arithmetic on a hand-made profile, the planner's refusals,
the plan file run unchanged, and a short real validation (structure and finite errors only)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from support import run_cli

import rlbench
from rlbench.errors import RlbenchError
from rlbench.plan import model, planner, profile
from rlbench.plan.model import Mapping, Power, Schedule

HANDMADE = Path(__file__).parent / "plan_profiles" / "handmade.json"
HOST = "handmade-0000000000"
DQN = profile.Job.of("dqn", "CartPole-v1")
TAXI = profile.Job.of("qlearning", "Taxi-v3")


def handmade(host: str = HOST) -> dict:
    """The hand-made profile, its host renamed (to this machine's key when a test runs mappings)."""
    document = json.loads(HANDMADE.read_text())
    entry = document["hosts"].pop(HOST)
    entry["host"] = host
    document["hosts"][host] = entry
    return document


def job_figures(document: dict, job: profile.Job = DQN, host: str = HOST) -> dict:
    return document["hosts"][host]["jobs"][job.key]


MODELLED = Power(0.0, 10.0, "modelled")


def dqn_mapping(**fields) -> Mapping:
    return Mapping(**{"algo": "dqn", "env": "CartPole-v1", "compute": "cpu", "replay": "prioritized", **fields})


# ----------------------------------------------------------------------------------- the model
def test_local_prediction_is_the_sum_of_step_and_update_costs_with_calibrated_loop_costs():
    figures = job_figures(handmade())
    # micro: inference 10 + env 10 + add 10 = 30 per step; calibration 40 -> loop 10 per step.
    # update: learn 800 + sample 10 + priorities 5 + publish 40 = 855; calibration 900 -> loop 45.
    prediction = model.predict_local(dqn_mapping(), figures, Schedule(batch_size=128, train_every=1))
    assert prediction.env_steps_per_s == pytest.approx(1e6 / (40 + 900))
    assert prediction.updates_per_s == pytest.approx(prediction.env_steps_per_s)
    assert prediction.bottleneck.startswith("one process: learner update")
    # every 4 env steps: the update's 900 us is shared by 4 steps; uniform replay saves its differences
    every4 = model.predict_local(dqn_mapping(replay="uniform"), figures, Schedule(batch_size=128, train_every=4))
    step = (10 + 10 + 5) + 10
    update = (800 + 5 + 0 + 40) + 45
    assert every4.env_steps_per_s == pytest.approx(1e6 / (step + update / 4))
    assert every4.updates_per_s == pytest.approx(every4.env_steps_per_s / 4)
    assert every4.warm_env_steps_per_s == pytest.approx(1e6 / step)


def test_distributed_learner_bound_mapping_names_the_learner():
    figures, host = job_figures(handmade()), handmade()["hosts"][HOST]
    prediction = model.predict_distributed(dqn_mapping(placement="server", transport="shm"), figures, host,
                                           Schedule(batch_size=128, train_every=1))
    # learner: learn 800 + loop 50 (950 calibrated - 820 own - 80 SAMPLE) + priorities 10 + publish 10 + SAMPLE 80
    assert prediction.bounds["learner"] == pytest.approx(1e6 / 950)
    assert prediction.env_steps_per_s == pytest.approx(1e6 / 950)
    assert prediction.bottleneck.startswith("learner")
    # actor: inference 10 + env 10 + loop 10 + (INSERT 100 - node 40 + a FETCH 60 after every INSERT) / 128
    assert prediction.bounds["actors (1)"] == pytest.approx(1e6 / (30 + 120 / 128))
    # node: (INSERT 40 + FETCH 20) / 128 + batch 30 + priorities 10 + publish 10 per update
    assert prediction.bounds["replay node"] == pytest.approx(1e6 / (60 / 128 + 50))


def test_in_network_overlaps_sampling_with_learning_and_waits_only_for_the_excess():
    figures, host = job_figures(handmade()), handmade()["hosts"][HOST]
    mapping = dqn_mapping(placement="in-network", transport="shm")
    prediction = model.predict_distributed(mapping, figures, host, Schedule(batch_size=128, train_every=1))
    # own work 800 + loop 50 + 10 + 10 = 870 hides the 90 us push round: only the 8 us receive remains
    assert prediction.bounds["learner"] == pytest.approx(1e6 / (870 + 8))
    slow = handmade()  # a node whose round takes longer than the learner's work: the learner waits the rest
    job_figures(slow)["replay_node"]["shm/in-network"]["push_round_us"] = 1200.0
    job_figures(slow)["calibration"]["shm/in-network"]["update_us"] = 820 + 8 + (1200 - 820) + 50  # same loop: 50
    waiting = model.predict_distributed(mapping, job_figures(slow), slow["hosts"][HOST],
                                        Schedule(batch_size=128, train_every=1))
    assert waiting.bounds["learner"] == pytest.approx(1e6 / (870 + 8 + (1200 - 870)))
    assert waiting.bottleneck.startswith("learner: update")


def test_actors_are_the_bottleneck_until_the_cores_run_out_and_the_knee_is_there():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    light = Schedule(batch_size=128, train_every=1000)  # the learner is idle most of the time
    rates = []
    for actors in (1, 2, 3, 4):
        p = model.predict_distributed(dqn_mapping(placement="server", transport="shm", actors=actors), figures, host,
                                      light)
        rates.append((actors, p.env_steps_per_s))
        if actors == 1:
            fetches = 128 / 1000
            assert p.bottleneck == "actors (1)"
            assert p.env_steps_per_s == pytest.approx(1e6 / (30 + (60 + fetches * 60) / 128))
        else:
            assert p.bottleneck == "CPU (2 cores)"
            assert p.busy_cores == pytest.approx(2.0)
    assert model.knee(rates) == 2  # the host's cores: a third actor adds (almost) nothing
    assert rates[2][1] < rates[1][1] * 1.05


def test_offline_tabular_time_is_fixed_plus_per_update_and_the_hardware_model_stays_apart():
    figures = job_figures(handmade(), TAXI)
    schedule = Schedule(batch_size=1, epochs=20)
    cpu = model.predict_tabular(Mapping("qlearning", "Taxi-v3", "cpu", dataset=1_000_000), figures, schedule)
    assert cpu.env_steps_per_s is None
    assert cpu.updates_per_s == pytest.approx(20e6 / (0.001 + 5e-9 * 20e6))
    upmem = model.predict_tabular(Mapping("qlearning", "Taxi-v3", "upmem", dataset=1_000_000,
                                          options=(("compute", "dpus", 64),)), figures, schedule)
    assert upmem.updates_per_s == pytest.approx(20e6 / (0.05 + 1e-9 * 20e6))
    assert upmem.modelled["kind"] == "modelled"
    assert upmem.modelled["updates_per_s"] == pytest.approx(20e6 / (0.002 + 2e-9 * 20e6))
    assert upmem.bottleneck.startswith("emulator: kernel")
    small = model.predict_tabular(Mapping("qlearning", "Taxi-v3", "upmem", dataset=10_000,
                                          options=(("compute", "dpus", 64),)), figures, schedule)
    assert "fixed costs dominate" in small.bottleneck


def test_energy_is_modelled_without_a_meter_and_from_measured_power_with_one():
    document = handmade()
    host = document["hosts"][HOST]
    assert Power.of(host).kind == "modelled"
    assert Power.of(host, {"cpu": 15.0}).per_core_w == 15.0
    prediction = model.predict(dqn_mapping(), job_figures(document), host, Schedule(batch_size=128), Power.of(host))
    assert prediction.energy_kind == "modelled"
    assert prediction.samples_per_joule == pytest.approx(prediction.samples_per_s / model.DEFAULT_WATTS_PER_CORE)
    host["power"] = {"kind": "measured", "source": "rapl", "idle_w": 5.0, "per_busy_core_w": 20.0}
    measured = model.predict(dqn_mapping(), job_figures(document), host, Schedule(batch_size=128), Power.of(host))
    assert measured.energy_kind == "from measured power (rapl)"
    assert measured.watts == pytest.approx(25.0)


def test_run_average_counts_the_warm_up_and_the_knee_reports_growth():
    p = model.Prediction(env_steps_per_s=1000.0, updates_per_s=1000.0, samples_per_s=128000.0, bottleneck="",
                         warm_env_steps_per_s=10000.0)
    assert model.run_average(p, 6000, 1000) == pytest.approx(6000 / (0.1 + 5.0))
    assert model.knee([(1, 100.0), (2, 200.0), (3, 300.0)]) is None
    assert model.knee([(1, 100.0), (2, 103.0)]) == 1


# --------------------------------------------------------------------------------- the planner
def _assert_runnable(plan) -> None:
    from rlbench.validate import validate

    registry = rlbench.get_registry()
    for row in plan.rows:
        validate(row.mapping.config(), registry)  # raises if `rlbench run` would refuse it


def test_the_planner_never_proposes_an_impossible_mapping_and_says_why_once():
    plan = planner.make_plan(DQN, handmade(), max_actors=3, this_host=HOST)
    mappings = [row.mapping for row in plan.rows]
    assert mappings, "the hand-made profile allows local and shm mappings"
    assert all(m.transport not in ("inproc", "udp", "tcp") for m in mappings)  # not crossing / unusable / failed
    assert all(m.compute not in ("gpu", "upmem") and m.replay not in ("gpu", "fpga") for m in mappings)
    assert all(m.actors == 1 for m in mappings if m.placement == "local")
    assert {m.placement for m in mappings} == {"local", "server", "in-network"}
    assert "transport inproc" in plan.excluded and "stays inside one process" in plan.excluded["transport inproc"]
    assert plan.excluded["transport udp"] == "hand-made: measured unusable"
    assert plan.excluded["compute gpu"] == "hand-made: no CUDA device"
    failed = [k for k in plan.excluded if "tcp" in k and "failed when profiled" in k]
    assert len(failed) == 2  # one line per placement family, not one per actor count or memory
    ranks = [row.rank for row in plan.rows]
    assert ranks == list(range(1, len(ranks) + 1))
    assert plan.default.mapping == Mapping("dqn", "CartPole-v1", "cpu", replay="prioritized", host=HOST)
    _assert_runnable(plan)


def test_near_ties_prefer_the_mapping_closer_to_the_defaults():
    rows = planner.make_plan(DQN, handmade(), max_actors=1, this_host=HOST).rows
    values = {row.mapping.label(): row.prediction.throughput for row in rows}
    # uniform replay is predicted 1.6 % faster (sample and priorities cost less): within the tie tolerance
    assert values["local uniform cpu"] > values["local prioritized cpu"]
    assert values["local uniform cpu"] < values["local prioritized cpu"] * (1 + planner.TIE_TOLERANCE)
    order = [row.mapping.label() for row in rows]
    assert order.index("local prioritized cpu") < order.index("local uniform cpu")
    # in-network hides the sampling behind the update: predicted clearly faster, so it leads
    assert order[0] == "in-network shm prioritized cpu 1 actor"


def test_offline_plans_cover_backends_and_dataset_sizes_with_the_hardware_model_apart():
    plan = planner.make_plan(TAXI, handmade(), datasets=(100_000, 1_000_000), this_host=HOST)
    assert plan.offline
    assert plan.chosen.mapping.compute == "upmem" and plan.chosen.mapping.dataset == 1_000_000
    assert plan.chosen.mapping.options == (("compute", "dpus", 64),)
    assert plan.excluded["compute upmem[dpus=2048]"] == "hand-made: refused"
    assert {(r.mapping.compute, r.mapping.dataset) for r in plan.rows} >= {("cpu", 100_000), ("cpu", 1_000_000)}
    assert all(r.prediction.modelled is None for r in plan.rows if r.mapping.compute == "cpu")
    _assert_runnable(plan)
    with pytest.raises(RlbenchError, match="--dataset"):
        planner.make_plan(TAXI, handmade(), this_host=HOST)


def test_a_job_missing_from_the_profile_and_bad_profiles_are_one_line_errors(tmp_path):
    with pytest.raises(RlbenchError, match="rlbench profile --job ddpg:Pendulum-v1"):
        planner.make_plan(profile.Job.of("ddpg", "Pendulum-v1"), handmade(), this_host=HOST)
    with pytest.raises(RlbenchError, match="objective"):
        planner.make_plan(DQN, handmade(), objective="speed", this_host=HOST)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "rlbench.result/1"}))
    with pytest.raises(profile.ProfileError, match="not an rlbench profile"):
        profile.load_profile(wrong)
    with pytest.raises(profile.ProfileError, match="no profile at"):
        profile.load_profile(tmp_path / "absent.json")


def test_profiles_of_several_hosts_merge_and_a_host_keeps_its_newest_jobs():
    first, second = handmade("alpha-1"), handmade("beta-2")
    newer = handmade("alpha-1")
    entry = newer["hosts"]["alpha-1"]
    entry["created_unix"] += 100
    entry["jobs"] = {DQN.key: {**entry["jobs"][DQN.key], "env_step_us": 99.0}}
    merged = profile.merge_profiles([newer, first, second])
    assert set(merged["hosts"]) == {"alpha-1", "beta-2"}
    assert merged["hosts"]["alpha-1"]["jobs"][DQN.key]["env_step_us"] == 99.0
    assert TAXI.key in merged["hosts"]["alpha-1"]["jobs"]  # kept from the older measurement
    plan = planner.make_plan(DQN, merged, max_actors=1, this_host="alpha-1")
    assert {row.mapping.host for row in plan.rows} == {"alpha-1", "beta-2"}
    assert "roles split across hosts" in plan.excluded


def test_job_keys_leave_schedule_hyperparameters_out():
    assert profile.Job.of("dqn", "CartPole-v1", {"train_every": 8, "learning_starts": 10}).key == "dqn CartPole-v1"
    assert profile.Job.of("dqn", "CartPole-v1", {"hidden_sizes": [64, 64]}).key == "dqn CartPole-v1 hidden_sizes=64,64"
    assert profile.host_key({"hostname": "a b"}) != profile.host_key({"hostname": "a b", "cores": 4})


# ------------------------------------------------------------------------- plan file and CLI
def test_run_plan_runs_the_written_configuration_unchanged(tmp_path):
    from rlbench.plan.cli import plan_command

    here = profile.this_host_key()
    document = handmade(here)
    job_figures(document, TAXI, here)["settings"][0]["fixed_s"] = 1.0  # a slow cpu: upmem and its --dpus win
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(document))
    plan_file = tmp_path / "plan.toml"
    plan_command(["--algo", "qlearning", "--env", "Taxi-v3", "--dataset", "10000", "--profile", str(profile_path),
                  "-o", str(plan_file)], standalone_mode=False)
    from rlbench.config import read_toml

    written = read_toml(plan_file)
    assert written["plan"]["schema"] == planner.PLAN_SCHEMA
    assert written["compute"] == "upmem" and written["options"] == {"dpus": 64}
    done = run_cli("run", "--plan", str(plan_file), "--no-out", "--json", "--eval-episodes", "0")
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)["config"]
    expected = planner.make_plan(TAXI, document, datasets=(10_000,)).chosen.mapping.config().to_dict()
    for name in ("algo", "env", "compute", "placement", "actors", "dataset", "options", "hyperparameters", "replay"):
        assert config[name] == expected[name], name


def test_plan_command_writes_a_run_file_of_the_chosen_replay_mapping(tmp_path):
    from rlbench.config import RunConfig, read_toml, run_fields
    from rlbench.plan.cli import plan_command
    from rlbench.validate import options_from_flags

    here = profile.this_host_key()
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(handmade(here)))
    plan_file = tmp_path / "plan.toml"
    plan_command(["--profile", str(profile_path), "-o", str(plan_file), "--steps", "400", "--hp", "train_every=4",
                  "--max-actors", "2"], standalone_mode=False)
    fields = run_fields(read_toml(plan_file), source=str(plan_file), extra_tables=("plan",))
    flags = fields.pop("options", {})
    config = RunConfig(**fields)
    config.options = options_from_flags(flags, config, rlbench.get_registry())
    plan = planner.make_plan(profile.Job.of("dqn", "CartPole-v1", {"train_every": 4}), handmade(here), max_actors=2)
    assert config == plan.chosen.mapping.config(steps=400)


def test_the_package_stays_out_of_import_rlbench_and_its_cli_module_imports_only_click():
    code = ("import sys, rlbench; assert not [m for m in sys.modules if m.startswith('rlbench.plan')]; "
            "import rlbench.plan.cli; heavy = [m for m in ('numpy', 'torch') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- real measurements
def test_replay_node_costs_are_measured_over_a_real_node(tmp_path):
    samples = profile.collect_samples(DQN, rlbench.get_registry(), steps=300)
    for placement in ("server", "in-network"):
        figures = profile.measure_replay_node(samples.node_inputs(), "tcp", placement, rounds=10)
        keys = ["insert_rtt_us", "fetch_rtt_us", "publish_send_us", "priorities_send_us",
                "sample_rtt_us" if placement == "server" else "push_round_us"]
        assert all(math.isfinite(figures[k]) and figures[k] > 0 for k in keys), figures
        assert figures["node"]["insert_us"] > 0


def test_a_short_validation_runs_the_top_mapping_and_the_default_with_finite_errors():
    from rlbench.plan import validation

    here = profile.this_host_key()
    plan = planner.make_plan(TAXI, handmade(here), datasets=(10_000,))
    checks = validation.validate(plan, 2, seconds=0.2)
    assert [c.rank for c in checks] == [1, 2]  # the default (cpu) is the first: not run twice
    assert all(c.status.startswith("complete") and math.isfinite(c.error) for c in checks)
    replay = planner.make_plan(profile.Job.of("dqn", "CartPole-v1", {"learning_starts": 200, "batch_size": 32}),
                               _with_job_key(handmade(here), here, "dqn CartPole-v1 batch_size=32"), max_actors=1)
    local = next(row for row in replay.rows if row.mapping.placement == "local")
    check = validation.run_check(replay, local, local.rank, seconds=0.3)
    assert check.status == "complete" and check.steps > 200
    assert math.isfinite(check.error) and check.measured > 0
    summary = validation.summary(checks + [check])
    assert summary["validated"] == 3 and math.isfinite(summary["median_abs_error"])


def _with_job_key(document: dict, host: str, key: str) -> dict:
    jobs = document["hosts"][host]["jobs"]
    jobs[key] = jobs[DQN.key]
    return document


def _hang() -> None:
    import time

    time.sleep(60)


def _die() -> None:
    import os

    os._exit(3)


def test_a_transport_measurement_that_hangs_or_dies_is_left_out_with_the_reason():
    assert profile.run_isolated(sum, ((1, 2),), 30) == (3, "")
    assert profile.run_isolated(_hang, (), 1.5) == (None, "its measurement did not finish within 1.5 s")
    assert profile.run_isolated(_die, (), 30) == (None, "its measuring process died (exit code 3)")
    failed, why = profile.run_isolated(profile.Job.parse, ("no-colon",), 30)
    assert failed is None and why.startswith("RlbenchError: --job takes ALGO:ENV")


def test_plan_validate_prints_predicted_beside_measured_as_json(tmp_path, capsys):
    from rlbench.plan.cli import plan_command

    here = profile.this_host_key()
    document = handmade(here)
    job_figures(document, TAXI, here)["settings"][0]["fixed_s"] = 1.0  # a slow cpu: upmem is the first choice
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(document))
    plan_command(["--algo", "qlearning", "--env", "Taxi-v3", "--dataset", "10000", "--profile", str(profile_path),
                  "--no-out", "--validate", "1", "--json"], standalone_mode=False)
    report = json.loads(capsys.readouterr().out)
    assert report["plan"]["ranked"][0]["rank"] == 1 and report["plan"]["excluded"]
    checks = report["validation"]["checks"]
    assert [c["rank"] for c in checks] == [1, None]  # the first choice, and the default (cpu) beside it
    assert all(math.isfinite(c["error"]) and c["measured"] > 0 for c in checks)
    assert all("contended" in c["machine_state"] for c in checks)
    assert math.isfinite(report["validation"]["summary"]["median_abs_error"])


def test_a_backends_own_local_calibration_and_a_working_runs_fetch_cost_enter_the_model():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    calibration = figures["calibration"]
    # fpga's loop: micro step 20 + 10 + 10 = 40 -> 20 of loop costs; update 800 + 10 + 5 + 40 = 855 -> 145
    calibration["local/fpga"] = {"placement": "local", "compute": "fpga", "free_step_us": 60.0, "update_us": 1000.0}
    local = model.predict_local(dqn_mapping(compute="fpga"), figures, Schedule(batch_size=128, train_every=1))
    assert local.env_steps_per_s == pytest.approx(1e6 / (60 + 1000))
    assert model.compute_excess(figures, "fpga") == pytest.approx((20 - 10, 145 - 45))
    server = model.predict_distributed(dqn_mapping(compute="fpga", placement="server", transport="shm"), figures,
                                       host, Schedule(batch_size=128, train_every=1))
    assert server.bounds["learner"] == pytest.approx(1e6 / (950 + 100))  # the cpu learner's 950 + fpga's excess
    # an actor-bound run: one FETCH per INSERT took the actor 1 us per step more than running free,
    # i.e. 128 us per fetch, 68 more than the isolated round trip
    calibration["shm/server/actors"] = {"placement": "server", "transport": "shm", "train_every": 128,
                                        "actor_learning_us": 30.46875 + 1.0}
    light = model.predict_distributed(dqn_mapping(placement="server", transport="shm"), figures, host,
                                      Schedule(batch_size=128, train_every=1000))
    assert light.bounds["actors (1)"] == pytest.approx(1e6 / (30 + (60 + 0.128 * (60 + 68)) / 128))
