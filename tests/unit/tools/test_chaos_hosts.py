"""``adpipe chaos --hosts``: where a part starts, the spec and its replay,
the failover summary, and the group probe that outlives its child."""

from __future__ import annotations

import os

import pytest
from adpipe.kafka_io.group_probe import GroupProbe
from adpipe.tools.chaos import check, plan
from adpipe.tools.chaos.spread import place
from confluent_kafka import KafkaException


def test_a_part_starts_on_its_own_host_unless_a_peer_runs_there_or_it_is_down() -> None:
    hosts = ["host-1", "host-2", "host-3"]
    assert place("host-2", hosts) == "host-2"
    # Its peer (the active driver) on its own host: another one, in turn.
    assert place("host-2", hosts, avoid=["host-2"], turn=0) == "host-1"
    assert place("host-2", hosts, avoid=["host-2"], turn=1) == "host-3"
    # Its own host cut off or killed (not usable): one away from its peer.
    assert place("host-1", ["host-2", "host-3"], avoid=["host-2"]) == "host-3"
    # Only its peer's host is left: there, rather than nowhere.
    assert place("host-1", ["host-2"], avoid=["host-2"]) == "host-2"
    assert place("host-1", []) is None
    # host-10 sorts after host-9, not after host-1.
    assert [place(None, ["host-10", "host-9", "host-1"], turn=t) for t in range(3)] == ["host-1", "host-9", "host-10"]


def test_hosts_are_two_to_eight_and_the_replay_command_keeps_them_and_the_fault_interval() -> None:
    with pytest.raises(ValueError, match="--hosts 1"):
        plan.ChaosSpec(hosts=1)
    with pytest.raises(ValueError, match="--hosts 9"):
        plan.ChaosSpec(hosts=9)
    spec = plan.ChaosSpec(events=300_000, duration_s=2400, fault_interval_s=10, hosts=3)
    command = plan.replay_command(spec, 77)
    assert command[command.index("--hosts") + 1] == "3"
    assert command[command.index("--fault-interval") + 1] == "10"
    assert "--hosts" not in plan.replay_command(plan.ChaosSpec(), 77)
    # The host kinds are drawn only when the run has hosts to cut or kill.
    kinds = (plan.STREAM_KILL, plan.HOST_CUT, plan.HOST_KILL)
    drawn = {f.kind for f in plan.fault_schedule(5, spec, kinds)}
    assert {plan.HOST_CUT, plan.HOST_KILL} <= drawn
    assert not drawn & set(plan.HOST_KINDS) - set(kinds)
    assert not {f.kind for f in plan.fault_schedule(5, spec, (plan.STREAM_KILL,))} & set(plan.HOST_KINDS)


def test_the_failover_summary_counts_the_injected_faults_that_took_the_active_driver() -> None:
    faults = [
        {"kind": plan.STREAM_KILL, "failover": True, "recovery_s": 4.0},
        {"kind": plan.HOST_KILL, "failover": True, "recovery_s": 20.0},
        {"kind": plan.HOST_CUT, "failover": True, "recovery_s": None},  # not recovered (yet)
        {"kind": plan.HOST_CUT, "failover": False, "recovery_s": 1.0},  # a host without the active driver
        {"kind": plan.STREAM_KILL, "failover": True, "recovery_s": 99.0, "injected": False},
        {"kind": plan.BUDGET_KILL, "recovery_s": 3.0},
        # Recovered with no input waiting (the producer done): counted, not timed.
        {"kind": plan.STREAM_KILL, "failover": True, "recovery_s": 0.5, "recovered_idle": True},
    ]
    summary = check.summarize_failover(faults)
    assert summary == {
        "faults": 4,
        "recovered": 3,
        "idle": 1,
        "recovery_p50_s": 4.0,
        "recovery_p99_s": 20.0,
        "recovery_max_s": 20.0,
    }


def test_the_group_probe_answers_from_a_child_and_starts_a_new_one_when_it_died() -> None:
    # Nothing listens on port 1: the child's question times out, an answer all the same.
    probe = GroupProbe({**os.environ, "ADPIPE_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    try:
        with pytest.raises(KafkaException):
            probe.group_members(None, "adpipe-probe-test", 1.0)
        first = probe.proc
        assert first is not None and first.poll() is None and probe.children == 1
        # The child killed (as librdkafka's abort would end it): an error, then a new child.
        first.kill()
        first.wait()
        with pytest.raises(KafkaException):
            probe.group_members(None, "adpipe-probe-test", 1.0)
        with pytest.raises(KafkaException):
            probe.group_members(None, "adpipe-probe-test", 1.0)
        assert probe.children == 2 and probe.proc is not None and probe.proc.poll() is None
    finally:
        probe.close()
    assert probe.proc is None
