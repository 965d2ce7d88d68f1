"""Re-stamped retries in the tables, on real parts: a broker, a real stream
job, Delta tables on a PostgreSQL metastore, ``adpipe load`` and ``adpipe
verify --hour`` as processes.

A re-stamped retry is a second copy of an ``event_id`` with another
``event_time``: the stream counts the copy it read first and sends the
other to the DLQ (``conflicting_duplicate``). The raw table must hold the
counted copy, the other a quarantine row, whether both copies are loaded
by one run or by two:

* ``one-run``: its first copy (12:52:10) goes to partition 3 and is
  streamed; its second (12:54:10) goes to partition 0 and is streamed
  next. One load reads both: the lowest Kafka position is the copy the
  stream did not count.
* ``two-runs``: its first copy (12:59:20, hour 12) is loaded with hour 12;
  its second (13:01:20, hour 13) arrives later and is loaded with hour 13.

Expectations: the producer's summaries plus the counted copies, counted in
plain Python, and a plain Kafka read of the DLQ."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe import schemas as S
from adpipe.lakehouse import tables as T
from adpipe.settings import Settings
from confluent_kafka import Producer

from tests.integration.helpers import (
    Pipeline,
    dump,
    expected_windows,
    load,
    make_pipeline,
    ok,
    verify_hour,
    warm_env,
)

HOUR = datetime(2026, 11, 18, 12, tzinfo=UTC)
H12, H13 = "2026-11-18T12", "2026-11-18T13"
AD = "ad-000990"
pytestmark = pytest.mark.slow


def _copy(event_id: str, at: datetime) -> bytes:
    return json.dumps({"event_id": event_id, "ad_id": AD, "event_type": "impression",
                       "event_time": f"{at:%Y-%m-%dT%H:%M:%SZ}"}).encode()


def _send_to(p: Pipeline, partition: int, value: bytes) -> str:
    """``value`` to partition ``partition`` of the raw topic; its ``topic/partition/offset``."""
    producer = Producer({"bootstrap.servers": p.settings.kafka_bootstrap, "enable.idempotence": True})
    where: list[str] = []
    producer.produce(p.settings.topics.events, value, AD.encode(), partition=partition,
                     on_delivery=lambda _err, msg: where.append(f"{msg.topic()}/{msg.partition()}/{msg.offset()}"))
    assert producer.flush(30) == 0 and len(where) == 1
    return where[0]


def _stream(p: Pipeline) -> None:
    run = p.stream(max_offsets=5000)
    assert run.returncode == 0, run.log[-3000:]


def _listed(p: Pipeline) -> dict[str, str]:
    """The DLQ's conflicting copies: source -> event id (a plain Kafka read)."""
    return {r.header(S.HEADER_SOURCE): r.header(S.HEADER_EVENT_ID) for r in p.read(p.settings.topics.dlq)
            if r.header(S.HEADER_REASON) == S.REASON_CONFLICTING_DUPLICATE}


def _minute(at: datetime) -> str:
    return f"{at:%Y-%m-%dT%H:%M}:00Z"


@pytest.fixture(scope="module")
def scene(broker: Settings, pg: Settings, tmp_path_factory: pytest.TempPathFactory) -> tuple[Pipeline, dict]:
    workdir = tmp_path_factory.mktemp("restamped")
    p = make_pipeline(
        workdir,
        warm_env({"ADPIPE_HOME": str(workdir / "home"),
                  "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{uuid.uuid4().hex[:8]}"}),
    )
    one, two = f"one-run-{uuid.uuid4().hex[:6]}", f"two-runs-{uuid.uuid4().hex[:6]}"
    copies = {
        "one_first": (one, HOUR + timedelta(minutes=52, seconds=10)),
        "one_second": (one, HOUR + timedelta(minutes=54, seconds=10)),
        "two_first": (two, HOUR + timedelta(minutes=59, seconds=20)),
        "two_second": (two, HOUR + timedelta(minutes=61, seconds=20)),
    }
    first = p.produce(events=300, seed=9201, ads=4, ad_offset=990, minutes=8, start=HOUR + timedelta(minutes=50))
    sources = {name: _send_to(p, 3 if name == "one_first" else 2, _copy(*copies[name]))
               for name in ("one_first", "two_first")}
    _stream(p)
    # The second copy of one-run in a later batch, on a partition before its first's.
    sources["one_second"] = _send_to(p, 0, _copy(*copies["one_second"]))
    second = p.produce(events=300, seed=9202, ads=4, ad_offset=990, minutes=8, start=HOUR + timedelta(minutes=59))
    _stream(p)  # the watermark is past 13:05: hour 12 is closed for good
    assert _listed(p) == {sources["one_second"]: one}, "the stream must list the second copy as conflicting"
    return p, {"summaries": [first, second], "copies": copies, "sources": sources}


def _expected_hour(sent: dict, hour: str, counted: list[str]) -> dict[tuple[str, str], tuple[int, int]]:
    """The hour's windows: the producers' counts plus the counted copies."""
    windows = expected_windows(*sent["summaries"])
    for name in counted:
        key = (AD, _minute(sent["copies"][name][1]))
        impressions, clicks = windows.get(key, (0, 0))
        windows[key] = (impressions + 1, clicks)
    return {k: v for k, v in windows.items() if k[1].startswith(hour)}


def _raw_copies(rows: list[dict], event_id: str) -> list[tuple[str, str]]:
    return [(r["event_time"][:19], f"{r['kafka_topic']}/{r['kafka_partition']}/{r['kafka_offset']}")
            for r in rows if r["event_id"] == event_id]


def test_both_copies_in_one_load_leave_the_counted_one_in_the_raw_table(scene, tmp_path: Path) -> None:  # noqa: ANN001
    p, sent = scene
    ok(load(p.env, "--hour", H12))  # exit 1 if the gate held the hour
    data = dump(p.env, H12)
    one, at_first = sent["copies"]["one_first"]
    assert _raw_copies(data["rows"][T.RAW], one) == [(f"{at_first:%Y-%m-%dT%H:%M:%S}", sent["sources"]["one_first"])]
    quarantined = {(r["event_key"], r["event_id"], r["reason"]) for r in data["rows"][T.QUARANTINE]}
    assert quarantined == {(sent["sources"]["one_second"], one, S.REASON_CONFLICTING_DUPLICATE)}
    windows = {(r["ad_id"], r["window_start"][:19] + "Z"): (r["impressions"], r["clicks"])
               for r in data["rows"][T.AGGREGATES]}
    assert windows == _expected_hour(sent, H12, ["one_first", "two_first"])
    tables = verify_hour(p.env, H12, tmp_path)
    assert tables["ok"], json.dumps(tables)[:3000]
    assert tables["conflicting"]["rows"] == tables["conflicting"]["expected"] == 1


def test_a_second_copy_loaded_by_a_later_run_is_a_quarantine_row_not_a_second_raw_row(
    scene, tmp_path: Path  # noqa: ANN001
) -> None:
    p, sent = scene
    two, at_second = sent["copies"]["two_second"]
    sent["sources"]["two_second"] = _send_to(p, 1, _copy(two, at_second))
    # On time to 14:08: hour 13 closed for good (the copy of 13:01:20 is within its window's lateness).
    third = p.produce(events=300, seed=9203, ads=4, ad_offset=990, minutes=61, start=HOUR + timedelta(minutes=67))
    sent["summaries"].append(third)
    _stream(p)
    assert _listed(p)[sent["sources"]["two_second"]] == two
    ok(load(p.env, "--hour", H13))
    data = dump(p.env)
    _two, at_first = sent["copies"]["two_first"]
    assert _raw_copies(data["rows"][T.RAW], two) == [(f"{at_first:%Y-%m-%dT%H:%M:%S}", sent["sources"]["two_first"])]
    in_13 = [r for r in data["rows"][T.QUARANTINE] if r["event_hour"].startswith(H13)]
    assert [(r["event_key"], r["reason"]) for r in in_13] == [(sent["sources"]["two_second"],
                                                               S.REASON_CONFLICTING_DUPLICATE)]
    windows = {(r["ad_id"], r["window_start"][:19] + "Z"): (r["impressions"], r["clicks"])
               for r in data["rows"][T.AGGREGATES] if r["event_hour"].startswith(H13)}
    assert windows == _expected_hour(sent, H13, [])
    for hour in (H12, H13):
        tables = verify_hour(p.env, hour, tmp_path)
        assert tables["ok"], json.dumps(tables)[:3000]
