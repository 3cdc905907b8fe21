"""rlbench profile / plan: the model's arithmetic on a hand-made profile, the planner's refusals,
the plan file run unchanged, and a short real validation (structure and finite errors only)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from support import run_cli

import rlbench
from rlbench.errors import RlbenchError
from rlbench.plan import measure, model, planner, profile, validation
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
def test_local_prediction_splits_step_and_update_costs_with_two_calibration_runs():
    figures = job_figures(handmade())
    # calibration: k = 1 at 940 us per step, k = 100 at 49 -> s = 40 per step and u = 900 per update in situ
    costs = model.local_costs(figures)
    assert (costs.step, costs.update) == (pytest.approx(40.0), pytest.approx(900.0))
    prediction = model.predict_local(dqn_mapping(), figures, Schedule(batch_size=128, train_every=1))
    assert prediction.env_steps_per_s == pytest.approx(1e6 / (40 + 900))
    assert prediction.updates_per_s == pytest.approx(prediction.env_steps_per_s)
    assert prediction.bottleneck.startswith("one process: learner update")
    # every 4 env steps, uniform replay: its micro differences from the calibrated memory (add 5 less,
    # one update's memory work 10 less) move the in-situ costs
    every4 = model.predict_local(dqn_mapping(replay="uniform"), figures, Schedule(batch_size=128, train_every=4))
    assert every4.env_steps_per_s == pytest.approx(1e6 / ((40 - 5) + (900 - 10) / 4))
    assert every4.updates_per_s == pytest.approx(every4.env_steps_per_s / 4)
    # without the actor-heavy run the warm-up's step stands in for s: the same here, by construction
    del job_figures(document := handmade())["calibration"]["local/actor-heavy"]
    fallback = model.local_costs(job_figures(document))
    assert (fallback.step, fallback.update) == (pytest.approx(40.0), pytest.approx(900.0))


def test_distributed_learner_period_is_the_calibrated_learners_lines_plus_what_this_mapping_changes():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    schedule = Schedule(batch_size=128, train_every=1, publish_every=1)
    prediction = model.predict_distributed(dqn_mapping(placement="server", transport="shm"), figures, host, schedule)
    # the calibrated learner: update 800 + wait 100 + weight sends 10 + loop 40
    assert prediction.bounds["learner"] == pytest.approx(1e6 / 950)
    assert prediction.env_steps_per_s == pytest.approx(1e6 / 950)
    assert prediction.bottleneck.startswith("learner: update")
    # a memory whose per-update work in the node (cycle) costs 50 us more lies on the learner's path
    document["hosts"][HOST]["jobs"]["dqn CartPole-v1"]["replay"]["uniform"]["cycle_us"] = 15.0 + 50.0
    slower = model.predict_distributed(dqn_mapping(placement="server", transport="shm", replay="uniform"), figures,
                                       host, schedule)
    assert slower.bounds["learner"] == pytest.approx(1e6 / 1000)
    # publishing every 10 updates instead of every one saves 9/10 of the learner's 10 us of weight sends
    # and of the node's 10 us on its path
    sparse = model.predict_distributed(dqn_mapping(placement="server", transport="shm"), figures, host,
                                       Schedule(batch_size=128, train_every=1, publish_every=10))
    assert sparse.bounds["learner"] == pytest.approx(1e6 / (950 - 9 - 9))
    # the actor, running free: its calibrated step, plus a FETCH (60) and a load (40) after every INSERT of 128
    assert prediction.bounds["actors (1)"] == pytest.approx(1e6 / (30.46875 + 100 / 128))
    # the node: (INSERT 40 + FETCH 20) / 128 + batch 30 + priorities 10 + weights 10 per update
    assert prediction.bounds["replay node"] == pytest.approx(1e6 / (60 / 128 + 50))


def test_a_device_replay_memorys_own_server_run_sets_its_wait_and_compute_in_place_of_its_micro_figures():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    schedule = Schedule(batch_size=128, train_every=1, publish_every=1)
    figures["replay"]["fpga"] = {**figures["replay"]["prioritized"], "device": "opencl", "cycle_us": 15.0 + 25.0}
    server = dqn_mapping(placement="server", transport="shm", replay="fpga")
    in_network = dqn_mapping(placement="in-network", transport="shm", replay="fpga")
    # no run of its own: its micro cycle, 25 us over prioritized's, lies on the learner's path
    assert model.predict_distributed(server, figures, host, schedule).bounds["learner"] == pytest.approx(1e6 / 975)
    before = model.predict_distributed(in_network, figures, host, schedule).bounds["learner"]
    # its own server run: its device's threads beside the roles made the learner wait 220 us (the cpu
    # run 100) and compute 880 (800)
    figures["calibration"]["shm/server/replay-fpga"] = {**figures["calibration"]["shm/server"], "replay": "fpga",
                                                        "learner_wait_us": 220.0, "learner_compute_us": 880.0}
    assert model.replay_deltas(figures, "fpga") == model.ReplayDeltas(pytest.approx(120.0), pytest.approx(1.1))
    assert model.predict_distributed(server, figures, host, schedule).bounds["learner"] == pytest.approx(
        1e6 / (880 + 220 + 10 + 40))
    # in-network the node draws the next batch while the learner learns: the micro cycle, as before
    assert model.predict_distributed(in_network, figures, host, schedule).bounds["learner"] == pytest.approx(before)
    assert model.replay_deltas(figures, "uniform") is None


def test_a_transports_own_server_run_sets_its_wait_in_place_of_its_micro_round_trips():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    schedule = Schedule(batch_size=128, train_every=1, publish_every=1)
    # tcp's round trips timed alone: a SAMPLE after work 40 us quicker than shm's
    figures["replay_node"]["tcp/server"] = {**figures["replay_node"]["shm/server"], "transport": "tcp",
                                            "sample_rtt_us": 40.0}
    tcp = dqn_mapping(placement="server", transport="tcp")
    assert model.predict_distributed(tcp, figures, host, schedule).bounds["learner"] == pytest.approx(
        1e6 / (800 + 60 + 10 + 40))
    # its own run: the learner waited 250 us per update over tcp, where the calibrated shm run waited 100
    figures["calibration"]["tcp/server/wait"] = {**figures["calibration"]["shm/server"], "transport": "tcp",
                                                 "learner_wait_us": 250.0, "learner_compute_us": 760.0}
    assert model.transport_wait(figures, "tcp", model.distributed_calibration(figures, "server", 2)) == 150.0
    assert model.predict_distributed(tcp, figures, host, schedule).bounds["learner"] == pytest.approx(
        1e6 / (800 + 250 + 10 + 40))  # the wait only: its compute is the one learner's, host noise aside
    # publishing every 10 updates: the node's 10 us of weights before the SAMPLE and the learner's
    # 10 us of sends, 9/10 of each saved, as over shm
    sparse = model.predict_distributed(tcp, figures, host, Schedule(batch_size=128, train_every=1, publish_every=10))
    assert sparse.bounds["learner"] == pytest.approx(1e6 / (800 + 250 - 9 + 1 + 40))
    # the calibrated transport, and in-network placement, keep their own figures
    shm = model.predict_distributed(dqn_mapping(placement="server", transport="shm"), figures, host, schedule)
    assert shm.bounds["learner"] == pytest.approx(1e6 / 950)
    figures["calibration"]["tcp/server/wait"]["failed"] = "the run ended stopped"
    assert model.transport_wait(figures, "tcp", model.distributed_calibration(figures, "server", 2)) is None


def test_in_network_hides_sampling_behind_learning_and_waits_only_for_the_excess():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    mapping = dqn_mapping(placement="in-network", transport="shm")
    schedule = Schedule(batch_size=128, train_every=1, publish_every=1)
    prediction = model.predict_distributed(mapping, figures, host, schedule)
    assert prediction.bounds["learner"] == pytest.approx(1e6 / (800 + 28 + 10 + 40))
    # a transport whose push round (1,200 us) outlasts the learner's own work (860 with its send):
    # the learner waits the rest, 340 us, beyond what the calibration waited
    figures["replay_node"]["tcp/in-network"] = {**figures["replay_node"]["shm/in-network"], "transport": "tcp",
                                                "push_round_us": 1200.0}
    waiting = model.predict_distributed(dqn_mapping(placement="in-network", transport="tcp"), figures, host, schedule)
    assert waiting.bounds["learner"] == pytest.approx(1e6 / (878 + 340))
    assert waiting.bottleneck.startswith("learner: update")


def test_cores_run_out_past_the_actors_knee_and_the_saturated_runs_set_kappa():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    calibrated = model.distributed_calibration(figures, "server", 2)
    # the saturated runs measured 1/1.25 and 1/1.45 of their kappa-free CPU bounds: y (1 + kappa y) = 1
    kappa_2, kappa_4 = model.kappa_of(1 / 1.25), model.kappa_of(1 / 1.45)
    assert kappa_2 == pytest.approx(0.3125) and model.saturation(kappa_2) == pytest.approx(0.8)
    assert calibrated.kappa_points == (pytest.approx((3, kappa_2)), pytest.approx((5, kappa_4)))
    assert calibrated.kappa(2, 2) == 0.0  # no more processes than cores: no time-slicing
    assert calibrated.kappa(4, 2) == pytest.approx((kappa_2 + kappa_4) / 2)  # linear between, and beyond
    assert calibrated.kappa(7, 2) == pytest.approx(kappa_2 + 2 * (kappa_4 - kappa_2))
    light = Schedule(batch_size=128, train_every=1000, publish_every=1)  # the learner is idle most of the time
    curve = []
    for actors in (1, 2, 3, 4):
        p = model.predict_distributed(dqn_mapping(placement="server", transport="shm", actors=actors), figures, host,
                                      light)
        curve.append((actors, p))
        fetches = min(1.0, actors * 128 / 1000)
        a = 30.46875 + fetches * 100 / 128
        assert p.actor_supply == pytest.approx(1e6 / a)
        if actors == 1:  # two processes on two cores: the actor's supply binds
            assert p.bottleneck == "actors (1)" and p.env_steps_per_s == pytest.approx(1e6 / a)
        else:  # more processes than cores: the CPU binds, every role's work dearer
            v = 40 / 128 + fetches * 20 / 128 + 40 / 1000 + 10 / 1000
            assert p.bottleneck.startswith("CPU (2 cores)")
            y = model.saturation(calibrated.kappa(actors + 1, 2))
            assert p.env_steps_per_s == pytest.approx(y * 2e6 / (a + 850 / 1000 + v))
            assert p.busy_cores == pytest.approx(2.0)
    saturated = model.predict_distributed(dqn_mapping(placement="server", transport="shm", actors=2), figures, host,
                                          Schedule(batch_size=128, train_every=100, publish_every=1))
    assert saturated.env_steps_per_s == pytest.approx(2e6 / 40.71875 / 1.25)  # the calibration run, reproduced
    assert model.supply_knee(curve) == 2  # 2 actors supply more than the cores let through
    # an actor more that only makes the cores busier: the knee is before it, supply short or not
    short = [(1, model.Prediction(900.0, 9.0, 1.0, "", actor_supply=900.0, demand=2000.0)),
             (2, model.Prediction(850.0, 8.5, 1.0, "", actor_supply=900.0, demand=850.0))]
    assert model.supply_knee(short) == 1
    assert model.supply_knee(short[:1]) is None  # still short, with nothing to compare
    # a learner-bound mapping with more processes than cores: its cores are far from full, and kappa
    # does not bind it (the learner does)
    busy_learner = model.predict_distributed(dqn_mapping(placement="server", transport="shm", actors=4), figures, host,
                                             Schedule(batch_size=128, train_every=1, publish_every=1))
    assert busy_learner.bottleneck.startswith("learner") and busy_learner.busy_cores < 1.5
    del figures["calibration"]["shm/server/saturated-4"]  # one saturated run: its kappa throughout
    assert model.distributed_calibration(figures, "server", 2).kappa(7, 2) == pytest.approx(kappa_2)
    del figures["calibration"]["shm/server/saturated-2"]
    assert model.distributed_calibration(figures, "server", 2).kappa(7, 2) == 0.0


def test_data_parallel_learners_split_the_batch_and_pay_the_collectives_the_calibration_measured():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    host["fingerprint"]["cores_usable"] = 8  # room for the learners, an actor and the node: none takes turns
    schedule = Schedule(batch_size=128, train_every=1, publish_every=1)
    two = model.predict_distributed(dqn_mapping(placement="server", transport="shm", policy="data-parallel",
                                                learners=2), figures, host, schedule)
    # the calibration run, reproduced: compute 700 on 64 each, collectives 400 (waiting for each other
    # included), wait 150, weights 10, loop 60
    assert two.bounds["learners"] == pytest.approx(1e6 / (700 + 400 + 150 + 10 + 60))
    four = model.predict_distributed(dqn_mapping(placement="server", transport="shm", policy="data-parallel",
                                                 learners=4), figures, host, schedule)
    # 32 each: 280 x (700 / 450) in lock-step; collectives: the calibration run's 400 and what the ring
    # takes longer among 4 idle processes (1,000 + agreement 200) than among 2 (200 + 50); at the node, 1.5 others' requests (batch 30 + priorities 10) ahead instead of the calibration's 0.5
    assert four.bounds["learners"] == pytest.approx(1e6 / (280 * 700 / 450 + 400 + 1200 - 250 + 150 + 40 + 10 + 60))
    # a ring never measured among 4 is not extrapolated from 2: the plan says what is missing
    ring_among_4 = figures["allreduce"]["by_learners"].pop("4")
    with pytest.raises(model.ModelError, match="no all-reduce among 4 learners"):
        model.predict_distributed(dqn_mapping(placement="server", transport="shm", policy="data-parallel",
                                              learners=4), figures, host, schedule)
    figures["allreduce"]["by_learners"]["4"] = ring_among_4
    # without the data-parallel calibration run: the all-reduce measured between two idle processes
    # (200 + agreement 50), the share's micro update (450), the one-learner run's wait and loop
    del figures["calibration"]["shm/server/data-parallel-2"]
    micro = model.predict_distributed(dqn_mapping(placement="server", transport="shm", policy="data-parallel",
                                                  learners=2), figures, host, schedule)
    assert micro.bounds["learners"] == pytest.approx(1e6 / (450 + 250 + 100 + 20 + 10 + 40))
    del figures["allreduce"]
    with pytest.raises(model.ModelError, match="all-reduce"):
        model.predict_distributed(dqn_mapping(placement="server", transport="shm", policy="data-parallel",
                                              learners=2), figures, host, schedule)


def test_a_transports_own_lock_step_run_sets_its_data_parallel_mappings():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    host["fingerprint"]["cores_usable"] = 8  # none takes turns
    schedule = Schedule(batch_size=128, train_every=1, publish_every=1)
    for placement in ("server", "in-network"):  # the node's micro figures as shm's: only the runs differ
        figures["replay_node"][f"tcp/{placement}"] = {**figures["replay_node"][f"shm/{placement}"], "transport": "tcp"}
    figures["calibration"]["tcp/server/wait"] = {**figures["calibration"]["shm/server"], "transport": "tcp",
                                                 "learner_wait_us": 250.0}

    def learners_bound(transport: str, learners: int = 2) -> float:
        return model.predict_distributed(dqn_mapping(placement="server", transport=transport, policy="data-parallel",
                                                     learners=learners), figures, host, schedule).bounds["learners"]

    # without a lock-step run over tcp: shm's (compute 700, collectives 400, wait 150, weights 10, loop
    # 60), one learner's wait over tcp on top (250 against shm's 100)
    assert learners_bound("tcp") == pytest.approx(1e6 / (700 + 400 + 150 + 150 + 10 + 60))
    # its own: two learners over tcp computed 800, spent 900 in the collectives, waited 300, looped 80;
    # all of it as measured, the one learner's wait not added again
    figures["calibration"]["tcp/server/data-parallel-2"] = {
        **figures["calibration"]["shm/server/data-parallel-2"], "transport": "tcp", "learner_compute_us": 800.0,
        "learner_allreduce_us": 900.0, "learner_wait_us": 300.0, "learner_loop_us": 80.0}
    assert model.group_calibration(figures, "tcp", "shm").transport == "tcp"
    assert learners_bound("tcp") == pytest.approx(1e6 / (800 + 900 + 300 + 10 + 80))
    # four over tcp: 32 each, 280 x (800 / 450); its collectives grow by the ring's, as shm's do; 1.5
    # others' requests ahead at the node instead of 0.5
    assert learners_bound("tcp", 4) == pytest.approx(1e6 / (280 * 800 / 450 + 900 + 1200 - 250 + 300 + 40 + 10 + 80))
    # shm's mappings keep shm's run
    assert learners_bound("shm") == pytest.approx(1e6 / (700 + 400 + 150 + 10 + 60))
    figures["calibration"]["tcp/server/data-parallel-2"]["failed"] = "the run ended stopped"
    assert learners_bound("tcp") == pytest.approx(1e6 / (700 + 400 + 150 + 150 + 10 + 60))


def test_a_backend_whose_learner_is_cpus_torch_learner_is_read_from_cpus_learner_figures():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    host["fingerprint"]["cores_usable"] = 8
    schedule = Schedule(batch_size=128, train_every=1, publish_every=1)
    fpga = figures["compute"]["fpga"]
    fpga["learner_update_by_batch"]["64"] = 1200.0  # a slow burst of the host while it was measured

    def learners_bound(compute: str) -> float:
        return model.predict_distributed(dqn_mapping(placement="server", transport="shm", compute=compute,
                                                     policy="data-parallel", learners=2), figures, host,
                                         schedule).bounds["learners"]

    # learners on different devices (or a profile that did not say): each backend's own figures
    assert learners_bound("fpga") < 0.8 * learners_bound("cpu")
    figures["compute"]["cpu"]["learner_device"] = "cpu x1 threads"
    fpga["learner_device"] = "cpu x1 threads"  # the same torch learner: one measurement for both
    assert model.learner_figures(figures, "fpga") is figures["compute"]["cpu"]
    assert learners_bound("fpga") == pytest.approx(learners_bound("cpu"))
    fpga["learner_device"] = "cuda:0 x1 threads"
    assert model.learner_figures(figures, "fpga") is fpga


def test_learners_take_turns_when_they_and_the_busy_roles_outnumber_the_cores():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    host["fingerprint"]["cores_usable"] = 2
    figures["calibration"]["shm/server/data-parallel-2"].update(node_cores=0.1, actors_cpu_us=0.0)
    schedule = Schedule(batch_size=128, train_every=1, publish_every=1)
    two = model.predict_distributed(dqn_mapping(placement="server", transport="shm", policy="data-parallel",
                                                learners=2), figures, host, schedule)
    four = model.predict_distributed(dqn_mapping(placement="server", transport="shm", policy="data-parallel",
                                                 learners=4), figures, host, schedule)
    # the calibration's two learners and its node's 0.1 cores took (2 + 0.1) / 2 turns; the same
    # mapping takes as many: reproduced, with no turns term
    assert "taking turns on the cores" not in {t.name for t in two.terms}
    collectives = 400 + 1200 - 250  # blocked on the ring's messages: not stretched
    period = 280 * 700 / 450 + collectives + 150 + 40 + 10 + 60  # as on eight cores (the test above)
    turns = dict((t.name, t.us) for t in four.terms)["taking turns on the cores"]
    # four learners and the actor's and node's work (about a tenth of a core) on two cores, over
    # the calibration's (2 + 0.1) / 2 turns
    assert 4 / 2.1 - 1 < turns / (period - collectives) < 4.2 / 2.1 - 1
    assert four.bounds["learners"] == pytest.approx(1e6 / (period + turns))
    assert four.bottleneck.startswith("learners")


def test_a_polling_transports_pollers_make_the_learner_take_turns_but_leave_the_cpu_bound():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    host["fingerprint"]["cores_usable"] = 2
    nodes = figures["replay_node"]
    # "dpdk": shm's per-message figures, first without polling figures of its own
    nodes["dpdk/server"], nodes["dpdk/in-network"] = json.loads(json.dumps([nodes["shm/server"], nodes["shm/in-network"]]))
    schedule = Schedule(batch_size=128, train_every=1, publish_every=1)  # the learner binds
    mapping = dqn_mapping(placement="server", transport="dpdk", actors=4)
    before = model.predict_distributed(mapping, figures, host, schedule)
    assert before.bottleneck.startswith("learner") and "taking turns on the cores" not in {t.name for t in before.terms}
    # poll-mode: its node polls 0.8 cores in the learner's rhythm, each waiting client 0.2 (shm's: none measured)
    nodes["dpdk/server"]["node_poll_cores"] = 0.8
    nodes["dpdk/in-network"]["client_wait_cores"] = 0.2
    after = model.predict_distributed(mapping, figures, host, schedule)
    cpu = "CPU (2 cores)"
    assert after.bounds[cpu] == pytest.approx(before.bounds[cpu])  # pollers yield: they take no one's core
    a = 1e6 * 4 / before.bounds["actors (4)"]  # an actor's period per env step
    turns = dict((t.name, t.us) for t in after.terms)["taking turns on the cores"]
    period = 1e6 / before.bounds["learner"]
    # the learner, the node's polling and the 4 waiting actors' (all but a X of them), and the node's
    # and actors' work: (1 + 0.8 + 0.2 (4 - a X) + (a + v) X) / 2 turns, over none in the calibration
    x = before.bounds["learner"]
    low = (1 + 0.8 + 0.2 * (4 - a * x / 1e6) + a * x / 1e6) / 2 - 1
    assert low < turns / period < low + 0.05
    assert after.env_steps_per_s == pytest.approx(1e6 / (period + turns))
    # the calibrated transport's own polling is in its calibration run already: its figures move nothing
    nodes["shm/server"]["node_poll_cores"] = 0.8
    nodes["shm/in-network"]["client_wait_cores"] = 0.2
    shm = model.predict_distributed(dqn_mapping(placement="server", transport="shm", actors=4), figures, host, schedule)
    assert shm.env_steps_per_s == pytest.approx(before.env_steps_per_s)


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


def test_a_prediction_carries_the_spread_of_the_figures_of_its_binding_bound():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    schedule = Schedule(batch_size=128, train_every=1, publish_every=1)
    quiet = model.predict_distributed(dqn_mapping(placement="server", transport="shm"), figures, host, schedule)
    figures["calibration"]["shm/server"]["spread"]["learner_compute_us"] = 0.2
    shaky = model.predict_distributed(dqn_mapping(placement="server", transport="shm"), figures, host, schedule)
    assert 0 < quiet.spread < 0.03 < shaky.spread < 0.2  # the update is 84 % of the learner's period
    assert shaky.env_steps_per_s == pytest.approx(quiet.env_steps_per_s)  # the figure itself is unchanged


def test_the_knee_of_a_measured_sweep_is_where_growth_stops():
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


def test_ranking_is_strictly_by_prediction_and_near_ties_are_marked_not_reordered():
    rows = planner.make_plan(DQN, handmade(), max_actors=1, this_host=HOST).rows
    values = [row.prediction.throughput for row in rows]
    assert values == sorted(values, reverse=True)
    assert [row.rank for row in rows] == list(range(1, len(rows) + 1))
    # among single learners, in-network hides the sampling behind the update: predicted clearly faster
    single = [row for row in rows if row.mapping.learners == 1]
    assert single[0].mapping.label() == "in-network shm prioritized cpu 1 actor"
    assert all(row.tie is None or rows[row.tie - 1].tie is None for row in rows)  # ties name their group's leader
    local = planner.make_plan(DQN, handmade(), max_actors=1, this_host=HOST, only={"placement": "local", "compute": "cpu"})
    uniform, prioritized = local.rows
    # uniform replay is predicted 1.7 % faster (its memory work costs less): first, and the other tied with it
    assert uniform.mapping.replay == "uniform" and uniform.tie is None
    assert prioritized.mapping.replay == "prioritized" and prioritized.tie == 1
    assert prioritized.prediction.throughput > uniform.prediction.throughput * (1 - planner.TIE_TOLERANCE)
    # a wide spread widens the tie: 5 % behind a leader whose prediction spreads 10 % is a tie, 15 % is not
    a, b = planner.Row(dqn_mapping(), model.Prediction(1000.0, 1000.0, 1.0, "", spread=0.1)), \
        planner.Row(dqn_mapping(replay="uniform"), model.Prediction(950.0, 950.0, 1.0, ""))
    assert [r.tie for r in planner.rank([b, a], "throughput")] == [None, 1]
    b.prediction.env_steps_per_s = 850.0
    assert [r.tie for r in planner.rank([b, a], "throughput")] == [None, None]


def test_a_contended_profile_is_refused_naming_its_figures_unless_allowed():
    document = handmade()
    busy = {"cores": 2, "other_processes_cores": 0.9, "steal_fraction": 0.0, "contended": True}
    job_figures(document)["calibration"]["shm/server"]["contended"] = "other processes used 0.90 cores"
    document["hosts"][HOST]["transports"]["shm"]["machine_state"] = busy
    job_figures(document)["allreduce"]["by_learners"]["4"]["machine_state"] = busy
    with pytest.raises(profile.ProfileError) as refused:
        planner.make_plan(DQN, document, max_actors=1, this_host=HOST)
    message = str(refused.value)
    assert "calibration shm/server: other processes used 0.90 cores" in message
    assert "all-reduce among 4: other processes used 0.90 cores" in message
    assert "transport shm: other processes used 0.90 cores" in message and "--allow-contended" in message
    plan = planner.make_plan(DQN, document, max_actors=1, this_host=HOST, allow_contended=True)
    assert len(plan.contended) == 3 and plan.rows
    # our own processes outnumbering the cores is the mapping's own work, not contention
    mine = {"cores": 2, "busy_processes": 4, "other_processes_cores": 0.05, "contended": True}
    assert measure.contention(mine) == ""
    assert measure.contention({"other_processes_cores": 0.0, "steal_fraction": 0.2}).startswith("20% of the CPU")
    # another job's contended figures do not count against this one's plan
    other = handmade()
    job_figures(other, TAXI)["machine_state"] = {"micro": busy}
    assert planner.make_plan(DQN, other, max_actors=1, this_host=HOST).contended == []
    with pytest.raises(profile.ProfileError, match="qlearning Taxi-v3 micro figures"):
        planner.make_plan(TAXI, other, datasets=(1000,), this_host=HOST)


def test_only_ranks_the_chosen_family_and_keeps_the_default_beside_it():
    plan = planner.make_plan(DQN, handmade(), max_actors=3, this_host=HOST,
                             only=planner.parse_only(["placement=server", "actors=2"]))
    assert plan.rows and all(r.mapping.placement == "server" and r.mapping.actors == 2 for r in plan.rows)
    assert plan.default is not None and plan.default.mapping.placement == "local" and plan.default.rank == 0
    assert plan.gain_over_default() == pytest.approx(plan.chosen.prediction.throughput /
                                                     plan.default.prediction.throughput - 1)
    with pytest.raises(RlbenchError, match="did you mean 'actors'"):
        planner.parse_only(["actor=2"])
    with pytest.raises(RlbenchError, match="no mapping passes --only"):
        planner.make_plan(DQN, handmade(), max_actors=1, this_host=HOST, only={"transport": "udp"})


def test_the_plan_says_whether_more_learners_pay():
    document = handmade()
    document["hosts"][HOST]["fingerprint"]["cores_usable"] = 8
    plan = planner.make_plan(DQN, document, max_actors=1, this_host=HOST, only={"replay": "prioritized"})
    gains = {g.parallel.mapping.learners: g for g in planner.learner_gains(plan)}
    assert set(gains) == {2, 4}
    assert gains[2].single.mapping == replace(gains[2].parallel.mapping, policy="single-learner", learners=1)
    assert not gains[2].pays and gains[2].speedup < 1  # 950 / 1320: lock-step and the collectives eat the gain
    lockstep = job_figures(document)["calibration"]["shm/server/data-parallel-2"]
    lockstep.update(learner_allreduce_us=20.0, learner_compute_us=400.0)  # a machine where the halves run apart
    cheap = planner.make_plan(DQN, document, max_actors=1, this_host=HOST, only={"replay": "prioritized"})
    two = next(g for g in planner.learner_gains(cheap) if g.parallel.mapping.learners == 2)
    assert two.pays and two.speedup > 1 + planner.PAYS
    # what a core for each learner could give at most (issue #41 item 10): the update on the whole batch
    # over one on its share plus the collectives, from the profile's own figures, whatever this host has
    figures = job_figures(document)
    cpu, batch = figures["compute"]["cpu"], plan.schedule.batch_size
    for n in (2, 4):
        whole = cpu["learner_update_us"]
        share = cpu["learner_update_by_batch"][str(batch // n)] + (
            figures["allreduce"]["by_learners"][str(n)]["allreduce_us"]
            + figures["allreduce"]["by_learners"][str(n)].get("agreement_us", 0.0))
        assert gains[n].ceiling == pytest.approx((whole / share, whole, share))
        assert gains[n].can_pay == (whole / share >= 1 + (n - 1) * planner.WORTH)
    from rlbench.plan.cli import format_plan

    text = format_plan(plan, top=3, profile_path="handmade.json", planning_s=0.0, document=document)
    assert "with a core for each learner, at most x" in text
    assert ("data-parallel cannot pay for this model" in text) == (not all(g.can_pay for g in gains.values()))
    # a batch that splits into no learner count: the policy is left out, saying why
    odd_job = profile.Job.of("dqn", "CartPole-v1", {"batch_size": 127})
    odd_profile = _with_job_key(handmade(), HOST, odd_job.key)
    odd_profile["hosts"][HOST]["jobs"][odd_job.key]["hyperparameters"]["batch_size"] = 127
    odd = planner.make_plan(odd_job, odd_profile, max_actors=1, this_host=HOST)
    assert "splits into none" in odd.excluded["policy data-parallel"]


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
    job_figures(document, TAXI, here)["settings"][0]["fixed_s"] = 1.0  # a slow cpu: upmem and its --upmem-dpus win
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(document))
    plan_file = tmp_path / "plan.toml"
    plan_command(["--algo", "qlearning", "--env", "Taxi-v3", "--dataset", "10000", "--profile", str(profile_path),
                  "-o", str(plan_file)], standalone_mode=False)
    from rlbench.config import read_toml

    written = read_toml(plan_file)
    assert written["plan"]["schema"] == planner.PLAN_SCHEMA
    assert written["compute"] == "upmem" and written["options"] == {"upmem-dpus": 64}
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


def test_a_short_validation_measures_each_run_in_its_steady_window():
    here = profile.this_host_key()
    plan = planner.make_plan(TAXI, handmade(here), datasets=(10_000,))
    rows = [(row, rank, "top" if rank else "default") for row, rank in validation.validation_rows(plan, 2)]
    checks = validation.validate(plan, rows, seconds=0.2, repeats=1)
    assert [c.rank for c in checks] == [1, 2]  # the default (cpu) is the first: not run twice
    assert all(c.status.startswith("complete") and math.isfinite(c.error) and c.spread is not None for c in checks)
    job = profile.Job.of("dqn", "CartPole-v1", {"learning_starts": 200, "batch_size": 32})
    replay = planner.make_plan(job, _with_job_key(handmade(here), here, job.key), max_actors=1,
                               only={"placement": "local"})
    local = replay.rows[0]
    check = validation.run_check(replay, local, local.rank, seconds=0.3, repeats=1)
    # one run, or more where other processes disturbed it (never more than the extra runs allow)
    assert check.status == "complete" and check.steps > 200
    assert 1 <= len(check.runs) + check.left_out <= 1 + validation.EXTRA_RUNS
    assert check.measured > 0 and math.isfinite(check.error) and check.window_s > 0
    assert check.measured_updates_per_s == pytest.approx(check.measured / replay.schedule.train_every)
    summary = validation.summary(checks + [check])
    assert summary["top_and_default"]["measured"] == 3 and math.isfinite(summary["median_abs_error"])
    assert summary["holdout"]["median_abs_error"] is None


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


def test_the_all_reduce_is_timed_among_forked_ranks_and_a_failing_rank_is_reported():
    measured = profile.measure_allreduce(1_000, 2)
    assert measured["available"], measured.get("reason")
    assert measured["world"] == 2 and measured["allreduce_us"] > 0 and measured["agreement_us"] > 0
    failed = profile.measure_allreduce(-1, 2)  # every rank's gradient is refused by torch
    assert not failed["available"] and failed["reason"].startswith(("rank 0: RuntimeError", "rank 1: RuntimeError"))
    late = profile.measure_allreduce(1_000, 2, time_limit=0.05)
    assert late == {"available": False, "reason": "its measurement did not finish within 0.05 s", "world": 2,
                    "parameters": 1_000}


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


def test_a_backends_own_distributed_calibration_enters_the_model_as_its_differences_from_cpu():
    document = handmade()
    figures, host = job_figures(document), document["hosts"][HOST]
    schedule = Schedule(batch_size=128, train_every=1, publish_every=1)
    without = model.predict_distributed(dqn_mapping(compute="fpga", placement="server", transport="shm"), figures,
                                        host, schedule)
    # no run of its own: its micro figures (the same update, inference 10 us dearer)
    assert without.bounds["learner"] == pytest.approx(1e6 / 950)
    assert without.bounds["actors (1)"] == pytest.approx(1e6 / (30.46875 + 10 + 100 / 128))
    # its own server run: its OpenCL threads beside the learner made the update 1.25x, the wait 50 us
    # and the loop 20 us dearer, the actor's step 14.53 us
    figures["calibration"]["shm/server/fpga"] = {
        **figures["calibration"]["shm/server"], "compute": "fpga", "learner_compute_us": 1000.0,
        "learner_wait_us": 150.0, "learner_loop_us": 60.0, "free_step_us": 45.0}
    server = model.predict_distributed(dqn_mapping(compute="fpga", placement="server", transport="shm"), figures,
                                       host, schedule)
    assert server.bounds["learner"] == pytest.approx(1e6 / (1000 + 150 + 10 + 60))  # its own run, reproduced
    assert server.bounds["actors (1)"] == pytest.approx(1e6 / (45 + 100 / 128))
    in_network = model.predict_distributed(dqn_mapping(compute="fpga", placement="in-network", transport="shm"),
                                           figures, host, schedule)
    assert in_network.bounds["learner"] == pytest.approx(1e6 / (1000 + 28 + 50 + 10 + 60))
    # in one process nothing runs beside its threads: locally, its micro figures only
    local = model.predict_local(dqn_mapping(compute="fpga"), figures, schedule)
    assert local.env_steps_per_s == pytest.approx(1e6 / (940 + 10))
    # a backend whose learner is cpu's torch learner: its run's compute is cpu's learner measured
    # again (the host's drift), so the compute stays cpu's calibrated 800; the wait and loop still move
    figures["compute"]["cpu"]["learner_device"] = figures["compute"]["fpga"]["learner_device"] = "cpu x1 threads"
    same = model.predict_distributed(dqn_mapping(compute="fpga", placement="server", transport="shm"), figures,
                                     host, schedule)
    assert same.bounds["learner"] == pytest.approx(1e6 / (800 + 150 + 10 + 60))


# ------------------------------------------------------------------------- measuring runs
def _curve(*phases: tuple[int, float], every: int = 20) -> list[dict]:
    """Episode ends every `every` env steps through phases of (env steps, env steps/s)."""
    points, step, clock = [], 0, 0.0
    for steps, rate in phases:
        for _ in range(steps // every):
            step += every
            clock += every / rate
            points.append({"step": step, "time_s": clock, "return": 1.0, "length": every})
    return points


def test_the_steady_window_leaves_the_warm_up_out_and_a_changing_rate_shows_as_spread():
    result = {"learning_curve": _curve((1000, 10_000.0), (4000, 500.0))}  # actors alone, then the learner's pace
    start = measure.window_start(1000, 5000)
    assert start == 1400  # the warm-up and a tenth of the rest, while actors and learner settle
    steady = measure.steady_rate(result, start)
    assert steady.rate == pytest.approx(500.0) and steady.spread < 1e-6 and steady.episodes == 181  # 1,400..5,000
    assert measure.steady_rate(result, 0).rate > 1.08 * 500  # with the warm-up in the window: too fast
    changing = {"learning_curve": _curve((2000, 400.0), (2000, 600.0))}
    assert measure.steady_rate(changing, 0).spread > 0.02
    alone = measure.steady_rate(result, 200, end_step=950)  # the warm-up itself: the actors' rate alone
    assert alone.rate == pytest.approx(10_000.0)
    assert measure.steady_rate({"learning_curve": _curve((80, 100.0))}, 0) is None  # 4 episodes: too few


def test_role_costs_come_from_the_roles_time_splits_and_leave_the_first_wait_out():
    result = {"throughput": {"env_steps": 10_000, "updates": 1_000},
              "latency": {"replay.SAMPLE": {"count": 1001, "mean": (1000 * 150 + 2e6) / 1001, "max": 2e6},
                          "replay.UPDATE_PRIORITIES": {"count": 1000, "mean": 30.0, "max": 80.0}},
              "loop": {"roles": {"learner": {"updates": 1000}, "actor-0": {"produced": 6000}, "actor-1": {"produced": 4000}},
                       "time_split": {"learner": {"learner": 1.2, "weights": 0.01, "bookkeeping": 0.04, "cpu_s": 1.3,
                                                  "allreduce": 0.0, "window_s": 3.5},
                                      "actor-0": {"cpu_s": 0.3, "weights": 0.02, "window_s": 3.5},
                                      "actor-1": {"cpu_s": 0.2, "weights": 0.01, "window_s": 3.5},
                                      "replay": {"cpu_s": 0.35, "replay": 0.05, "window_s": 3.5}}}}
    costs = measure.flat_role_costs(result)
    assert costs["learner_compute_us"] == pytest.approx(1200.0) and costs["learner_cpu_us"] == pytest.approx(1300.0)
    assert costs["learner_wait_us"] == pytest.approx(150.0 + 30.0)  # the first SAMPLE (the warm-up) left out
    assert costs["learner_loop_us"] == pytest.approx(40.0) and costs["learner_weights_us"] == pytest.approx(10.0)
    assert costs["actors_cpu_us"] == pytest.approx(50.0) and costs["actors_weights_us"] == pytest.approx(3.0)
    assert costs["node_cpu_us"] == pytest.approx(35.0) and costs["node_cores"] == pytest.approx(0.1)


def test_calibration_runs_its_settings_in_rounds_until_undisturbed_runs_agree_and_records_their_spread(monkeypatch):
    rates: dict[str, list[tuple[float, str]]] = {}
    order: list[str] = []

    def fake_run(job, figures, setting, *, seed=0, cores=1):
        order.append(f"{setting.key}#{seed}")
        if setting.key == "shm/in-network":
            raise RlbenchError("refused before it started")
        rate, contended = rates[setting.key][seed]
        return {"seed": seed, "status": "complete", "contended": contended, "env_steps_per_s": rate, "spread": 0.01,
                "learner_compute_us": 800.0 + seed}

    settings = [profile.Calibration("local", "local"), profile.Calibration("shm/server", "server", "shm"),
                profile.Calibration("shm/in-network", "in-network", "shm")]
    monkeypatch.setattr(profile, "calibration_run", fake_run)
    monkeypatch.setattr(profile, "calibration_settings", lambda *args, **kwargs: settings)
    figures = {"compute": {"cpu": {"available": True}}, "replay": {"prioritized": {"available": True}}}

    def calibrate(deadline: float = math.inf, said: list[str] | None = None) -> dict:
        order.clear()
        profile.calibrate_job(DQN, figures, {}, None, calibrate=("shm",), deadline=deadline,
                              progress=said.append if said is not None else lambda line: None)
        return figures["calibration"]

    busy = "other processes used 0.90 cores"
    rates["local"] = [(1000.0, ""), (1300.0, busy), (1100.0, "")]  # the disturbed run is run again, not averaged in
    rates["shm/server"] = [(700.0, ""), (720.0, "")]  # agree: two runs
    entries = calibrate()
    # in rounds: every setting's runs sample the same stretches of the host's pace
    assert order == ["local#0", "shm/server#0", "shm/in-network#0", "local#1", "shm/server#1", "local#2"]
    entry = entries["local"]
    assert len(entry["runs"]) == 3 and entry["repeats"] == 2 and entry["left_out"] == 1 and entry["contended"] == ""
    assert entry["env_steps_per_s"] == 1050.0 and entry["spread"]["env_steps_per_s"] == pytest.approx(50 / 1050)
    assert entry["learner_compute_us"] == 801.0  # the median of the kept runs' (800, 802)
    assert entries["shm/server"]["repeats"] == 2 and entries["shm/server"]["env_steps_per_s"] == 710.0
    assert entries["shm/in-network"] == {"failed": "refused before it started", "placement": "in-network"}
    rates["local"] = [(1000.0, ""), (1300.0, ""), (1100.0, "")]  # undisturbed, but apart: up to three runs
    entry = calibrate()["local"]
    assert profile.CALIBRATION_MAX_REPEATS == 3 and entry["repeats"] == 3 and entry["env_steps_per_s"] == 1100.0
    assert entry["spread"]["env_steps_per_s"] == pytest.approx(150 / 1100)
    said: list[str] = []  # past the profile's time budget: two runs, apart or not, and it says so
    entry = calibrate(deadline=time.perf_counter() - 1.0, said=said)["local"]
    assert entry["repeats"] == 2 and entry["spread"]["env_steps_per_s"] == pytest.approx(150 / 1150)
    assert [line for line in said if "budget" in line] == [
        f"{DQN.key}: calibration local: no run more (the profile's {profile.PROFILE_BUDGET_S:.0f} s budget): "
        "its spread is its runs' half range"]
    rates["local"] = [(900.0, busy)] * 3  # never quiet: all three kept, and the entry says it was contended
    entry = calibrate()["local"]
    assert entry["repeats"] == 3 and entry["left_out"] == 0 and entry["contended"] == busy


def test_calibration_settings_name_the_runs_the_model_reads():
    figures = job_figures(handmade())
    figures["replay"]["fpga"] = {**figures["replay"]["prioritized"], "device": "opencl"}  # a device's threads
    figures["replay"]["memmap"] = {**figures["replay"]["prioritized"], "device": "disk"}  # the node's own thread
    transports = handmade()["hosts"][HOST]["transports"]
    settings = profile.calibration_settings(DQN, figures, transports, rlbench.get_registry(), calibrate=("shm", "tcp"),
                                            cores=2)
    keys = [s.key for s in settings]
    # tcp's replay node failed when profiled: no run over it
    assert keys == ["local", "local/actor-heavy", "shm/server", "shm/in-network", "shm/server/fpga",
                    "shm/server/replay-fpga", "shm/server/saturated-2", "shm/server/data-parallel-2"]
    heavy = {s.key: s for s in settings}
    assert heavy["local/actor-heavy"].train_every >= 8 and not heavy["local/actor-heavy"].free_phase
    assert heavy["shm/server/saturated-2"].actors == 2 and heavy["shm/server/fpga"].compute == "fpga"
    assert heavy["shm/server/replay-fpga"].replay == "fpga" and heavy["shm/server/replay-fpga"].compute == "cpu"
    assert heavy["shm/server/saturated-2"].train_every > 1 and not heavy["shm/server/saturated-2"].free_phase
    assert heavy["shm/server"].free_phase and heavy["shm/server"].train_every == 1
    assert heavy["shm/server/data-parallel-2"].learners == 2
    # a transport measured usable but not calibrated: a run of its own at a server, for its wait
    figures["replay_node"]["tcp/server"] = {**figures["replay_node"]["shm/server"], "transport": "tcp"}
    settings = profile.calibration_settings(DQN, figures, transports, rlbench.get_registry(), calibrate=("shm",),
                                            cores=2)
    wait = {s.key: s for s in settings}["tcp/server/wait"]
    assert (wait.placement, wait.transport, wait.free_phase) == ("server", "tcp", False)
    # and one of two learners in lock-step over it; both read only for the learner's split: short windows
    lockstep = {s.key: s for s in settings}["tcp/server/data-parallel-2"]
    assert (lockstep.transport, lockstep.learners, lockstep.split_only) == ("tcp", 2, True) and wait.split_only
    assert not heavy["shm/server"].split_only and heavy["shm/server/data-parallel-2"].split_only
    shape = {s.key: profile._calibration_budget(DQN, figures, s, 2) for s in settings}
    assert shape["tcp/server/wait"][1] < shape["shm/server"][1]  # fewer steps in the run
    keys = {s.key for s in settings}
    assert "tcp/in-network" not in keys and not any(key.startswith("udp/") for key in keys)  # udp: unusable


def test_a_run_read_only_for_its_split_keeps_it_where_too_few_episodes_end_for_a_rate(monkeypatch):
    figures = job_figures(handmade())

    def fake_run(config):  # long episodes: one ends after the warm-up, too few for a steady rate
        return {"status": "complete", "timing": {"wall_s": 2.0}, "machine_state": {},
                "throughput": {"env_steps": config.steps, "updates": 1000, "env_steps_per_s": 950.0},
                "learning_curve": _curve((config.steps, 950.0), every=config.steps // 2),
                "loop": {"roles": {"learner": {"updates": 1000}},
                         "time_split": {"learner": {"learner": 0.9, "allreduce": 1.8, "window_s": 3.0}}}}

    monkeypatch.setattr(rlbench, "run", fake_run)
    lockstep = profile.Calibration("tcp/server/data-parallel-2", "server", "tcp", learners=2, free_phase=False,
                                   split_only=True)
    run = profile.calibration_run(DQN, figures, lockstep)
    # its rate is the whole run's, its spread unknown: it only tells repeats apart; the split stands
    assert run["env_steps_per_s"] == 950.0 and run["spread"] == math.inf and "failed" not in run
    assert run["learner_allreduce_us"] == pytest.approx(1800.0) and run["learner_compute_us"] == pytest.approx(900.0)
    # a run read for its rate has none to give
    server = profile.Calibration("tcp/server", "server", "tcp")
    assert profile.calibration_run(DQN, figures, server)["failed"] == "too few episodes ended in the steady window to time it"


def test_the_profile_summary_shows_each_calibration_runs_learner_update_and_wait():
    from rlbench.plan.cli import format_profile

    document = handmade()
    figures = job_figures(document)
    figures["calibration"]["tcp/server/wait"] = {**figures["calibration"]["shm/server"], "transport": "tcp",
                                                 "learner_wait_us": 171.4}
    text = format_profile(document["hosts"][HOST], [DQN.key])
    line = next(line for line in text.splitlines() if "calibration tcp/server/wait" in line)
    assert "learner update 800 us, wait 171 us" in line and "all-reduce" not in line
    assert "wait" not in next(line for line in text.splitlines() if "calibration local " in line)
    lockstep = next(line for line in text.splitlines() if "calibration shm/server/data-parallel-2" in line)
    assert "learner update 700 us, wait 150 us, all-reduce 400 us" in lockstep


def test_ray_is_left_out_of_a_default_profile_with_the_reason_and_measured_when_named():
    from types import SimpleNamespace

    caps = SimpleNamespace(crosses_processes=True, crosses_hosts=True, reliable=True, max_message_bytes=1 << 20)
    probed = []
    ray = SimpleNamespace(name="ray", capabilities=caps, probe=lambda: probed.append("ray") or SimpleNamespace(
        available=False, reason="probed"))
    registry = SimpleNamespace(components=lambda kind: [ray])
    skipped = profile.measure_transports(registry, (64,), {})
    assert skipped["ray"]["transport"]["reason"].startswith("not profiled by default") and not probed
    named = profile.measure_transports(registry, (64,), {}, only=("ray",))
    assert named["ray"]["transport"]["reason"] == "probed" and probed == ["ray"]  # measured: here, its probe said no
    other = profile.measure_transports(registry, (64,), {}, only=("tcp",))
    assert "not among `rlbench profile --transports tcp`" in other["ray"]["transport"]["reason"]


def test_a_profile_of_an_older_rlbench_is_refused_in_one_line(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**handmade(), "schema": "rlbench.profile/1"}))
    with pytest.raises(profile.ProfileError, match=r"made by another rlbench \(rlbench.profile/1.*run `rlbench profile` again"):
        profile.load_profile(old)


# ------------------------------------------------------------------------- checks of the gain
def test_the_holdout_draws_reproducibly_from_mappings_the_profile_never_calibrated():
    document = handmade()
    calibration = job_figures(document)["calibration"]
    calibration["shm/server/replay-uniform"] = {**calibration["shm/server"], "replay": "uniform"}
    plan = planner.make_plan(DQN, document, max_actors=4, this_host=HOST)
    trained = validation.calibrated(plan, document)
    shape = lambda **fields: validation._shape(dqn_mapping(**fields))  # noqa: E731
    assert shape(placement="server", transport="shm") in trained
    assert shape(placement="server", transport="shm", replay="uniform") in trained  # a replay memory's own run
    assert shape(placement="server", transport="shm", actors=4) in trained  # the saturated runs' mappings
    assert shape(placement="server", transport="shm", policy="data-parallel", learners=2) in trained
    assert shape(placement="local") in trained and shape(placement="server", transport="shm", actors=3) not in trained
    top = [row for row, _ in validation.validation_rows(plan, 5)]
    drawn = validation.holdout_rows(plan, document, 8, seed=3, exclude=top)
    assert len(drawn) == 8 and not any(row in top for row in drawn)
    assert not any(validation._shape(row.mapping) in trained for row in drawn)
    assert drawn == validation.holdout_rows(plan, document, 8, seed=3, exclude=top)  # the same seed, the same draw
    assert drawn != validation.holdout_rows(plan, document, 8, seed=4, exclude=top)


def test_a_validation_run_repeats_until_undisturbed_runs_agree(monkeypatch):
    document = handmade()
    plan = planner.make_plan(DQN, document, max_actors=1, this_host=HOST, only={"placement": "local", "compute": "cpu",
                                                                              "replay": "prioritized"})
    runs: dict[int, tuple[float, float]] = {}  # seed -> (rate, other processes' cores)
    seeds = []

    def fake_run(config):
        seeds.append(config.seed)
        rate, others = runs[config.seed]
        curve = _curve((1000, 20_000.0), (config.steps - 1000, rate))
        return {"status": "complete", "throughput": {"env_steps": curve[-1]["step"]}, "learning_curve": curve,
                "machine_state": {"other_processes_cores": others}}

    monkeypatch.setattr(rlbench, "run", fake_run)
    runs.update({5: (1000.0, 0.0), 6: (1300.0, 0.9), 7: (1100.0, 0.0)})
    disturbed = validation.run_check(plan, plan.rows[0], 1, seconds=1.0, seed=5)
    assert seeds == [5, 6, 7] and disturbed.runs == pytest.approx([1000.0, 1100.0]) and disturbed.left_out == 1
    assert disturbed.measured == pytest.approx(1050.0) and disturbed.spread == pytest.approx(50 / 1050, rel=1e-3)
    assert disturbed.contended == ""  # what it measured was measured undisturbed
    runs.update({5: (1000.0, 0.9), 6: (1300.0, 0.9), 7: (1100.0, 0.9), 8: (1200.0, 0.9)})
    seeds.clear()
    busy = validation.run_check(plan, plan.rows[0], 1, seconds=1.0, seed=5)
    assert seeds == [5, 6, 7, 8] and busy.measured == pytest.approx(1150.0)  # never quiet: all, and said so
    assert busy.contended == "other processes used 0.90 cores"


def test_a_distributed_validation_run_sets_the_learners_measured_split_beside_the_models(monkeypatch):
    plan = planner.make_plan(DQN, handmade(), max_actors=1, this_host=HOST,
                             only={"placement": "server", "transport": "shm", "replay": "uniform", "compute": "cpu"})
    row = plan.rows[0]
    k = plan.schedule.train_every
    predicted = {term.name: term.us * k for term in row.prediction.learner_terms}
    rate = row.prediction.env_steps_per_s * 0.8  # the run 20 % slower than predicted ...
    compute_us = predicted["update"] + 0.25 * 1e6 * k / row.prediction.env_steps_per_s  # ... all in its compute

    def fake_run(config):
        curve = _curve((1000, 20_000.0), (config.steps - 1000, rate))
        updates = (config.steps - 1000) // k
        return {"status": "complete", "throughput": {"env_steps": curve[-1]["step"], "updates": updates},
                "learning_curve": curve, "machine_state": {"other_processes_cores": 0.0},
                "latency": {"replay.SAMPLE": {"count": updates + 1, "mean": 300.0, "max": 300.0}},
                "loop": {"roles": {"learner": {"updates": updates}},
                         "time_split": {"learner": {"learner": compute_us * 1e-6 * updates, "allreduce": 0.0,
                                                    "weights": 0.0, "bookkeeping": 0.0, "window_s": 1.0}}}}

    monkeypatch.setattr(rlbench, "run", fake_run)
    lines = []
    check = validation.validate(plan, [(row, 1, "top")], seconds=1.0, progress=lines.append)[0]
    split = {part: (p, m) for part, p, m in check.learner_split}
    assert split["compute"] == (pytest.approx(predicted["update"]), pytest.approx(compute_us))
    assert split["wait"][1] == pytest.approx(300.0)
    assert split["period"][0] == pytest.approx(1e6 * k / row.prediction.env_steps_per_s)
    assert split["period"][1] == pytest.approx(1e6 * k / rate, rel=1e-3)  # measured: from the steady rate
    assert "learner per update, predicted/measured us: compute" in lines[0]
    local = planner.make_plan(DQN, handmade(), max_actors=1, this_host=HOST, only={"placement": "local"}).rows[0]
    assert validation.learner_split(local.prediction, {}, k, 1000.0) == []  # one process: no learner of its own


def test_repeats_are_enough_when_any_two_undisturbed_runs_agree():
    assert not measure.enough([(900.0, ""), (1200.0, "")], 2, 4, 0.10)
    assert measure.enough([(900.0, ""), (1200.0, ""), (950.0, "")], 2, 4, 0.10)  # 900 and 950 agree
    assert not measure.enough([(900.0, ""), (1200.0, ""), (950.0, "other processes used 0.90 cores")], 2, 4, 0.10)
    assert not measure.enough([(900.0, ""), (None, ""), (1200.0, "")], 2, 4, 0.10)  # a run with no rate agrees with none
    assert measure.enough([(900.0, ""), (1200.0, ""), (600.0, ""), (1500.0, "")], 2, 4, 0.10)  # the most: enough
    assert measure.enough([(900.0, "")], 1, 3, 0.10)


def test_validation_runs_its_mappings_in_rounds_and_a_third_run_only_where_two_disagree(monkeypatch):
    plan = planner.make_plan(DQN, handmade(), max_actors=1, this_host=HOST,
                             only={"placement": "local", "compute": "cpu"})
    first, second = plan.rows[:2]
    rates = {(first.mapping.replay, 0): 1000.0, (first.mapping.replay, 1): 1050.0,  # agree: two runs
             (second.mapping.replay, 0): 900.0, (second.mapping.replay, 1): 1200.0,  # disagree: a third
             (second.mapping.replay, 2): 950.0}
    ran = []

    def fake_run(config):
        ran.append((config.replay, config.seed))
        curve = _curve((1000, 20_000.0), (config.steps - 1000, rates[config.replay, config.seed]))
        return {"status": "complete", "throughput": {"env_steps": curve[-1]["step"]}, "learning_curve": curve,
                "machine_state": {"other_processes_cores": 0.0}}

    monkeypatch.setattr(rlbench, "run", fake_run)
    lines = []
    checks = validation.validate(plan, [(first, 1, "top"), (second, 2, "top")], seconds=1.0, progress=lines.append)
    a, b = first.mapping.replay, second.mapping.replay
    assert ran == [(a, 0), (b, 0), (a, 1), (b, 1), (b, 2)]  # each round runs every mapping still unsettled
    assert checks[0].measured == pytest.approx(1025.0) and checks[1].measured == pytest.approx(950.0)
    assert checks[1].runs == pytest.approx([900.0, 1200.0, 950.0])
    assert lines[0].startswith("round 1: ran top #1") and lines[-1].startswith("top #2") and "3 run(s)" in lines[-1]


def test_a_stop_signal_ends_the_validation_after_the_run_it_stopped(monkeypatch):
    import os
    import signal
    import threading

    from rlbench.runner import SignalInterrupt

    here = profile.this_host_key()
    job = profile.Job.of("dqn", "CartPole-v1", {"learning_starts": 200, "batch_size": 32})
    plan = planner.make_plan(job, _with_job_key(handmade(here), here, job.key), max_actors=1,
                             only={"placement": "local", "compute": "cpu"})
    real_run, started = rlbench.run, []

    def run_then_signalled(config):  # SIGTERM lands a second into the first run, as a scheduler's would
        started.append(config.replay)
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
        return real_run(config)

    monkeypatch.setattr(rlbench, "run", run_then_signalled)
    rows = [(row, row.rank, "top") for row in plan.rows[:2]]
    t0 = time.perf_counter()
    with pytest.raises(SignalInterrupt, match="stopped by SIGTERM.*no further run started"):
        validation.validate(plan, rows, seconds=600.0)
    assert len(started) == 1 and time.perf_counter() - t0 < 30  # the 600 s run stopped in order, none after it


def test_a_gain_check_sets_the_measured_gain_beside_the_predicted_one():
    prediction = model.Prediction(1300.0, 1300.0, 1.0, "")
    first = validation.Check(dqn_mapping(placement="server", transport="shm"), prediction, 1, predicted=1300.0,
                             measured=1250.0)
    default = validation.Check(dqn_mapping(), prediction, None, "default", predicted=1000.0, measured=1000.0)
    gain = validation.GainCheck(first, default, "first choice over the default")
    assert gain.predicted_gain == pytest.approx(0.30) and gain.measured_gain == pytest.approx(0.25)
    assert gain.error == pytest.approx(1.25 / 1.30 - 1)


def test_the_summary_reads_the_hosts_pace_off_the_default_mapping_and_warns_when_it_moved():
    from rlbench.plan.cli import format_checks

    default = dqn_mapping()
    prediction = model.Prediction(1000.0, 1000.0, 1.0, "")
    checks = [validation.Check(dqn_mapping(placement="server", transport="shm"), prediction, 1, predicted=1000.0,
                               measured=800.0),
              validation.Check(default, prediction, None, "default", predicted=1084.0, measured=885.0)]
    slow = validation.summary(checks, default)
    assert slow["host_pace"] == pytest.approx(885 / 1084)
    assert "WARNING: the host's pace: the default mapping measured 82% of its prediction" in \
        format_checks(checks, slow, seconds=4.0, offline=False)
    checks[1].measured = 1050.0  # within the drift: said, not warned
    steady = format_checks(checks, validation.summary(checks, default), seconds=4.0, offline=False)
    assert "the host's pace: the default mapping measured 97%" in steady and "WARNING: the host" not in steady
    assert validation.summary(checks)["host_pace"] is None  # no default named: no pace


def test_check_runs_the_first_choice_and_the_default_for_the_same_steps_and_seed():
    here = profile.this_host_key()
    job = profile.Job.of("dqn", "CartPole-v1", {"learning_starts": 200, "batch_size": 32})
    document = _with_job_key(handmade(here), here, job.key)
    same = planner.make_plan(job, document, max_actors=1, only={"placement": "local", "compute": "cpu",
                                                                "replay": "prioritized"})
    assert "nothing to gain" in validation.first_choice_check(same, seconds=0.3)
    plan = planner.make_plan(job, document, max_actors=1, only={"placement": "local", "compute": "cpu",
                                                                "replay": "uniform"})
    outcome = validation.first_choice_check(plan, seconds=0.3, seed=3, repeats=1)
    assert outcome.candidate.mapping.replay == "uniform" and outcome.baseline.mapping.replay == "prioritized"
    assert outcome.candidate.steps == outcome.baseline.steps  # the same budget, for a fair comparison
    assert math.isfinite(outcome.measured_gain) and math.isfinite(outcome.error)
    assert outcome.predicted_gain == pytest.approx(plan.gain_over_default())
    assert "no data-parallel mapping with 2 learners" in validation.policy_check(same, 2)


def test_check_policies_runs_the_benchs_own_runs_and_sets_the_speedup_beside_the_prediction():
    here = profile.this_host_key()
    job = profile.Job.of("dqn", "CartPole-v1", {"learning_starts": 200})
    plan = planner.make_plan(job, handmade(here), max_actors=1,
                             only={"policy": "data-parallel", "transport": "shm", "replay": "prioritized"})
    outcome = validation.policy_check(plan, 2, steps=500)
    assert outcome.unit == "updates/s" and outcome.candidate.mapping.learners == 2
    assert outcome.baseline.mapping == replace(outcome.candidate.mapping, policy="single-learner", learners=1)
    assert outcome.candidate.status == outcome.baseline.status == "complete"
    assert outcome.candidate.measured > 0 and outcome.baseline.measured > 0  # `bench policies`' updates/s
    assert outcome.predicted_gain == pytest.approx(
        outcome.candidate.prediction.updates_per_s / outcome.baseline.prediction.updates_per_s - 1)
    assert math.isfinite(outcome.error)


# --------------------------------------------------------------------------- image-scale jobs
class _Clock:
    """A monotonic clock that moves one unit each time it is read (a validation run's start and end)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


def test_validation_sets_each_run_against_the_default_in_the_same_rounds_so_the_hosts_pace_cancels(monkeypatch):
    plan = planner.make_plan(DQN, handmade(), max_actors=1, this_host=HOST, only={"compute": "cpu", "actors": "1"})
    default = plan.default
    others = [plan.rows[0], next(row for row in plan.rows if row.mapping.placement == "server")]
    # the mappings' true rates: the first as predicted, the second 20 % under its prediction
    truth = {others[0].mapping: others[0].prediction.env_steps_per_s,
             others[1].mapping: 0.8 * others[1].prediction.env_steps_per_s,
             default.mapping: default.prediction.env_steps_per_s}
    clock = _Clock()
    monkeypatch.setattr(validation, "time", clock)
    ran = []

    def fake_run(config):  # the host slows by 3 % a clock unit: every absolute rate carries that drift
        mapping = next(m for m in truth if m.config().placement == config.placement
                       and m.config().transport == config.transport and m.config().replay == config.replay)
        ran.append(mapping)
        rate = truth[mapping] * (1 - 0.03 * (clock.now + 0.5))  # the pace at the run's middle
        curve = _curve((1000, 50_000.0), (config.steps - 1000, rate))
        return {"status": "complete", "throughput": {"env_steps": curve[-1]["step"], "updates": 0},
                "learning_curve": curve, "machine_state": {"other_processes_cores": 0.0}}

    monkeypatch.setattr(rlbench, "run", fake_run)
    rows = [(others[0], others[0].rank, "top"), (others[1], others[1].rank, "top")]
    checks = validation.validate(plan, rows, seconds=1.0, reference=default)
    assert [c.kind for c in checks] == ["top", "top", "default"]  # the default added where the rows lack it
    # every round starts with the default, and one more default run closes the last round
    rounds = [i for i, mapping in enumerate(ran) if mapping == default.mapping]
    assert rounds[0] == 0 and ran[-1] == default.mapping and len(rounds) >= 3
    first, second, itself = checks
    assert first.measured_ratio == pytest.approx(first.predicted_ratio, rel=1e-6) and first.ratio_error == \
        pytest.approx(0.0, abs=1e-6)
    assert second.ratio_error == pytest.approx(1 / 0.8 - 1, rel=1e-6)  # the model's own miss, the pace gone
    assert abs(first.error) > 0.05  # absolute: the host's drift since the profile is in it
    assert itself.reference and itself.measured_ratio == 1.0 and itself.ratio_error == 0.0
    summary = validation.summary(checks, default.mapping)
    part = summary["top_and_default"]
    assert part["ratios_measured"] == 2  # the default's own ratio is no test of the model
    assert part["max_abs_ratio_error"] == pytest.approx(0.25, rel=1e-6)
    assert summary["ranking"]["pairs"] == 3
    from rlbench.plan.cli import format_checks
    text = format_checks(checks, summary, seconds=1.0, offline=False)
    assert "as ratios to the default, median |error| 12.5%, max 25.0% over 2 mappings (absolute: median" in text
    assert "pairs of mappings measured in the order of their predicted ratios" in text and "(itself)" in text


def test_the_defaults_rate_at_a_runs_time_is_interpolated_between_its_runs_before_and_after():
    anchors = [(10.0, 100.0), (20.0, 80.0), (40.0, 60.0)]
    assert validation.reference_rate(anchors, 15.0) == pytest.approx(90.0)
    assert validation.reference_rate(anchors, 30.0) == pytest.approx(70.0)
    assert validation.reference_rate(anchors, 5.0) == 100.0 and validation.reference_rate(anchors, 50.0) == 60.0
    assert validation.reference_rate([], 5.0) is None


def test_validation_runs_wait_for_at_most_a_short_warm_up_whatever_the_jobs_learning_starts(monkeypatch):
    slow_start = profile.Job.of("dqn", "CartPole-v1", {"learning_starts": 80_000, "buffer_size": 100_000})
    document = _with_job_key(handmade(), HOST, slow_start.key)
    plan = planner.make_plan(slow_start, document, max_actors=1, this_host=HOST,
                             only={"placement": "local", "compute": "cpu", "replay": "prioritized"})
    configs = []

    def fake_run(config):
        configs.append(config)
        curve = _curve((2000, 50_000.0), (config.steps - 2000, 900.0))
        return {"status": "complete", "throughput": {"env_steps": curve[-1]["step"]}, "learning_curve": curve,
                "machine_state": {"other_processes_cores": 0.0}}

    monkeypatch.setattr(rlbench, "run", fake_run)
    check = validation.run_check(plan, plan.rows[0], 1, seconds=1.0, repeats=1)
    assert configs[0].hyperparameters["learning_starts"] == validation.VALIDATION_LEARNING_STARTS
    assert configs[0].steps < 10_000 and check.measured == pytest.approx(900.0)
    assert check.mapping == plan.rows[0].mapping  # reported as the job's mapping
    cartpole = planner.make_plan(DQN, handmade(), max_actors=1, this_host=HOST, only={"placement": "local"})
    assert validation.run_mapping(cartpole, cartpole.rows[0].mapping) is cartpole.rows[0].mapping  # 1,000: as it is


def _image_samples(buffer_size: int, frame_shape: tuple[int, ...] = (84, 84), rows: int = 256) -> profile.JobSamples:
    """Samples of an image job without running one: stacked uint8 frames as an Atari actor produces them."""
    from types import SimpleNamespace

    import numpy as np

    from rlbench.kit.bench import image_transitions

    transitions = image_transitions(rows, 0, frame_shape=frame_shape)
    transitions["action"] = np.zeros(rows, np.int64)
    spec = SimpleNamespace(observation_kind="image", frame_stack=4, num_envs=1)
    hp = SimpleNamespace(batch_size=32, buffer_size=buffer_size)
    batch = {name: values[:32] for name, values in transitions.items()}
    return profile.JobSamples(None, hp, spec, transitions, batch, [np.zeros((512, 4), np.float32)], 1.0, 0.0, 1)


def test_an_image_jobs_messages_are_sized_as_the_wire_carries_them():
    samples = _image_samples(1_000)
    sizes = profile.message_bytes(samples, 128)
    frame = 84 * 84
    # an INSERT of 128 consecutive steps carries each frame once: about one a step, not 2 x 4 a step
    assert 128 * frame < sizes["insert"] < 140 * frame
    assert 32 * 5 * frame < sizes["batch"] < 32 * 5 * frame + 4_000  # each row's k + 1 frames
    whole = profile.batch_bytes(samples.batch, 0)  # a memory that stores the stacks whole sends both
    assert 32 * 8 * frame < whole < 32 * 8 * frame + 4_000
    assert 512 * 4 * 4 < sizes["weights"] < 512 * 4 * 4 + 1_000


def test_a_memory_that_cannot_hold_the_jobs_buffer_and_a_backend_the_validator_refuses_are_left_out_with_why():
    registry = rlbench.get_registry()
    whole, frames = registry.get("replay", "memmap"), registry.get("replay", "prioritized")
    huge = _image_samples(1_000_000)
    why = profile.footprint_refusal(whole, huge)
    assert why.startswith("stores each transition whole (56,") and "the job's buffer of 1,000,000 transitions" in why
    assert "a memory that stores frames once holds it" in why
    assert profile.footprint_refusal(frames, huge) == ""  # about one 7 KB frame a transition: 7 GB
    assert profile.footprint_refusal(whole, _image_samples(10_000)) == ""  # 565 MB
    refusal = profile._refusal(profile.Job.parse("dqn:ALE/Breakout-v5"), registry, compute="fpga")
    assert "has image observations, which dqn learns with a convolutional network" in refusal
    assert profile._refusal(profile.Job.parse("dqn:ALE/Breakout-v5"), registry, compute="cpu") == ""


def test_the_replay_node_is_timed_with_atari_sized_messages_and_pushes_no_more_than_a_run_would():
    import numpy as np

    samples = _image_samples(100_000, rows=128)
    inputs = profile.NodeInputs(samples.rows(128), [np.zeros((1_686_180,), np.float32)], 32, 100_000, frames=4)
    figures = profile.measure_replay_node(inputs, "shm", "in-network", rounds=10)
    assert all(math.isfinite(figures[k]) and figures[k] > 0 for k in ("insert_rtt_us", "fetch_rtt_us",
                                                                      "push_round_us", "push_ready_us"))
    assert figures["node"]["batch_us"] > 0  # 1.1 MB batches of stacked frames, pushed to a learner that kept up


# an image job's profile: a real `rlbench profile --job dqn:ALE/Breakout-v5` on the 2-core VM (docs/planner.md
# says when, and how busy the host was), its host renamed and each calibration setting's list of runs left out
ATARI_PROFILE = Path(__file__).parent / "plan_profiles" / "atari.json"
ATARI_HOST = "atari-0000000000"
ATARI = profile.Job.parse("dqn:ALE/Breakout-v5")


def atari(host: str = ATARI_HOST) -> dict:
    document = json.loads(ATARI_PROFILE.read_text())
    entry = document["hosts"].pop(ATARI_HOST)
    entry["host"] = host
    document["hosts"][host] = entry
    return document


def atari_plan(**options):
    return planner.make_plan(ATARI, atari(), this_host=ATARI_HOST, allow_contended=True, **options)


def test_an_image_job_is_ranked_on_what_can_run_it_and_the_rest_is_left_out_with_the_reason():
    plan = atari_plan(max_actors=2)
    assert plan.schedule == Schedule(batch_size=32, train_every=4, publish_every=50, learning_starts=80_000)
    assert {row.mapping.compute for row in plan.rows} == {"cpu"}  # the only backend here that runs a CNN
    assert {row.mapping.replay for row in plan.rows} <= {"prioritized", "uniform"}  # frames stored once
    assert "convolutional network" in plan.excluded["compute fpga"]
    for memory in ("fpga", "memmap"):  # a 56 KB transition stored whole, a million of them
        assert plan.excluded[f"replay {memory}"].startswith("stores each transition whole")
    assert plan.default is not None and plan.default.mapping.placement == "local"
    assert all(row.prediction.env_steps_per_s > 0 for row in plan.rows)


def test_an_image_jobs_bytes_bound_its_link_at_each_transports_measured_stream_rate():
    document = atari()
    entry, figures = document["hosts"][ATARI_HOST], job_figures(document, ATARI, ATARI_HOST)
    schedule = model.Schedule(batch_size=32, train_every=4, publish_every=50)
    mapping = Mapping("dqn", "ALE/Breakout-v5", "cpu", placement="server", replay="prioritized", transport="shm")
    link = model.link_terms(mapping, figures, schedule, entry["transports"])
    messages = figures["messages"]
    shm = {case["size"]: case["mb_per_s"] for case in entry["transports"]["shm"]["cases"]}
    out = {term.name: term.us for term in link["out of the node"]}
    assert out["batches"] == pytest.approx(messages["batch"] / shm[messages["batch"]] / 4)  # one batch per 4 steps
    fetched = min(1.0, 128 / (4 * 50)) / 128  # an actor fetches weights after 64 % of its INSERTs
    assert out["weights fetched"] == pytest.approx(messages["weights"] / shm[messages["weights"]] * fetched)
    into = {term.name: term.us for term in link["into the node"]}
    assert into["INSERTs"] == pytest.approx(messages["insert"] / shm[messages["insert"]] / 128)
    # loopback streams gigabytes a second: the link does not bind here ...
    prediction = model.predict(mapping, figures, entry, schedule, MODELLED)
    assert "link" not in prediction.bottleneck and prediction.bounds["shm link out of the node"] > 10 * \
        prediction.env_steps_per_s
    # ... but a transport that streamed 1,000 times slower would carry a few batches a second
    for case in entry["transports"]["shm"]["cases"]:
        case["mb_per_s"] /= 1000
    slow = model.predict(mapping, figures, entry, schedule, MODELLED)
    assert slow.bottleneck.startswith("shm link out of the node: batches")
    assert slow.env_steps_per_s == pytest.approx(1e6 / (1000 * sum(out.values())))
    cartpole = handmade()  # a vector job's profile streamed no size near its messages: no link bound, as before
    assert model.link_terms(dqn_mapping(placement="server", transport="shm"), job_figures(cartpole),
                            schedule, cartpole["hosts"][HOST]["transports"]) == {"into the node": [],
                                                                                 "out of the node": []}


def test_a_memory_of_whole_stacks_waits_for_its_larger_batches_at_the_transports_rate():
    document = atari()
    entry, figures = document["hosts"][ATARI_HOST], job_figures(document, ATARI, ATARI_HOST)
    schedule = model.Schedule(batch_size=32, train_every=4, publish_every=50)
    mapping = Mapping("dqn", "ALE/Breakout-v5", "cpu", placement="server", replay="uniform", transport="tcp")
    before = model.predict(mapping, figures, entry, schedule, MODELLED)
    uniform = figures["replay"]["uniform"]
    uniform["batch_bytes"] = round(uniform["batch_bytes"] * 8 / 5)  # obs and next_obs whole: 8 frames a row, not 5
    after = model.predict(mapping, figures, entry, schedule, MODELLED)
    extra = model.stream_us(entry["transports"], "tcp", uniform["batch_bytes"]) - \
        model.stream_us(entry["transports"], "tcp", figures["replay"]["prioritized"]["batch_bytes"])
    waits = [{t.name: t.us for t in p.learner_terms}["waiting for the replay node"] for p in (before, after)]
    assert extra > 0 and waits[1] - waits[0] == pytest.approx(extra / 4)  # per env step: one batch per 4


def test_an_image_jobs_calibration_trains_every_four_steps_and_keeps_its_runs_short():
    figures = job_figures(atari(), ATARI, ATARI_HOST)
    assert profile.calibration_train_every(ATARI, figures) == 4  # a CNN update outweighs an actor's step many times
    local = figures["calibration"]["local"]
    assert local["train_every"] == 4
    settings = profile.calibration_settings(ATARI, figures, atari()["hosts"][ATARI_HOST]["transports"],
                                            rlbench.get_registry(), calibrate=("shm",), cores=2)
    for setting in settings:
        learning_starts, steps, lead = profile._calibration_budget(ATARI, figures, setting, 2)
        assert learning_starts <= profile.CALIBRATION_WARM_UP_STEPS < 80_000  # never the preset's warm-up
        window = (steps - learning_starts - lead) * (1 - measure.SETTLE)
        assert window >= min(profile.SPLIT_STEADY_STEPS, profile.CALIBRATION_EPISODES * figures["episode_steps"]) - 1
    # the local pair, read at k = 4 and at the actor-heavy run's k: 1 / X_i = s + u / k_i
    heavy = figures["calibration"]["local/actor-heavy"]
    costs = model.local_costs(figures)
    for run in (local, heavy):
        assert 1e6 / run["env_steps_per_s"] == pytest.approx(costs.step + costs.update / run["train_every"])


def test_plan_command_ranks_mappings_for_an_atari_job(tmp_path):
    from click.testing import CliRunner

    from rlbench.plan.cli import plan_command

    here = profile.this_host_key()
    path = tmp_path / "atari.json"
    path.write_text(json.dumps(atari(here)))
    result = CliRunner().invoke(plan_command, ["--env", "ALE/Breakout-v5", "--profile", str(path), "--no-out",
                                               "--allow-contended", "--top", "5"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("rlbench plan: dqn on ALE/Breakout-v5") and "schedule: batch 32, train every 4" in \
        result.output
    assert "compute fpga: ALE/Breakout-v5 has image observations" in result.output
