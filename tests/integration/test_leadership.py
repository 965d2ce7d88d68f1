"""One stream driver leads a job, whatever host it runs on: membership of
the job's leadership group (adpipe.stream.leadership), with a real broker
and real processes that only hold the leadership (no Spark). A second
driver is refused naming the leader; a standby takes over from a leader
SIGKILLed (its session expires) or SIGSTOPped, and the stopped one, resumed,
finds its leadership lost and exits fenced (4); a leader that stops cleanly
hands over at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import pytest
from adpipe.settings import load_settings
from adpipe.stream import leadership
from confluent_kafka import KafkaException

from tests.integration.helpers import BROKER_ENV

HOLDER = (
    "import sys, time\n"
    "from adpipe.settings import load_settings\n"
    "from adpipe.stream.leadership import CheckpointInUseError, leadership\n"
    "try:\n"
    "    with leadership(load_settings(), standby=sys.argv[1] == 'standby') as took_over:\n"
    "        print('leading', took_over, flush=True)\n"
    "        sys.stdin.read()\n"
    "except CheckpointInUseError as exc:\n"
    "    print('refused', exc, flush=True)\n"
    "    sys.exit(4)\n"
)


@pytest.fixture
def job(broker) -> dict[str, str]:  # noqa: ANN001
    return {**BROKER_ENV, "ADPIPE_JOB_ID": f"lead-{uuid.uuid4().hex[:8]}"}


def _holder(env: dict[str, str], role: str) -> subprocess.Popen:
    import os

    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", HOLDER, role], env={**os.environ, **env}, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _leader_pid(env: dict[str, str]) -> int | None:
    try:
        current = leadership.leader(load_settings(env))
    except KafkaException:  # not described this time (a loaded broker): asked again
        return None
    return current.pid if current is not None else None


def _members(env: dict[str, str]) -> int:
    try:
        return len(leadership.drivers(load_settings(env)))
    except KafkaException:
        return -1


def _wait(what: str, condition, timeout_s: float) -> float:  # noqa: ANN001
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)
    return time.monotonic() - started


def test_one_driver_leads_a_standby_takes_over_a_dead_or_frozen_one_and_the_frozen_one_stops(job) -> None:  # noqa: ANN001
    lease_s = load_settings(job).stream_lease_s
    first = _holder(job, "active")
    processes = [first]
    try:
        assert first.stdout.readline().split() == ["leading", "None"]
        assert _leader_pid(job) == first.pid
        refused = _holder(job, "active")
        assert refused.wait(timeout=60) == 4
        assert f"led by another stream driver (pid {first.pid} on " in refused.stdout.read()

        standby = _holder(job, "standby")
        processes.append(standby)
        _wait("the standby in the group", lambda: _members(job) == 2, 30)
        assert _leader_pid(job) == first.pid  # joining takes nothing from a live leader
        first.kill()
        took = _wait("the standby leading", lambda: _leader_pid(job) == standby.pid, lease_s + 20)
        line = standby.stdout.readline()
        assert line.startswith("leading") and f"pid {first.pid} on " in line and "left the group" in line
        assert took <= lease_s + 10  # the session's expiry and a rebalance

        second = _holder(job, "standby")
        processes.append(second)
        _wait("the second standby in the group", lambda: _members(job) == 2, 30)
        standby.send_signal(signal.SIGSTOP)  # frozen, as a paused VM or a cut-off host
        _wait("the second standby leading", lambda: _leader_pid(job) == second.pid, lease_s + 20)
        standby.send_signal(signal.SIGCONT)
        assert standby.wait(timeout=60) == 4  # its leadership lost: it ends itself, fenced
        assert "fenced: " in standby.stdout.read()

        third = _holder(job, "standby")
        processes.append(third)
        _wait("the third standby in the group", lambda: _members(job) == 2, 30)
        second.stdin.close()  # a clean stop leaves the group: the next leads at once
        assert second.wait(timeout=30) == 0
        handed = _wait("the third standby leading", lambda: _leader_pid(job) == third.pid, 20)
        assert handed < lease_s
    finally:
        for proc in processes:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
