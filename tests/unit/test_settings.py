"""The one place that reads configuration: defaults, overrides, clear errors."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from adpipe.settings import Settings, SettingsError, load_settings

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
    assert (settings.topic_partitions, settings.shuffle_partitions) == (4, 2)  # a state partition per task slot
    assert (settings.watermark_delay_s, settings.allowed_lateness_s, settings.lateness_ms) == (30, 300, 330_000)
    assert settings.watermark_alignment
    assert (settings.trigger_interval_s, settings.max_offsets_per_trigger) == (5, 500_000)
    assert settings.job_id == "region-local"
    assert settings.transaction_timeout_ms == 120_000
    assert (settings.max_future_skew_s, settings.max_future_skew_ms) == (300, 300_000)
    assert load_settings({"ADPIPE_MAX_FUTURE_SKEW_S": "0"}).max_future_skew_ms == 0
    assert settings.checkpoint_uri == f"file://{REPO / '.adpipe' / 'checkpoints' / 'region-local'}"
    assert settings.budget_db == f"sqlite:///{REPO / '.adpipe' / 'budget.db'}"
    assert settings.checkpoint_dir == REPO / ".adpipe" / "checkpoints" / "region-local"


def test_the_checkpoint_may_be_any_uri(tmp_path: Path) -> None:
    # As Hadoop reads a path: not percent-encoded.
    local = load_settings({"ADPIPE_CHECKPOINT_URI": f"file://{tmp_path / 'a b'}/", "ADPIPE_JOB_ID": "eu"})
    assert local.checkpoint_uri == f"file://{tmp_path / 'a b'}/eu"
    assert local.checkpoint_dir == tmp_path / "a b" / "eu"
    remote = load_settings({"ADPIPE_CHECKPOINT_URI": "s3a://bucket/adpipe", "ADPIPE_JOB_ID": "eu"})
    assert remote.checkpoint_uri == "s3a://bucket/adpipe/eu"
    with pytest.raises(SettingsError, match="not a local folder"):
        _ = remote.checkpoint_dir
    with pytest.raises(SettingsError, match="needs a scheme"):
        load_settings({"ADPIPE_CHECKPOINT_URI": "/just/a/path"})


def test_the_warehouse_may_be_any_uri(tmp_path: Path) -> None:
    default = load_settings({"ADPIPE_HOME": str(tmp_path)})
    assert default.warehouse_uri == f"file://{tmp_path}/warehouse"
    assert default.warehouse_dir == tmp_path / "warehouse"
    local = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_WAREHOUSE_URI": f"file://{tmp_path / 'w h'}/"})
    assert local.warehouse_dir == tmp_path / "w h"
    remote = load_settings({"ADPIPE_WAREHOUSE_URI": "s3a://bucket/warehouse"})
    assert remote.warehouse_uri == "s3a://bucket/warehouse"
    with pytest.raises(SettingsError, match="the warehouse s3a://bucket/warehouse is not a local folder"):
        _ = remote.warehouse_dir
    with pytest.raises(SettingsError, match="ADPIPE_WAREHOUSE_URI='/just/a/path' needs a scheme"):
        load_settings({"ADPIPE_WAREHOUSE_URI": "/just/a/path"})


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
            "ADPIPE_WATERMARK_ALIGNMENT": "off",
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
    assert not settings.watermark_alignment
    assert settings.max_offsets_per_trigger == 1000
    assert settings.shuffle_partitions == 2
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
        ({"ADPIPE_MAX_LATE_SHARE": "1%"}, "ADPIPE_MAX_LATE_SHARE='1%' is not a number"),
        ({"ADPIPE_MAX_LATE_SHARE": "1.5"}, "ADPIPE_MAX_LATE_SHARE=1.5 must be between 0 and 1"),
        ({"ADPIPE_TRANSACTION_TIMEOUT_MS": "999"}, "ADPIPE_TRANSACTION_TIMEOUT_MS=999 must be >= 1000"),
        ({"ADPIPE_KAFKA_BOOTSTRAP": "localhost"}, "ADPIPE_KAFKA_BOOTSTRAP='localhost' must be host:port"),
        ({"ADPIPE_KAFKA_BOOTSTRAP": ""}, "ADPIPE_KAFKA_BOOTSTRAP='' must be host:port"),
        ({"ADPIPE_MAX_FUTURE_SKEW_S": "-5"}, "ADPIPE_MAX_FUTURE_SKEW_S=-5 must be >= 0"),
    ],
    ids=[
        "not_integer", "word", "below_minimum", "negative", "share_not_number", "share_above_one",
        "timeout_too_small", "no_port", "empty_bootstrap", "negative_skew",
    ],
)
def test_bad_values_raise_settings_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(env)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, ValueError)


def test_every_bootstrap_server_needs_a_port() -> None:
    with pytest.raises(SettingsError):
        load_settings({"ADPIPE_KAFKA_BOOTSTRAP": "broker-a:9092,broker-b"})




def test_jvm_options_reach_the_spark_driver_and_the_broker(tmp_path: Path) -> None:
    from adpipe import class_archive
    from adpipe.local import kafka_broker
    from adpipe.spark import LOG4J2_FILE_CONFIG, spark_conf

    settings = load_settings(
        {
            "ADPIPE_HOME": str(tmp_path / "my home"),
            "ADPIPE_JVM_OPTIONS": "-XX:TieredStopAtLevel=1 -Dx='a b'",
            "ADPIPE_SPARK_JIT": "full",  # the JVM's own tiers: no option of adpipe's
            "ADPIPE_SPARK_GC": "default",  # nor a collector
        }
    )
    assert settings.jvm_options == ("-XX:TieredStopAtLevel=1", "-Dx=a b")
    options = spark_conf(settings, "t")["spark.driver.extraJavaOptions"]
    derby = f"'-Dderby.system.home={tmp_path / 'my home' / 'derby'}'"
    log_file = tmp_path / "my home" / "logs" / "t.log"
    logs = f"-Dlog4j2.configurationFile={LOG4J2_FILE_CONFIG.as_uri()} '-Dadpipe.log.file={log_file}'"
    archive = shlex.join(class_archive.driver_options(settings, ""))  # once make jars trained it
    assert options == f"{derby} {logs} -XX:TieredStopAtLevel=1 '-Dx=a b'" + (f" {archive}" if archive else "")
    (tmp_path / "my home" / "kafka").mkdir(parents=True)
    command = kafka_broker._java(settings, "Main")
    assert command[command.index("-XX:TieredStopAtLevel=1") + 1] == "-Dx=a b"
    assert load_settings({"ADPIPE_HOME": str(tmp_path)}).jvm_options == ()


def test_load_submit_and_metastore_database_are_checked() -> None:
    assert load_settings({}).load_submit == "warm"
    assert load_settings({"ADPIPE_LOAD_SUBMIT": "in-process"}).load_submit == "in-process"
    with pytest.raises(SettingsError, match="ADPIPE_LOAD_SUBMIT='yarn' must be one of warm, spark-submit, in-process"):
        load_settings({"ADPIPE_LOAD_SUBMIT": "yarn"})
    assert load_settings({}).metastore_database == "adpipe_metastore"
    assert load_settings({"ADPIPE_METASTORE_DATABASE": "ms_eu_1"}).metastore_database == "ms_eu_1"
    for bad in ("Metastore", "ms-eu", "1ms", "ms; drop"):
        with pytest.raises(SettingsError, match="ADPIPE_METASTORE_DATABASE"):
            load_settings({"ADPIPE_METASTORE_DATABASE": bad})


def test_pg_url_redacted_for_printing() -> None:
    settings = load_settings({"ADPIPE_PG_PASSWORD": "s3cret-Pw"})
    assert settings.pg_url("db") == "postgresql+psycopg2://adpipe:s3cret-Pw@127.0.0.1:5433/db"
    shown = settings.pg_url("db", redacted=True)
    assert "s3cret-Pw" not in shown and shown == "postgresql+psycopg2://adpipe:***@127.0.0.1:5433/db"


def test_broker_properties_are_key_value_entries_added_last(tmp_path: Path) -> None:
    from adpipe.local.kafka_broker import server_properties

    raw = "replica.lag.time.max.ms=3000; log.retention.hours=1\nnum.io.threads=2"
    settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_KAFKA_BROKER_PROPERTIES": raw})
    assert settings.kafka_broker_properties == (
        "replica.lag.time.max.ms=3000",
        "log.retention.hours=1",
        "num.io.threads=2",
    )
    lines = server_properties(settings).splitlines()
    # Java's Properties keeps the last of two equal keys: the operator's wins.
    assert [line for line in lines if line.startswith("log.retention.hours=")] == [
        "log.retention.hours=168",
        "log.retention.hours=1",
    ]
    with pytest.raises(SettingsError, match="'no-equals-sign' is not key=value"):
        load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_KAFKA_BROKER_PROPERTIES": "a=1;no-equals-sign"})


def test_the_state_partitions_default_to_the_task_slots_spark_runs_at_once() -> None:
    import os

    from adpipe.setting_values import spark_task_slots

    assert spark_task_slots("local[4]", 0) == 4
    assert spark_task_slots("local[3, 2]", 0) == 3  # tasks, then failures allowed
    assert spark_task_slots("local", 0) == 1
    assert spark_task_slots("local[*]", 0) == (os.cpu_count() or 1)
    assert spark_task_slots("spark://h:7077", 6) == 6
    assert spark_task_slots("spark://h:7077", 0) is None
    assert load_settings({"ADPIPE_SPARK_MASTER": "local[3]"}).shuffle_partitions == 3
    assert load_settings({"ADPIPE_SPARK_MASTER": "spark://h:7077"}).shuffle_partitions == 4
    cluster = {"ADPIPE_SPARK_MASTER": "spark://h:7077", "ADPIPE_SPARK_CORES_MAX": "2"}
    assert load_settings(cluster).shuffle_partitions == 2
    assert load_settings({**cluster, "ADPIPE_SHUFFLE_PARTITIONS": "8"}).shuffle_partitions == 8
