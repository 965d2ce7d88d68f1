"""Settings, record identity, fault plans, jar names and the DLQ/late routing
of one batch's exception rows."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from adpipe import schemas as S
from adpipe.faults import AFTER_COMMIT, AFTER_PRODUCE, DURING_COMMIT, FaultPlan
from adpipe.jars import artifact_name
from adpipe.offset_log import BatchOffsets
from adpipe.settings import Settings, SettingsError, load_settings
from adpipe.stream import aggregate_record, exception_records, iso_utc, record_uuid
from adpipe.tx_sink import OutRecord

REPO = Path(__file__).resolve().parents[2]

# --- settings ----------------------------------------------------------------


def test_defaults() -> None:
    settings = load_settings({})
    assert settings.home == REPO / ".adpipe"
    assert settings.kafka_bootstrap == "127.0.0.1:9092"
    assert settings.kafka_controller_port == 9093
    assert settings.spark_master == "local[2]"
    assert settings.topics.all() == (
        "ad-events", "ad-aggregates", "ad-events-dlq", "ad-events-late", "ad-budget-events"
    )
    assert (settings.topic_partitions, settings.shuffle_partitions) == (4, 4)
    assert (settings.watermark_delay_s, settings.allowed_lateness_s, settings.lateness_ms) == (30, 0, 30_000)
    assert (settings.trigger_interval_s, settings.max_offsets_per_trigger) == (5, 0)
    assert settings.job_id == "region-local"
    assert settings.transaction_timeout_ms == 120_000
    assert settings.budget_db == f"sqlite:///{REPO / '.adpipe' / 'budget.db'}"
    assert settings.checkpoint_dir == REPO / ".adpipe" / "checkpoints" / "region-local"


def test_load_settings_does_not_read_os_environ_when_given_a_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADPIPE_JOB_ID", "from-the-environment")
    assert load_settings({}).job_id == "region-local"
    assert load_settings().job_id == "from-the-environment"


def test_overrides(tmp_path: Path) -> None:
    settings = load_settings(
        {
            "ADPIPE_HOME": str(tmp_path / "home"),
            "ADPIPE_KAFKA_BOOTSTRAP": "broker-a:19092,broker-b:19092",
            "ADPIPE_JOB_ID": "region-eu",
            "ADPIPE_TOPIC_DLQ": "dlq-eu",
            "ADPIPE_WATERMARK_DELAY_S": "10",
            "ADPIPE_ALLOWED_LATENESS_S": "5",
            "ADPIPE_MAX_OFFSETS_PER_TRIGGER": "1000",
            "ADPIPE_SHUFFLE_PARTITIONS": "",  # empty means the default
        }
    )
    assert settings.home == tmp_path / "home"
    assert settings.kafka_bootstrap == "broker-a:19092,broker-b:19092"
    assert settings.job_id == "region-eu"
    assert settings.topics.dlq == "dlq-eu"
    assert settings.topics.events == "ad-events"
    assert settings.lateness_ms == 15_000
    assert settings.max_offsets_per_trigger == 1000
    assert settings.shuffle_partitions == 4
    assert settings.checkpoint_dir == tmp_path / "home" / "checkpoints" / "region-eu"
    assert settings.budget_db == f"sqlite:///{tmp_path / 'home' / 'budget.db'}"


def test_relative_home_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_settings({"ADPIPE_HOME": "rel"}).home == tmp_path / "rel"


def test_with_overrides_returns_a_changed_copy() -> None:
    settings = load_settings({})
    changed = settings.with_overrides(job_id="other")
    assert (settings.job_id, changed.job_id) == ("region-local", "other")
    assert isinstance(changed, Settings)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ADPIPE_WATERMARK_DELAY_S": "30s"}, "ADPIPE_WATERMARK_DELAY_S='30s' is not an integer"),
        ({"ADPIPE_TOPIC_PARTITIONS": "four"}, "ADPIPE_TOPIC_PARTITIONS='four' is not an integer"),
        ({"ADPIPE_TRIGGER_INTERVAL_S": "0"}, "ADPIPE_TRIGGER_INTERVAL_S=0 must be >= 1"),
        ({"ADPIPE_ALLOWED_LATENESS_S": "-1"}, "ADPIPE_ALLOWED_LATENESS_S=-1 must be >= 0"),
        ({"ADPIPE_TRANSACTION_TIMEOUT_MS": "999"}, "ADPIPE_TRANSACTION_TIMEOUT_MS=999 must be >= 1000"),
        ({"ADPIPE_KAFKA_BOOTSTRAP": "localhost"}, "ADPIPE_KAFKA_BOOTSTRAP='localhost' must be host:port"),
        ({"ADPIPE_KAFKA_BOOTSTRAP": ""}, "ADPIPE_KAFKA_BOOTSTRAP='' must be host:port"),
    ],
    ids=["not_integer", "word", "below_minimum", "negative", "timeout_too_small", "no_port", "empty_bootstrap"],
)
def test_bad_values_raise_settings_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(env)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, ValueError)


def test_every_bootstrap_server_needs_a_port() -> None:
    with pytest.raises(SettingsError):
        load_settings({"ADPIPE_KAFKA_BOOTSTRAP": "broker-a:9092,broker-b"})


# --- record_uuid and iso_utc -------------------------------------------------

NOON = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_record_uuid_is_a_stable_uuid5() -> None:
    value = record_uuid("region-local", "ad-000001", NOON)
    # Pinned: consumers deduplicate on it, so it must never change between releases.
    assert value == "642a194a-8dd8-5646-aab9-489275eb6560"
    assert record_uuid("region-local", "ad-000001", NOON) == value
    parsed = uuid.UUID(value)
    assert (parsed.version, parsed.variant) == (5, uuid.RFC_4122)


def test_record_uuid_same_window_in_any_representation() -> None:
    expected = "642a194a-8dd8-5646-aab9-489275eb6560"
    assert record_uuid("region-local", "ad-000001", datetime(2026, 11, 22, 12, 0)) == expected  # noqa: DTZ001
    plus_one = timezone(timedelta(hours=1))
    assert record_uuid("region-local", "ad-000001", datetime(2026, 11, 22, 13, 0, tzinfo=plus_one)) == expected


def test_record_uuid_differs_by_job_ad_and_window() -> None:
    values = {
        record_uuid("region-local", "ad-000001", NOON),
        record_uuid("region-eu", "ad-000001", NOON),
        record_uuid("region-local", "ad-000002", NOON),
        record_uuid("region-local", "ad-000001", NOON + timedelta(minutes=1)),
    }
    assert len(values) == 4


def test_iso_utc() -> None:
    assert iso_utc(datetime(2026, 11, 22, 12, 1, 2)) == "2026-11-22T12:01:02Z"  # noqa: DTZ001 - naive is UTC
    assert iso_utc(datetime(2026, 11, 22, 12, 1, 2, 999_999, tzinfo=UTC)) == "2026-11-22T12:01:02Z"
    minus_five = timezone(timedelta(hours=-5))
    assert iso_utc(datetime(2026, 11, 22, 21, 30, tzinfo=minus_five)) == "2026-11-23T02:30:00Z"


def test_aggregate_record() -> None:
    settings = load_settings({"ADPIPE_JOB_ID": "region-local"})
    row = {
        "ad_id": "ad-000001",
        "window_start": datetime(2026, 11, 22, 12, 0),  # noqa: DTZ001
        "window_end": datetime(2026, 11, 22, 12, 1),
        "impressions": 7,
        "clicks": 2,
    }  # noqa: DTZ001
    record = aggregate_record(settings, row, 12)
    assert (record.topic, record.key) == ("ad-aggregates", b"ad-000001")
    assert json.loads(record.value) == {
        "record_uuid": "642a194a-8dd8-5646-aab9-489275eb6560",
        "ad_id": "ad-000001",
        "window_start": "2026-11-22T12:00:00Z",
        "window_end": "2026-11-22T12:01:00Z",
        "impressions": 7,
        "clicks": 2,
    }
    assert list(record.headers) == [
        ("adpipe.kind", b"aggregate"),
        ("adpipe.job", b"region-local"),
        ("adpipe.batch", b"12"),
    ]


# --- fault plans -------------------------------------------------------------


@pytest.mark.parametrize(
    "env", [{}, {"ADPIPE_FAULT": ""}, {"ADPIPE_FAULT_BATCH": "3"}], ids=["unset", "empty", "batch_only"]
)
def test_no_fault_plan_when_unset(env: dict[str, str]) -> None:
    assert FaultPlan.from_env(env) is None


def test_fault_plan_from_env() -> None:
    assert FaultPlan.from_env({"ADPIPE_FAULT": "after_produce"}) == FaultPlan(AFTER_PRODUCE, 1, 0)
    plan = FaultPlan.from_env(
        {"ADPIPE_FAULT": "during_commit", "ADPIPE_FAULT_BATCH": "3", "ADPIPE_FAULT_DELAY_MS": "250"}
    )
    assert plan == FaultPlan(DURING_COMMIT, 3, 250)


def test_unknown_fault_point_raises() -> None:
    with pytest.raises(ValueError, match="ADPIPE_FAULT='before_produce'"):
        FaultPlan.from_env({"ADPIPE_FAULT": "before_produce"})


def test_fault_armed_only_at_or_after_its_batch_with_records() -> None:
    plan = FaultPlan(AFTER_COMMIT, from_batch=3)
    assert plan.armed(AFTER_COMMIT, 2, 10) is False
    assert plan.armed(AFTER_COMMIT, 3, 10) is True
    assert plan.armed(AFTER_COMMIT, 4, 1) is True
    assert plan.armed(AFTER_COMMIT, 3, 0) is False
    assert plan.armed(AFTER_PRODUCE, 3, 10) is False


def test_hit_does_nothing_when_not_armed() -> None:
    # Armed it would SIGKILL the test process.
    assert FaultPlan(AFTER_COMMIT, from_batch=5).hit(AFTER_COMMIT, 4, 10) is None


# --- jar names ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("kafka-clients-3.9.1.jar", "kafka-clients"),
        ("commons-pool2-2.12.1.jar", "commons-pool2"),
        ("jackson-datatype-jdk8-2.13.5.jar", "jackson-datatype-jdk8"),
        ("delta-spark_4.1_2.13-4.4.0.jar", "delta-spark_4.1_2.13"),
        ("guava-33.4.8-jre.jar", "guava"),
        ("netty-transport-native-epoll-4.2.7.Final-linux-x86_64.jar", "netty-transport-native-epoll"),
        ("kafka_2.13-3.9.1.jar", "kafka_2.13"),
        ("spark-sql-kafka-0-10_2.13-4.1.3.jar", "spark-sql-kafka-0-10_2.13"),
        ("log4j-1.2-api-2.24.3.jar", "log4j-1.2-api"),
        ("zstd-jni-1.5.6-10.jar", "zstd-jni"),
        ("hive-exec-2.3.10-core.jar", "hive-exec"),
    ],
)
def test_artifact_name(jar: str, artifact: str) -> None:
    assert artifact_name(jar) == artifact


# --- exception_records -------------------------------------------------------

OFFSETS = BatchOffsets(
    batch_id=7,
    topic="ad-events",
    start={0: 10, 1: 20},
    end={0: 30, 1: 40},
    watermark_ms=1_795_349_070_000,
    late_watermark_ms=1_795_349_010_000,
)


def exception_row(
    partition: int,
    offset: int,
    value: bytes | None,
    reason: str | None = None,
    event_id: str | None = None,
    ad_id: str | None = None,
    key: bytes | None = b"raw-key",
) -> dict:
    return {
        "key": bytearray(key) if key is not None else None,
        "value": bytearray(value) if value is not None else None,
        "topic": "ad-events",
        "partition": partition,
        "offset": offset,
        "event_id": event_id,
        "ad_id": ad_id,
        "reject_reason": reason,
    }


def test_exception_records_route_dlq_and_late() -> None:
    settings = load_settings({"ADPIPE_JOB_ID": "region-eu"})
    late_value = b'{"event_id":"e-1","ad_id":"ad-9","event_type":"click","event_time":1}'
    rows = [
        exception_row(1, 25, late_value, event_id="e-1", ad_id="ad-9"),
        exception_row(0, 12, b"{not json", reason=S.REASON_NOT_JSON, key=b"\xff\x00"),
        exception_row(1, 31, late_value, event_id="e-1", ad_id="ad-9"),  # the producer's retry
        exception_row(0, 14, None, reason=S.REASON_NOT_JSON, key=None),
    ]
    records, dlq, late = exception_records(settings, rows, OFFSETS)
    assert (dlq, late) == (2, 1)
    assert records == [
        OutRecord(
            "ad-events-dlq",
            b"\xff\x00",
            b"{not json",
            [
                ("adpipe.kind", b"dlq"),
                ("adpipe.reason", b"not_json"),
                ("adpipe.source", b"ad-events/0/12"),
                ("adpipe.job", b"region-eu"),
                ("adpipe.batch", b"7"),
            ],
        ),
        OutRecord(
            "ad-events-dlq",
            None,
            b"",
            [
                ("adpipe.kind", b"dlq"),
                ("adpipe.reason", b"not_json"),
                ("adpipe.source", b"ad-events/0/14"),
                ("adpipe.job", b"region-eu"),
                ("adpipe.batch", b"7"),
            ],
        ),
        OutRecord(
            "ad-events-late",
            b"ad-9",
            late_value,
            [
                ("adpipe.kind", b"late"),
                ("adpipe.reason", b"late"),
                ("adpipe.source", b"ad-events/1/25"),
                ("adpipe.watermark_ms", b"1795349010000"),
                ("adpipe.job", b"region-eu"),
                ("adpipe.batch", b"7"),
            ],
        ),
    ]
    assert all(type(r.value) is bytes for r in records)


def test_exception_records_of_a_clean_batch() -> None:
    assert exception_records(load_settings({}), [], OFFSETS) == ([], 0, 0)


def test_exception_records_use_the_configured_topics() -> None:
    settings = load_settings({"ADPIPE_TOPIC_DLQ": "my-dlq", "ADPIPE_TOPIC_LATE": "my-late"})
    rows = [exception_row(0, 1, b"[]", reason=S.REASON_NOT_OBJECT), exception_row(0, 2, b"{}", event_id="e", ad_id="a")]
    records, _, _ = exception_records(settings, rows, OFFSETS)
    assert [r.topic for r in records] == ["my-dlq", "my-late"]


def test_jvm_options_reach_the_spark_driver_and_the_broker(tmp_path: Path) -> None:
    from adpipe import kafka_broker
    from adpipe.spark import spark_conf

    settings = load_settings(
        {"ADPIPE_HOME": str(tmp_path / "my home"), "ADPIPE_JVM_OPTIONS": "-XX:TieredStopAtLevel=1 -Dx='a b'"}
    )
    assert settings.jvm_options == ("-XX:TieredStopAtLevel=1", "-Dx=a b")
    options = spark_conf(settings, "t")["spark.driver.extraJavaOptions"]
    assert options == f"'-Dderby.system.home={tmp_path / 'my home' / 'derby'}' -XX:TieredStopAtLevel=1 '-Dx=a b'"
    (tmp_path / "my home" / "kafka").mkdir(parents=True)
    command = kafka_broker._java(settings, "Main")
    assert command[command.index("-XX:TieredStopAtLevel=1") + 1] == "-Dx=a b"
    assert load_settings({"ADPIPE_HOME": str(tmp_path)}).jvm_options == ()


def test_each_demo_run_in_a_home_gets_an_hour_of_its_own(tmp_path: Path) -> None:
    from adpipe.demo import run_start

    runs = tmp_path / "demo"
    first = run_start(runs)
    assert first == datetime(2026, 11, 22, 12, tzinfo=UTC)
    (runs / "20261123162734").mkdir(parents=True)
    (runs / "notes.txt").write_text("not a run")
    second = run_start(runs)
    (runs / "20261123163240").mkdir()
    third = run_start(runs)
    assert (second - first, third - second) == (timedelta(days=1), timedelta(days=1))
    assert len({first.replace(minute=0), second.replace(minute=0), third.replace(minute=0)}) == 3
