"""An hour past Kafka's retention of which nothing was ever loaded is
reported, not failed; an hour that was loaded and then lost records to
retention still fails. A real broker, a real stream job, real loads (in the
home's warm load driver) and ``adpipe verify --hour``.

Kafka decides "past retention" by record time: an hour's records can have
been deleted when a partition's first kept record was written after the
hour began (less the future skew). The raw topic is put on the producers'
clock and every raw record written here carries its event's time, so the
hours below, two months back, are where Kafka's positions say they are.
The records the stream job writes (aggregates, late, DLQ) carry this
machine's clock, so the hour past retention is one whose raw records
retention deleted before the stream read them (a new deployment on a topic
whose oldest hours are gone): nothing of it reached any other topic.

1. OLD's raw records are written, then deleted (``delete_records``, as
   retention would) before any stream or load reads them.
2. HOUR's records are written: first, in each partition, one event at
   HOUR's start written the future skew before it (so Kafka provably holds
   all of HOUR), then the hour's events. The stream counts them (closing
   OLD); ``adpipe load --hour OLD`` exits 0 and says OLD is past retention
   in one WARNING line naming each raw partition and the first offset and
   time Kafka keeps; the ledger has a ``past_retention`` row, no ``failed``.
   ``adpipe verify --hour OLD`` exits 5 with the verdict ``past_retention``;
   so do the load DAG's steps (``--step stage``, ``--step audit``, whose
   summary makes ``validate`` and ``publish`` skip, and the verify task's
   ``verify --candidate-of-run``).
3. NEXT's records close HOUR, and ``adpipe load --hour HOUR`` publishes it
   (OLD holds nothing back), its rows the counts of the events written.
4. Retention deletes HOUR's first record of one partition: Kafka can no
   longer prove HOUR, which was loaded, so loading it again fails its gate
   (``kafka_retention``, exit 1, a ``failed`` ledger row: held) and verify
   exits 1 (not 5: the hour was loaded)."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq
import pytest
from adpipe import kafka_io
from adpipe.lakehouse import warm
from adpipe.lakehouse.handover import step_file
from adpipe.settings import Settings, load_settings
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.helpers import Pipeline, load, make_pipeline, on_producers_clock, poll, run, warm_env

# Hours no other test uses (the tables and the ledger are the session's).
OLD = datetime(2026, 9, 14, 5, tzinfo=UTC)
HOUR = datetime(2026, 9, 14, 7, tzinfo=UTC)
NEXT = HOUR + timedelta(hours=1)
SKEW_S = 300  # ADPIPE_MAX_FUTURE_SKEW_S's default: a record of an hour is written at its start less this, or later
ADS = 6


def label(hour: datetime) -> str:
    return hour.strftime("%Y-%m-%dT%H")


def ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def _events(start: datetime, n: int, step_s: int) -> list[dict]:
    return [
        {"event_id": str(uuid.uuid4()), "ad_id": f"ad-ret-{i % ADS}", "event_type": "click" if i % 4 == 0 else
         "impression", "event_time": (start + timedelta(seconds=i * step_s)).strftime("%Y-%m-%dT%H:%M:%SZ")}
        for i in range(n)
    ]


def _write(p: Pipeline, records: list[tuple[int, dict, datetime]], transactional: bool) -> None:
    """(partition, event, record timestamp) to the raw topic, in order; in
    one transaction when ``transactional`` (the stream then reads them all
    in one batch: none is made late by another partition's later ones)."""
    config = {"bootstrap.servers": p.settings.kafka_bootstrap, "enable.idempotence": True}
    if transactional:
        config["transactional.id"] = f"test-retention-{uuid.uuid4().hex[:8]}"
    producer = Producer(config)
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    for partition, event, at in records:
        producer.produce(p.settings.topics.events, json.dumps(event).encode(), event["ad_id"].encode(),
                         partition=partition, timestamp=ms(at))
    if transactional:
        producer.commit_transaction(60)
    assert producer.flush(30) == 0


def _event_at(event: dict) -> datetime:
    return datetime.fromisoformat(event["event_time"].replace("Z", "+00:00"))


def _bounds(p: Pipeline) -> dict[int, tuple[int, int]]:
    """The raw topic's (first kept, end) offsets per partition, from a plain consumer."""
    consumer = Consumer({"bootstrap.servers": p.settings.kafka_bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        return {part: consumer.get_watermark_offsets(TopicPartition(p.settings.topics.events, part), timeout=30)
                for part in range(p.settings.topic_partitions)}
    finally:
        consumer.close()


def _no_time_retention(p: Pipeline) -> None:
    """The raw topic keeps its records whatever their age (its records carry
    times two months back, which the broker's own retention would delete
    within minutes): only :func:`_delete_below` deletes here."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    entry = ConfigEntry("retention.ms", "-1", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, p.settings.topics.events, incremental_configs=[entry])
    client = kafka_io.admin(p.settings.kafka)  # kept while its futures are awaited
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def _delete_below(p: Pipeline, offsets: dict[int, int]) -> None:
    """What retention does: the raw topic's records below ``offsets`` deleted."""
    admin = AdminClient({"bootstrap.servers": p.settings.kafka_bootstrap})
    done = admin.delete_records([TopicPartition(p.settings.topics.events, part, o) for part, o in offsets.items()])
    for future in done.values():
        future.result(30)


def _ledger(settings: Settings) -> list[dict]:
    """``ads.load_runs`` read from its Delta log and Parquet files (no Spark):
    the files every commit added and none removed (the ledger is only appended to)."""
    table = settings.warehouse_dir / "ads.db" / "load_runs"
    added: list[str] = []
    removed: set[str] = set()
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                added.append(unquote(action["add"]["path"]))
            elif "remove" in action:
                removed.add(unquote(action["remove"]["path"]))
    rows = [row for path in added if path not in removed for row in pq.read_table(table / path).to_pylist()]
    return sorted(rows, key=lambda r: (r["run_id"], r["at"]))


def _steps_of(settings: Settings, hour: datetime) -> list[tuple[str, str]]:
    """(step, message) of the ledger rows about ``hour``, oldest first."""
    return [(r["step"], r["message"] or "") for r in _ledger(settings)
            if label(hour) in json.loads(r["hours"] or "[]") and r["step"] != "staged"]


def _watermark_past(p: Pipeline, at: datetime, timeout_s: float = 240) -> None:
    """Wait until the stream job has committed a batch whose watermark is past ``at``."""
    def past() -> bool:
        commits = kafka_io.stream_commits(p.settings)
        mark = kafka_io.committed_watermark(commits)
        return mark is not None and mark >= ms(at)

    poll(f"the stream's watermark past {at.isoformat()}", past, timeout_s, 1.0, tolerate=(Exception,))


def _verify(env: dict[str, str], hour: datetime, tmp: Path, *args: str) -> tuple[int, dict]:
    """``adpipe verify --hour``'s exit status and report."""
    report = tmp / f"verify-{label(hour)}-{uuid.uuid4().hex[:6]}.json"
    proc = run(env, "-m", "adpipe", "verify", "--hour", label(hour), *args, "--report", str(report))
    assert report.exists(), (proc.stdout + proc.stderr)[-4000:]
    return proc.returncode, json.loads(report.read_text())


@pytest.mark.integration
def test_an_hour_past_retention_is_reported_not_failed_and_a_loaded_one_still_fails(
    broker: Settings, pg: Settings, tmp_path: Path
) -> None:
    # Two partitions: half the Spark tasks of every Kafka read, the same cases.
    p = make_pipeline(tmp_path, {"ADPIPE_TOPIC_PARTITIONS": "2"})
    env = warm_env(p.env)
    settings = load_settings(env)
    # The loads' and verify's Spark session warms up while the stream job starts.
    warming = threading.Thread(target=warm.ensure_driver, args=(settings,), kwargs={"env": env}, daemon=True)
    warming.start()
    on_producers_clock(p.settings)  # each raw record carries its event's time (the module doc)
    _no_time_retention(p)
    parts = p.settings.topic_partitions
    job, raw = p.settings.job_id, p.settings.topics.events

    # 1. OLD's raw records, deleted before anything read them.
    old = _events(OLD + timedelta(minutes=10), 40, 15)
    _write(p, [(i % parts, e, _event_at(e)) for i, e in enumerate(old)], transactional=False)
    written = {part: sum(1 for i in range(len(old)) if i % parts == part) for part in range(parts)}
    _delete_below(p, written)
    assert _bounds(p) == {part: (n, n) for part, n in written.items()}

    # 2. HOUR's records: per partition one event at its start written SKEW_S before it, then the hour's events.
    first = _events(HOUR, parts, 0)
    events = _events(HOUR + timedelta(minutes=1), 60, 8)  # :01 .. :09 of HOUR
    first_written = HOUR - timedelta(seconds=SKEW_S)
    _write(p, [(i, e, first_written) for i, e in enumerate(first)]
           + [(i % parts, e, _event_at(e)) for i, e in enumerate(events)], transactional=True)
    with p.continuous_stream():
        _watermark_past(p, OLD + timedelta(hours=1, minutes=6))  # OLD closed for good (lateness 300 s)
        warming.join(timeout=300)
        done = load(env, "--hour", label(OLD))
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-6000:]
        (line,) = [ln for ln in out.splitlines() if "WARNING" in ln and "past Kafka's retention" in ln]
        assert f"hour {label(OLD)} is past Kafka's retention" in line
        for part, n in written.items():
            assert f"{job}/{raw}[{part}] from offset {n} (written {first_written:%Y-%m-%dT%H:%M:%SZ})" in line, line
        assert f"past Kafka's retention, nothing of them ever loaded (reported, not checked, not held): " \
               f"{label(OLD)}" in out
        steps = _steps_of(settings, OLD)
        assert [s for s, _m in steps] == ["past_retention"], steps
        assert f"{job}/{raw}[0] from offset {written[0]}" in steps[0][1]

        code, report = _verify(env, OLD, tmp_path)
        assert code == 5, json.dumps(report)[:3000]
        tables = report["tables"]
        assert tables["verdict"] == "past_retention" and not tables["ok"]
        assert {(g["topic"], g["partition"], g["first_offset"]) for g in tables["past_retention"]} == {
            (raw, part, n) for part, n in written.items()}
        # The gate on its own: nothing to check, nothing failed (exit 5, the WARNING line).
        done = run(env, "-m", "adpipe", "validate", "--hour", label(OLD))
        out = done.stdout + done.stderr
        assert done.returncode == 5, out[-6000:]
        assert f"hour {label(OLD)} is past Kafka's retention" in out, out[-3000:]

        # The DAG's steps, as its tasks run them: the audit hands on that OLD is past retention and nothing
        # passed (validate and publish then skip: past_retention_skip), the verify task's command exits 5.
        run_file = tmp_path / "run.json"
        for step in ("stage", "audit"):
            done = load(env, "--hour", label(OLD), "--step", step, "--run-file", str(run_file))
            assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
        summary = json.loads(step_file(run_file, "audit").read_text())
        assert summary["success"] and summary["passed"] == [] and list(summary["past_retention"]) == [label(OLD)]
        run_id = json.loads(run_file.read_text())["run_id"]
        code, report = _verify(env, OLD, tmp_path, "--tables-only", "--candidate-of-run", str(run_id))
        assert code == 5 and report["tables"]["verdict"] == "past_retention", json.dumps(report)[:3000]

        # 3. NEXT's events close HOUR; its load publishes it: OLD holds nothing back.
        _write(p, [(i % parts, e, _event_at(e)) for i, e in enumerate(_events(NEXT + timedelta(minutes=1), 20, 30))],
               transactional=True)
        _watermark_past(p, NEXT + timedelta(minutes=6))
        done = load(env, "--hour", label(HOUR))
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-6000:]
        windows = {(e["ad_id"], e["event_time"][:16]) for e in first + events}
        assert f"hours {label(HOUR)} audited and published" in out, out[-3000:]
        assert f"ads.ad_events_raw: +{len(first) + len(events)} of" in out, out[-3000:]
        assert f"ads.ad_minute_aggregates: +{len(windows)} of" in out, out[-3000:]
        assert "past Kafka's retention" not in out and "held by a failed gate" not in out, out[-3000:]
        assert [s for s, _m in _steps_of(settings, HOUR)] == ["published"]

    # 4. Retention takes HOUR's first record of partition 0, after HOUR was loaded: it fails as before.
    _delete_below(p, {0: written[0] + 1})
    done = load(env, "--hour", label(HOUR))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-6000:]
    assert f"kafka_retention: {job} {raw}[0] keeps records from offset {written[0] + 1}" in out, out[-6000:]
    assert [s for s, _m in _steps_of(settings, HOUR)] == ["published", "failed"]
    code, report = _verify(env, HOUR, tmp_path)
    assert code == 1 and report["tables"]["verdict"] == "broken", json.dumps(report)[:3000]
    done = run(env, "-m", "adpipe", "validate", "--hour", label(HOUR))
    assert done.returncode == 1 and "kafka_retention" in done.stdout + done.stderr, (done.stdout + done.stderr)[-6000:]
