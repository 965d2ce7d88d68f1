"""How credentials reach every Kafka client: settings, the librdkafka and
Spark configurations built from them, and secrets kept out of reprs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from adpipe import kafka_io
from adpipe.settings import PROJECT_ROOT, KafkaAccess, KafkaCredentials, SettingsError, load_settings

SECURE = {"ADPIPE_KAFKA_SECURITY": "sasl_ssl", "ADPIPE_KAFKA_USERNAME": "stream"}


def _secure(tmp_path: Path, **extra: str) -> dict[str, str]:
    secret = tmp_path / "stream.password"
    secret.write_text('pa ss"w\\rd-1\n')
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    return {
        "ADPIPE_HOME": str(tmp_path / "home"),
        **SECURE,
        "ADPIPE_KAFKA_PASSWORD_FILE": str(secret),
        "ADPIPE_KAFKA_CA_FILE": str(ca),
        **extra,
    }


def test_plaintext_by_default_gives_bare_client_settings() -> None:
    settings = load_settings({"ADPIPE_KAFKA_BOOTSTRAP": "a:1,b:2"})
    assert not settings.kafka.secure
    assert settings.kafka.client_config() == {"bootstrap.servers": "a:1,b:2"}
    # Spark's bounded reads do not wait on the broker for records past their range's end.
    assert settings.kafka.spark_options() == {
        "kafka.bootstrap.servers": "a:1,b:2",
        "kafka.fetch.max.wait.ms": "10",
        "kafka.default.api.timeout.ms": "15000",
        "kafka.request.timeout.ms": "15000",
    }
    assert kafka_io.access("a:1") == KafkaAccess("a:1")  # a bare string: no credentials


def test_sasl_ssl_client_settings_for_librdkafka_and_spark(tmp_path: Path) -> None:
    settings = load_settings(_secure(tmp_path))
    assert settings.kafka.client_config() == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "stream",
        "sasl.password": 'pa ss"w\\rd-1',  # the file's line, its newline dropped
        "ssl.ca.location": str(tmp_path / "ca.pem"),
    }
    spark = settings.kafka.spark_options()
    assert spark == {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "kafka.fetch.max.wait.ms": "10",
        "kafka.default.api.timeout.ms": "15000",
        "kafka.request.timeout.ms": "15000",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        # Quotes and backslashes escaped as the JAAS parser reads them.
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="stream" password="pa ss\\"w\\\\rd-1";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(tmp_path / "ca.pem"),
    }
    # kafka_io's own clients take the same settings, then their own.
    assert kafka_io.client_config(settings.kafka, {"group.id": "g"}) == {
        **settings.kafka.client_config(),
        "group.id": "g",
    }


def test_the_password_is_in_no_repr_and_no_description(tmp_path: Path) -> None:
    inline = load_settings({**SECURE, "ADPIPE_HOME": str(tmp_path), "ADPIPE_KAFKA_PASSWORD": "inline-S3cret"})
    from_file = load_settings(_secure(tmp_path))
    for settings, secret in ((inline, "inline-S3cret"), (from_file, "pa ss")):
        assert secret in settings.kafka.client_config()["sasl.password"]  # it is used...
        shown = [repr(settings), str(settings), repr(settings.kafka), settings.kafka.describe(), repr(settings.regions)]
        assert not [s for s in shown if secret in s]  # ...and never shown
    assert from_file.kafka.describe() == "127.0.0.1:9092 (SASL_SSL, SCRAM-SHA-512 as stream)"


def test_no_other_secret_of_the_settings_is_in_their_repr() -> None:
    settings = load_settings(
        {
            "ADPIPE_PG_PASSWORD": "pg-S3cret",
            "ADPIPE_BUDGET_DB": "postgresql+psycopg2://u:db-S3cret@h:5432/b",
            "ADPIPE_ALERT_WEBHOOK": "https://hooks.example/T0/hook-S3cret",
        }
    )
    assert settings.pg_password == "pg-S3cret" and "db-S3cret" in settings.budget_db
    assert "S3cret" not in repr(settings)


def test_local_defaults_password_file_of_the_user_and_the_local_ca_when_it_exists(tmp_path: Path) -> None:
    env = {"ADPIPE_HOME": str(tmp_path), **SECURE}
    settings = load_settings(env)
    assert settings.kafka_credentials.password_file == str(tmp_path / "kafka" / "secrets" / "stream.password")
    assert settings.kafka_credentials.ca_file == ""  # no local CA: the system's trust store
    (tmp_path / "kafka" / "tls").mkdir(parents=True)
    (tmp_path / "kafka" / "tls" / "ca.pem").write_text("x")
    assert load_settings(env).kafka_credentials.ca_file == str(tmp_path / "kafka" / "tls" / "ca.pem")


def test_security_settings_are_checked() -> None:
    with pytest.raises(SettingsError, match="ADPIPE_KAFKA_SECURITY='ssl' must be one of plaintext, sasl_ssl"):
        load_settings({"ADPIPE_KAFKA_SECURITY": "ssl"})
    with pytest.raises(SettingsError, match="sasl_ssl needs ADPIPE_KAFKA_USERNAME"):
        load_settings({"ADPIPE_KAFKA_SECURITY": "sasl_ssl"})


def test_a_missing_or_empty_password_file_is_a_clear_error_when_a_client_is_made(tmp_path: Path) -> None:
    settings = load_settings({**SECURE, "ADPIPE_KAFKA_PASSWORD_FILE": str(tmp_path / "nope")})
    with pytest.raises(SettingsError, match="password file .*nope cannot be read"):
        settings.kafka.client_config()
    (tmp_path / "empty").write_text("\n")
    empty = KafkaCredentials("sasl_ssl", "u", password_file=str(tmp_path / "empty"))
    with pytest.raises(SettingsError, match="is empty"):
        KafkaAccess("h:1", empty).spark_options()


def test_regions_take_this_process_credentials_or_their_own(tmp_path: Path) -> None:
    regions = [
        {"job_id": "eu"},
        {"job_id": "us", "kafka_bootstrap": "us:9092", "kafka_username": "reader-us"},
        {"job_id": "ap", "kafka_bootstrap": "ap:9092", "kafka_security": "plaintext"},
    ]
    settings = load_settings({**_secure(tmp_path), "ADPIPE_REGIONS": json.dumps(regions)})
    eu, us, ap = settings.regions
    assert eu.kafka_credentials == settings.kafka_credentials
    assert us.kafka.credentials.username == "reader-us"
    assert us.kafka.credentials.password_file == str(tmp_path / "home" / "kafka" / "secrets" / "reader-us.password")
    assert us.kafka.credentials.ca_file == str(tmp_path / "ca.pem")
    assert not ap.kafka.secure and ap.kafka.client_config() == {"bootstrap.servers": "ap:9092"}
    # A region's settings carry its credentials to every client made from them.
    assert settings.for_region(us).kafka == us.kafka
    with pytest.raises(SettingsError, match="unknown keys \\['kafka_password'\\]"):
        load_settings({"ADPIPE_REGIONS": json.dumps([{"job_id": "x", "kafka_password": "inline"}])})


def test_only_the_settings_build_kafka_client_configurations() -> None:
    """Every client takes its configuration from KafkaAccess (bootstrap and
    credentials together): no module sets bootstrap.servers by itself."""
    offenders = []
    # The bench's peer programs run in environments of their own, without
    # adpipe: the driver passes them the bootstrap from the settings.
    peers = PROJECT_ROOT / "bench" / "peers"
    for path in sorted([*(PROJECT_ROOT / "include" / "adpipe").rglob("*.py"), *(PROJECT_ROOT / "bench").rglob("*.py")]):
        if path.name == "kafka_access.py" or peers in path.parents:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"""["'](kafka\.)?bootstrap\.servers["']""", line):
                offenders.append(f"{path.relative_to(PROJECT_ROOT)}:{number}: {line.strip()}")
    assert offenders == []
