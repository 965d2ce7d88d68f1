"""adpipe.tools.container_health: the stream container is healthy while a
driver in it leads the job (its leadership group), the standby's while one
waits to lead or leads; the budget's while its group has a member."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from adpipe.settings import load_settings
from adpipe.stream import leadership
from adpipe.stream.leadership import Driver
from adpipe.tools.container_health import budget_health, main, standby_health, stream_health

HERE = socket.gethostname()


def _group(monkeypatch: pytest.MonkeyPatch, *drivers: Driver) -> None:
    monkeypatch.setattr(leadership, "drivers", lambda _settings, timeout_s=10.0: list(drivers))


def test_stream_is_healthy_while_a_driver_of_this_container_leads(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_JOB_ID": "health-test"})
    _group(monkeypatch)
    assert stream_health(settings) == (False, "stream health-test: no driver in this container leads the job")
    _group(monkeypatch, Driver(HERE, 41, True))
    assert stream_health(settings) == (True, f"stream health-test: pid 41 on {HERE} leads the job")
    _group(monkeypatch, Driver("another-container", 41, True), Driver(HERE, 42, False))
    assert stream_health(settings)[0] is False  # the job is led, but not from here
    monkeypatch.setenv("ADPIPE_JOB_ID", "health-test")
    assert main(["stream"]) == 1


def test_the_standby_is_healthy_while_it_waits_to_lead_or_leads(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_JOB_ID": "health-test"})
    _group(monkeypatch, Driver("another-container", 41, True))
    assert standby_health(settings)[0] is False  # neither waiting nor leading here
    _group(monkeypatch, Driver("another-container", 41, True), Driver(HERE, 42, False))
    assert standby_health(settings) == (True, f"stream health-test: standby pid 42 on {HERE} waits to lead the job")
    _group(monkeypatch, Driver(HERE, 42, True))  # it took over
    assert standby_health(settings) == (True, f"stream health-test: pid 42 on {HERE} leads the job")


def test_budget_is_unhealthy_when_the_broker_does_not_answer() -> None:
    settings = load_settings({"ADPIPE_KAFKA_BOOTSTRAP": "127.0.0.1:1"})  # nothing listens on port 1
    started = time.monotonic()
    healthy, why = budget_health(settings, timeout_s=2.0)
    assert not healthy and "adpipe-budget" in why
    assert time.monotonic() - started < 10  # within the healthcheck's own timeout
