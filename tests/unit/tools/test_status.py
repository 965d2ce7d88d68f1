"""``adpipe status`` (adpipe.tools.status): its pure parts. A real Spark
checkpoint (tests/data/stream_checkpoint: batch 9 started, never committed)
read as the stream row reads it, the stream row judged from a real lock,
the command lines taken for the budget service, the table, and the deadline
that keeps a silent probe from hanging the command. The servers' rows are
checked against real servers in tests/integration/test_status.py."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from adpipe.settings import Settings, load_settings
from adpipe.stream.leadership import Driver
from adpipe.tools import status
from adpipe.tools.status import DEGRADED, DOWN, UNKNOWN, UP, Component

REAL_CHECKPOINT = Path(__file__).parents[2] / "data" / "stream_checkpoint"
NOW = 1_795_553_500.0  # 2026-11-24T20:51:40Z
COMMITTED_AT = NOW - 90  # commits/8 written 90 s before NOW


def _settings(tmp_path: Path, **env: str) -> Settings:
    return load_settings({"ADPIPE_HOME": str(tmp_path / "home"), "ADPIPE_JOB_ID": "region-local", **env})


def _lay_out_checkpoint(settings: Settings, started_s_before_now: float = 30.0) -> Path:
    """The real checkpoint where the settings put it, its entries written
    at known times: commits/8 at COMMITTED_AT, offsets/9 (the uncommitted
    batch) ``started_s_before_now`` before NOW."""
    root = settings.checkpoint_dir
    shutil.copytree(REAL_CHECKPOINT, root, ignore=shutil.ignore_patterns("README.md"))
    os.utime(root / "commits" / "8", (COMMITTED_AT, COMMITTED_AT))
    os.utime(root / "offsets" / "9", (NOW - started_s_before_now, NOW - started_s_before_now))
    return root


def test_a_real_checkpoint_gives_its_last_committed_batch_and_the_one_started_after_it(tmp_path: Path) -> None:
    root = _lay_out_checkpoint(_settings(tmp_path), started_s_before_now=30)
    progress = status.checkpoint_progress(root)
    assert progress is not None
    assert (progress.last_committed, progress.newest_planned, progress.uncommitted) == (8, 9, 9)
    assert progress.committed_at == COMMITTED_AT
    assert progress.planned_at == NOW - 30
    # adpipe/progress/8 and offsets/8: the watermark batch 8 ran with, and where it stopped reading.
    assert progress.watermark_ms == 1795349369980
    assert progress.end_offsets == {0: 6343, 1: 6299, 2: 6126, 3: 6232}


def test_a_checkpoint_whose_newest_batch_is_committed_has_nothing_uncommitted(tmp_path: Path) -> None:
    root = _lay_out_checkpoint(_settings(tmp_path))
    (root / "offsets" / "9").unlink()
    progress = status.checkpoint_progress(root)
    assert progress is not None and (progress.last_committed, progress.uncommitted) == (8, None)


def test_no_checkpoint_or_one_without_a_commit(tmp_path: Path) -> None:
    assert status.checkpoint_progress(tmp_path / "absent") is None
    fresh = tmp_path / "fresh"
    (fresh / "offsets").mkdir(parents=True)
    shutil.copy(REAL_CHECKPOINT / "offsets" / "0", fresh / "offsets" / "0")  # batch 0 started, the job died
    progress = status.checkpoint_progress(fresh)
    assert progress is not None
    assert (progress.last_committed, progress.committed_at, progress.uncommitted) == (None, None, 0)


def test_a_stream_job_nobody_runs_is_down_with_its_last_batch_and_the_batch_in_doubt(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    _lay_out_checkpoint(settings)
    row = status.stream_component(settings, kafka_up=False, now=NOW)
    assert row.state == DOWN
    assert row.address == f"file://{settings.checkpoint_dir}"
    assert row.detail == (
        "not running; last batch 8 at 2026-11-24T20:50:10Z (90 s ago); "
        "batch 9 started, not committed: replayed at the next start; lag unknown (the broker does not answer)"
    )
    assert row.facts["last_batch"] == 8 and row.facts["uncommitted_batch"] == 9 and row.facts["lag"] is None


def _leading(monkeypatch: pytest.MonkeyPatch, *drivers: Driver) -> None:
    """The job's leadership group as given (the brokers' answer is the one input faked)."""
    from adpipe.tools import status_stream

    monkeypatch.setattr(status_stream, "_drivers", lambda _settings, _kafka_up: list(drivers))


HERE = socket.gethostname()


def test_a_driver_leading_the_job_is_the_running_job_and_a_batch_running_too_long_is_stalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path, ADPIPE_STREAM_STALL_S="300")
    _lay_out_checkpoint(settings, started_s_before_now=30)
    _leading(monkeypatch, Driver(HERE, os.getpid(), True))  # this process leads the job
    row = status.stream_component(settings, kafka_up=False, now=NOW)
    assert (row.state, row.facts["pid"]) == (UP, os.getpid())
    assert row.detail.startswith(f"pid {os.getpid()}; last batch 8 at ")
    assert "batch 9 running for 30 s" in row.detail
    os.utime(settings.checkpoint_dir / "offsets" / "9", (NOW - 301, NOW - 301))
    stalled = status.stream_component(settings, kafka_up=False, now=NOW)
    assert stalled.state == DEGRADED and "batch 9 stalled: running for 301 s" in stalled.detail
    _leading(monkeypatch)
    assert status.stream_component(settings, kafka_up=False, now=NOW).state == DOWN  # nobody leads
    _leading(monkeypatch, Driver("host-b", 77, True))  # another host's driver leads
    row = status.stream_component(settings, kafka_up=False, now=NOW)
    assert row.state == UP and row.detail.startswith("led by pid 77 on host-b; last batch 8 at ")
    assert (row.facts["pid"], row.facts["driver"]) == (None, {"host": "host-b", "pid": 77})


def test_with_the_lag_known_the_stream_row_is_stalled_by_the_supervisors_own_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row says stalled exactly when the supervisor would restart the
    job (liveness.input_stalled): input waiting, and neither a finished batch
    nor a poll for ADPIPE_STREAM_STALL_S since the job started. The broker's
    answer (the lag) is the one input given here."""
    from adpipe import kafka_io
    from adpipe.kafka_io import ledger
    from adpipe.stream import liveness

    settings = _settings(tmp_path, ADPIPE_STREAM_STALL_S="300")
    lag = {0: 500, 1: 0}
    monkeypatch.setattr(kafka_io, "stream_lag", lambda _settings, _commits, timeout_s=None: dict(lag))
    started = liveness.process_started_at(os.getpid())
    assert started is not None and abs(started - time.time()) < 3600  # this process: the job, as the lock says
    now = started + 1000
    # The oldest waiting record: the first one after the job's committed offset, of a partition with lag.
    monkeypatch.setattr(kafka_io, "stream_commits", lambda _settings, timeout_s=None: {0: (1000, ""), 1: (7, "")})
    asked: list[dict[int, int]] = []
    monkeypatch.setattr(ledger, "first_timestamps", lambda _kafka, _topic, starts, timeout_s=None: (
        asked.append(dict(starts)) or {p: int((now - 42) * 1000) for p in starts}))

    def beat(at: float) -> None:
        path = liveness.heartbeat_path(settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"job_id": "region-local", "batch_id": 9, "at": at, "watermark_ms": 0}))

    _leading(monkeypatch, Driver(HERE, os.getpid(), True))
    beat(now - 350)
    liveness.mark_polled(settings, now - 320)
    row = status.stream_component(settings, kafka_up=True, now=now)
    assert row.state == DEGRADED and row.facts["stalled"] and row.facts["lag"] == 500
    assert "lag 500 records, the oldest 42 s" in row.detail and row.facts["lag_s"] == 42
    assert asked[-1] == {0: 1000}
    assert "stalled: input waits and no batch finished nor poll for over 300 s" in row.detail
    liveness.mark_polled(settings, now - 10)  # Spark reported progress or idling 10 s ago
    assert status.stream_component(settings, kafka_up=True, now=now).state == UP
    liveness.mark_polled(settings, now - 320)
    lag[0] = 0  # nothing waits: quiet is not stalled
    assert status.stream_component(settings, kafka_up=True, now=now).state == UP
    lag[0] = 500  # a job started (by hand) 100 s ago, its last heartbeat an older run's
    row = status.stream_component(settings, kafka_up=True, now=started + 100)
    assert (row.state, row.facts["stalled"]) == (UP, False)
    _leading(monkeypatch)
    assert status.stream_component(settings, kafka_up=True, now=now).state == DOWN  # nobody runs it


def test_without_a_checkpoint_the_heartbeat_names_the_last_batch(tmp_path: Path) -> None:
    settings = _settings(tmp_path, ADPIPE_CHECKPOINT_URI="s3a://bucket/checkpoints")
    beat = settings.home / "stream" / "region-local" / "heartbeat.json"
    beat.parent.mkdir(parents=True)
    beat.write_text('{"job_id": "region-local", "batch_id": 17, "at": %f, "watermark_ms": 0}' % (NOW - 7))
    row = status.stream_component(settings, kafka_up=False, now=NOW)
    assert row.state == DOWN and row.address == "s3a://bucket/checkpoints/region-local"
    assert "last batch 17 at 2026-11-24T20:51:33Z (7 s ago)" in row.detail


@pytest.mark.parametrize(
    ("argv", "is_service"),
    [
        (["/work/main/.venv/bin/python3", "/work/main/.venv/bin/adpipe", "budget"], True),
        (["/usr/bin/python3", "-m", "adpipe", "-v", "budget", "--once", "--timeout", "30"], True),
        (["/work/main/.venv/bin/adpipe", "budget"], True),
        (["python", "-m", "adpipe", "budget", "report", "--json"], False),
        (["python", "-m", "adpipe", "budget", "prices", "--file", "p.csv"], False),
        (["python", "-m", "adpipe", "stream"], False),
        (["python", "/tmp/budget.py", "adpipe", "budget"], False),  # "adpipe" only as a later argument
        ([""], False),
    ],
)
def test_which_command_lines_are_the_budget_service(argv: list[str], is_service: bool) -> None:
    assert status.is_budget_service(argv) is is_service


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s ago"), (119, "119 s ago"), (120, "2 min ago"), (7300, "2 h ago"), (3 * 86400, "3 d ago")],
)
def test_ago(seconds: float, text: str) -> None:
    assert status.ago(seconds) == text


def test_the_table_aligns_its_columns_and_shows_the_first_log_of_several() -> None:
    rows = [
        Component("kafka", UP, "127.0.0.1:9092", "pid 42", ("/h/kafka/broker.log",)),
        Component("postgres", DOWN, "127.0.0.1:5433", "not running (adpipe pg up)"),
        Component("spark", UP, "spark://127.0.0.1:7077", "2 of 2 workers", ("/h/master.log", "/h/w1.log", "/h/w2.log")),
    ]
    assert status.format_table(rows).splitlines() == [
        "COMPONENT  STATE  ADDRESS                 DETAIL                      LOG",
        "kafka      up     127.0.0.1:9092          pid 42                      /h/kafka/broker.log",
        "postgres   down   127.0.0.1:5433          not running (adpipe pg up)  -",
        "spark      up     spark://127.0.0.1:7077  2 of 2 workers              /h/master.log (+2)",
    ]


def test_the_json_report_lists_every_log_and_says_whether_the_home_exists(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    rows = [Component("spark", UP, "spark://x", "d", ("/a.log", "/b.log"), {"workers": 2})]
    report = status.report(settings, rows, now=NOW)
    assert report == {
        "checked_at": "2026-11-24T20:51:40Z",
        "adpipe_home": str(settings.home),
        "home_exists": False,
        "components": [
            {
                "name": "spark",
                "state": "up",
                "address": "spark://x",
                "detail": "d",
                "logs": ["/a.log", "/b.log"],
                "facts": {"workers": 2},
            }
        ],
    }


def test_a_probe_that_hangs_or_fails_is_an_unknown_row_and_the_others_are_kept() -> None:
    release = threading.Event()

    def hangs() -> Component:
        release.wait(30)
        return Component("kafka", UP)

    def fails() -> Component:
        raise ConnectionRefusedError("refused on 127.0.0.1:1")

    started = time.monotonic()
    try:
        rows = status.run_bounded(
            {"kafka": hangs, "postgres": fails, "airflow": lambda: Component("airflow", DOWN, "http://x")},
            {"kafka": "127.0.0.1:9092", "postgres": "127.0.0.1:5433"},
            timeout_s=0.5,
        )
    finally:
        release.set()
    assert time.monotonic() - started < 5
    assert rows == [
        Component("kafka", UNKNOWN, "127.0.0.1:9092", "no answer within 0.5 s"),
        Component("postgres", UNKNOWN, "127.0.0.1:5433", "the probe failed: refused on 127.0.0.1:1"),
        Component("airflow", DOWN, "http://x"),
    ]


def test_the_status_verb_is_wired_with_json() -> None:
    from adpipe.cli import build_parser
    from adpipe.tools.cli import cmd_status

    args = build_parser().parse_args(["status", "--json"])
    assert args.func is cmd_status and args.json


def test_the_stream_row_names_the_leader_the_standbys_on_any_host_and_the_last_failover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a standby took over: the group names the driver that leads
    (333, here), a standby here (222) and one on another host, and
    failover.json says what happened."""
    from adpipe.stream import liveness

    settings = _settings(tmp_path)
    _lay_out_checkpoint(settings)
    _leading(monkeypatch, Driver(HERE, 333, True), Driver(HERE, 222, False), Driver("host-b", 9, False))
    failover = liveness.failover_path(settings)
    failover.parent.mkdir(parents=True, exist_ok=True)
    failover.write_text(json.dumps({"at": NOW - 60, "pid": 333, "reason": "pid 111 on h left the group",
                                    "batch_id": 5, "seconds": 7.4}))
    row = status.stream_component(settings, kafka_up=False, now=NOW)
    assert row.state == UP and row.facts["pid"] == 333 and row.facts["standby_pids"] == [222]
    assert row.facts["standbys"] == [{"host": HERE, "pid": 222}, {"host": "host-b", "pid": 9}]
    assert row.detail.startswith(f"pid 333; standby pid 222 on {HERE}, pid 9 on host-b (takes over when it ends); "
                                 "last failover at ")
    assert "pid 111 on h left the group, next batch 7.4 s after" in row.detail


def test_after_a_demo_the_stream_row_describes_the_demos_job_until_the_homes_own_runs(tmp_path: Path) -> None:
    from adpipe.settings import isolated_env

    settings = _settings(tmp_path)
    demo = load_settings({"ADPIPE_HOME": str(tmp_path / "home"), **isolated_env("demo-20261126")})
    _lay_out_checkpoint(demo)  # the demo's job committed batch 8
    (settings.home / "demo").mkdir(parents=True)
    (settings.home / "demo" / "latest.json").write_text(
        json.dumps({"run_id": "20261126", "env": isolated_env("demo-20261126")})
    )
    rows = {row.name: row for row in status.collect(settings, stage_timeout_s=20)}
    stream = rows["stream"]
    assert stream.address == demo.checkpoint_uri
    assert stream.detail.startswith(
        "the last demo's job demo-20261126 (job region-local never ran here): not running; last batch 8 at "
    )
    assert stream.facts["job_id"] == "demo-20261126" and stream.facts["last_batch"] == 8
    _lay_out_checkpoint(settings)  # the home's own job ran: its row again
    own = {row.name: row for row in status.collect(settings, stage_timeout_s=20)}["stream"]
    assert own.facts["job_id"] == "region-local" and "described" not in own.facts
