"""What the Airflow UI shows of the stream job: ``check_stream``'s XComs
``stream_summary`` and ``stream_state`` (adpipe.orchestration.stream_supervisor),
published whether the check passes or fails, from the same health the
supervisor acts on."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.unit.orchestration.stream_health import health as _health
from tests.unit.orchestration.stream_health import unit_settings as _settings


def test_the_stream_state_the_ui_shows_names_the_drivers_batch_watermark_and_lag() -> None:
    import socket

    from adpipe.orchestration.stream_supervisor import stream_state

    now = 1_800_000_000.0
    state = stream_state(_health(pid=41, host="worker-1", standby_pids=[42], last_batch=17, heartbeat_age_s=4.26,
                                 watermark_ms=1_764_000_000_000, lag=12, lag_s=7.44, restarts_in_window=1), now)
    assert state == {
        "state": "alive",
        "summary": state["summary"],
        "job_id": "unit",
        "active_driver": {"pid": 41, "host": "worker-1", "seen_by": "process"},
        "standby_drivers": [{"pid": 42, "host": socket.gethostname()}],
        "last_batch": 17,
        "last_batch_age_s": 4.3,
        "watermark": "2025-11-24T16:00:00Z",
        "lag_records": 12,
        "lag_oldest_s": 7.4,
        "restarts_in_window": 1,
        "last_failover": None,
        "checked_at": "2027-01-15T08:00:00Z",
    }
    assert state["summary"].startswith(
        "stream unit: alive (process, pid 41 on worker-1; standby pid 42); last batch 17 4s ago "
        "(watermark 2025-11-24T16:00:00Z); lag 12 records, the oldest 7 s; restarts in window 1")
    down = stream_state(_health(alive=False, how="down", pid=None, last_batch=None, heartbeat_age_s=None,
                                watermark_ms=None), now)
    assert (down["state"], down["active_driver"], down["standby_drivers"], down["watermark"]) == (
        "down", None, [], None)
    assert stream_state(_health(stalled=True, lag=5), now)["state"] == "stalled"


def test_check_publishes_the_stream_state_before_a_breach_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.orchestration import stream_supervisor
    from adpipe.orchestration.stream_supervisor import StreamAlertError, check

    pushed: list[tuple[str, dict]] = []
    ti = SimpleNamespace(xcom_push=lambda key, value: pushed.append((key, value)))
    settings = _settings(tmp_path, ADPIPE_STREAM_MAX_LAG="100")
    monkeypatch.setattr(stream_supervisor, "inspect", lambda _s: _health(pid=41, lag=3))
    assert check(settings, ti)["pid"] == 41
    monkeypatch.setattr(stream_supervisor, "inspect", lambda _s: _health(alive=False, how="down", pid=None))
    with pytest.raises(StreamAlertError, match="stream unit is down"):
        check(settings, ti)
    assert [key for key, _value in pushed] == ["stream_summary", "stream_state"] * 2
    assert [(value["state"], value["lag_records"]) for key, value in pushed if key == "stream_state"] == [
        ("alive", 3), ("down", 0)]
    assert pushed[2][1].startswith("stream unit: down (down, pid None; no standby); last batch 3 ")


def test_a_live_driver_is_on_the_host_its_leadership_group_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe import kafka_io
    from adpipe.orchestration.stream_supervisor import inspect
    from adpipe.stream import leadership

    settings = _settings(tmp_path)
    monkeypatch.setattr(kafka_io, "stream_commits", lambda _settings: {0: (5, "")})
    monkeypatch.setattr(kafka_io, "stream_lag", lambda _settings, _commits: {0: 0})
    group: list[leadership.Driver] = []
    monkeypatch.setattr(leadership, "drivers", lambda _settings, timeout_s=10.0: list(group))
    down = inspect(settings)
    assert (down.alive, down.host) == (False, None)  # down: nowhere
    group.extend([leadership.Driver("worker-2", 4711, True), leadership.Driver("worker-3", 815, False)])
    led = inspect(settings)
    assert (led.alive, led.how, led.host) == (True, "leader", "worker-2")
    assert led.pid is None  # another host's pid is not this host's process


def test_a_fresh_heartbeat_without_a_driver_is_a_stream_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``--available-now`` run that ended a minute ago left a fresh
    heartbeat; no driver is in the job's group and the supervisor started
    none: the job is down, and the start task starts it."""
    import json
    import time

    from adpipe import kafka_io
    from adpipe.orchestration.stream_supervisor import inspect
    from adpipe.stream import leadership, liveness

    settings = _settings(tmp_path, ADPIPE_STREAM_STALL_S="300")
    beat = liveness.heartbeat_path(settings)
    beat.parent.mkdir(parents=True)
    beat.write_text(json.dumps({"job_id": "unit", "batch_id": 1, "at": time.time() - 60, "watermark_ms": 0}))
    monkeypatch.setattr(kafka_io, "stream_commits", lambda _settings: {0: (5, "")})
    monkeypatch.setattr(kafka_io, "stream_lag", lambda _settings, _commits: {0: 0})
    group: list[leadership.Driver] = []
    monkeypatch.setattr(leadership, "drivers", lambda _settings, timeout_s=10.0: list(group))
    ended = inspect(settings)
    assert (ended.alive, ended.how, ended.needs_start, ended.last_batch) == (False, "down", True, 1)
    assert 55 < ended.heartbeat_age_s < 120
    group.append(leadership.Driver(socket.gethostname(), 4242, True))  # one started by hand, here
    by_hand = inspect(settings)
    assert (by_hand.alive, by_hand.how, by_hand.pid, by_hand.needs_start) == (True, "leader", 4242, False)


def test_a_driver_on_another_host_is_stalled_by_how_long_its_input_waited_and_left_to_that_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This host's heartbeat and polls say nothing of a driver elsewhere:
    lag alone is normal work; input waiting past ADPIPE_STREAM_STALL_S is a
    stall, which check_stream alerts and the start task leaves alone (a
    driver started here would be refused)."""
    from adpipe import kafka_io
    from adpipe.orchestration import stream_supervisor
    from adpipe.orchestration.stream_supervisor import StreamAlertError, StreamStartOperator, check, inspect
    from adpipe.stream import leadership

    settings = _settings(tmp_path, ADPIPE_STREAM_STALL_S="300")
    waited = {"s": 20.0}
    monkeypatch.setattr(kafka_io, "stream_commits", lambda _settings: {0: (5, "")})
    monkeypatch.setattr(kafka_io, "stream_lag", lambda _settings, _commits: {0: 40})
    monkeypatch.setattr(kafka_io, "stream_lag_seconds", lambda *_args: waited["s"])
    monkeypatch.setattr(leadership, "drivers",
                        lambda _settings, timeout_s=10.0: [leadership.Driver("worker-elsewhere", 4711, True)])
    busy = inspect(settings)
    assert (busy.alive, busy.how, busy.host, busy.stalled) == (True, "leader", "worker-elsewhere", False)
    assert check(settings)["lag"] == 40
    waited["s"] = 301.0
    stuck = inspect(settings)
    assert (stuck.alive, stuck.stalled, stuck.pid) == (True, True, None)
    with pytest.raises(StreamAlertError, match="stalled on worker-elsewhere: records waiting 301 s"):
        check(settings)

    monkeypatch.setenv("ADPIPE_HOME", str(tmp_path))
    monkeypatch.setenv("ADPIPE_JOB_ID", "unit")
    monkeypatch.setattr(stream_supervisor, "inspect", lambda _s: stuck)
    operator = StreamStartOperator(task_id="start_stream_if_down")
    started: list[str] = []
    monkeypatch.setattr(operator, "_start", lambda *args: started.append(args[2]))
    monkeypatch.setattr(stream_supervisor, "stop_stream", lambda pid: pytest.fail(f"stopped pid {pid}"))
    pushed: list[tuple[str, object]] = []
    ti = SimpleNamespace(xcom_push=lambda key, value: pushed.append((key, value)))
    assert operator.execute({"ti": ti}) == 0
    assert started == []
    import socket

    assert pushed == [("host", socket.gethostname())]


def test_the_stream_is_started_when_a_driver_leads_on_any_host_and_another_hosts_start_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from adpipe.orchestration.stream_supervisor import StreamStartError, record_start, stream_started
    from adpipe.stream import leadership

    settings = _settings(tmp_path)
    leading: list[leadership.Driver] = []
    monkeypatch.setattr(leadership, "leader_or_none", lambda _settings: leading[0] if leading else None)
    # Started on another worker's host: nothing of it here; wait (the sensor's timeout bounds it).
    assert stream_started(settings, "worker-elsewhere") is False
    leading.append(leadership.Driver("worker-elsewhere", 4711, True))
    assert stream_started(settings, "worker-elsewhere") is True
    assert stream_started(settings, socket.gethostname()) is True  # a standby elsewhere took over: alive
    leading.clear()
    # Started here, and that process is gone, with no leader anywhere: the start failed.
    log_path = tmp_path / "stream.log"
    log_path.write_text("spark-submit: no such master\n")
    record_start(settings, 2**22 + 7, log_path)
    with pytest.raises(StreamStartError, match="no such master"):
        stream_started(settings, socket.gethostname())
