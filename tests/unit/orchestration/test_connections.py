"""A task's settings from its Airflow Connections (adpipe.orchestration.
connections), read through the providers' hooks from ``AIRFLOW_CONN_*``
variables (Airflow's environment secrets backend): each field's mapping,
the Connections winning over the worker's environment, what stays with the
environment when a Connection is missing, Connections adpipe refuses, the
secrets registered with Airflow's masker, and the Connections that
``make airflow`` and docker-compose give Airflow mapping back to the
settings they were built from."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from adpipe.settings import Settings, SettingsError, load_settings

CONN_VARS = ("AIRFLOW_CONN_ADPIPE_KAFKA", "AIRFLOW_CONN_ADPIPE_METASTORE_DB", "AIRFLOW_CONN_ADPIPE_BUDGET_DB",
             "AIRFLOW_CONN_ADPIPE_SPARK", "AIRFLOW_CONN_ADPIPE_SPARK_CONNECT")


@pytest.fixture(autouse=True)
def no_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CONN_VARS:
        monkeypatch.delenv(name, raising=False)


def _set(monkeypatch: pytest.MonkeyPatch, **connections: dict) -> None:
    for conn_id, body in connections.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))


def _pg(login: str, password: str, schema: str, port: int = 6543) -> dict:
    return {"conn_type": "postgres", "host": "db.internal", "port": port, "login": login, "password": password,
            "schema": schema}


def _secure_kafka(password: str, **more: str) -> dict:
    return {"conn_type": "kafka", "extra": {
        "bootstrap.servers": "k1:9093,k2:9093", "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "airflow", "sasl.password": password, "ssl.ca.location": "/etc/kafka/ca.pem", **more}}


def test_every_connection_maps_to_its_settings_over_the_workers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from adpipe.orchestration.connections import task_settings

    _set(
        monkeypatch,
        adpipe_kafka=_secure_kafka("k@fka/pass word"),
        adpipe_metastore_db=_pg("hive", "m%tastore:pw", "ms_prod"),
        adpipe_budget_db=_pg("budget", "b@d/get pw", "budget_prod", port=6544),
        adpipe_spark={"conn_type": "spark", "host": "spark://master.internal", "port": 7077},
        adpipe_spark_connect={"conn_type": "spark_connect", "host": "connect-a.internal", "port": 15010,
                              "extra": {"urls": ["sc://connect-b.internal:15011"]}},
    )
    worker = {"ADPIPE_KAFKA_BOOTSTRAP": "127.0.0.1:1", "ADPIPE_KAFKA_PASSWORD_FILE": "/nowhere", "ADPIPE_PG_PORT": "1",
              "ADPIPE_BUDGET_DB": "sqlite:////tmp/x.db", "ADPIPE_SPARK_MASTER": "local[1]", "ADPIPE_JOB_ID": "r1",
              "ADPIPE_SPARK_CONNECT": "sc://127.0.0.1:1"}
    s = task_settings({**worker})
    assert s.kafka.bootstrap == "k1:9093,k2:9093"
    c = s.kafka_credentials
    assert (c.security, c.username, c.password_file, c.ca_file) == ("sasl_ssl", "airflow", "", "/etc/kafka/ca.pem")
    assert c.secret() == "k@fka/pass word"
    assert s.kafka.client_config()["sasl.password"] == "k@fka/pass word"
    assert (s.pg_host, s.pg_port, s.pg_user, s.pg_password) == ("db.internal", 6543, "hive", "m%tastore:pw")
    assert s.metastore_database == "ms_prod"
    assert s.jdbc_url(s.metastore_database) == "jdbc:postgresql://db.internal:6543/ms_prod"
    # The budget URL: psycopg2 (the provider's default is psycopg 3 when installed), the password quoted.
    import sqlalchemy as sa

    url = sa.engine.make_url(s.budget_db)
    assert s.budget_db.startswith("postgresql+psycopg2://budget:b%40d%2Fget")
    assert (url.host, url.port, url.username, url.password, url.database) == (
        "db.internal", 6544, "budget", "b@d/get pw", "budget_prod")
    assert s.spark_master == "spark://master.internal:7077"
    assert s.spark_connect == "sc://connect-a.internal:15010,sc://connect-b.internal:15011"
    assert s.job_id == "r1"  # what no Connection gives stays the environment's


def test_a_plaintext_kafka_connection_replaces_every_kafka_setting_of_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from adpipe.orchestration.connections import task_settings

    _set(monkeypatch, adpipe_kafka={"conn_type": "kafka", "extra": {"bootstrap.servers": "k1:9092"}})
    s = task_settings({"ADPIPE_KAFKA_SECURITY": "sasl_ssl", "ADPIPE_KAFKA_USERNAME": "stream",
                       "ADPIPE_KAFKA_PASSWORD": "from-the-env"})
    assert s.kafka.bootstrap == "k1:9092" and not s.kafka.secure
    assert s.kafka.client_config() == {"bootstrap.servers": "k1:9092"}


def test_without_connections_the_environment_decides_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from adpipe.orchestration.connections import connection_env, task_settings

    env = {"ADPIPE_KAFKA_BOOTSTRAP": "127.0.0.1:29092", "ADPIPE_PG_PORT": "29094", "ADPIPE_SPARK_MASTER": "local[1]"}
    with caplog.at_level(logging.INFO, logger="adpipe.orchestration.connections"):
        assert connection_env() == {}
    assert (
        "no Airflow Connection adpipe_kafka, adpipe_metastore_db, adpipe_budget_db, adpipe_spark, adpipe_spark_connect"
        in caplog.text
    )
    env["ADPIPE_SPARK_CONNECT"] = "sc://10.0.0.5:15002"
    s = task_settings(env)
    assert (s.kafka_bootstrap, s.pg_port, s.spark_master) == ("127.0.0.1:29092", 29094, "local[1]")
    assert s.spark_connect == "sc://10.0.0.5:15002"
    # One defined, the others not: only its settings change.
    _set(monkeypatch, adpipe_spark={"conn_type": "spark", "host": "local[2]"})
    s = task_settings(env)
    assert (s.kafka_bootstrap, s.pg_port, s.spark_master) == ("127.0.0.1:29092", 29094, "local[2]")


@pytest.mark.parametrize(
    ("body", "master"),
    [
        ({"conn_type": "spark", "host": "local[2]"}, "local[2]"),
        ({"conn_type": "spark", "host": "spark://m1:7077,m2:7077"}, "spark://m1:7077,m2:7077"),
        ({"conn_type": "spark", "host": "m1", "port": 7077}, "spark://m1:7077"),
        ({"conn_type": "spark", "host": "yarn"}, "yarn"),
        ({"conn_type": "spark", "host": "k8s://https://api.internal", "port": 6443}, "k8s://https://api.internal:6443"),
    ],
)
def test_the_spark_master_is_read_as_the_spark_provider_reads_it(
    monkeypatch: pytest.MonkeyPatch, body: dict, master: str
) -> None:
    from adpipe.orchestration.connections import connection_env

    _set(monkeypatch, adpipe_spark=body)
    assert connection_env()["ADPIPE_SPARK_MASTER"] == master


@pytest.mark.parametrize(
    ("body", "servers"),
    [
        ({"conn_type": "spark_connect", "host": "connect.internal", "port": 15010}, "sc://connect.internal:15010"),
        # No port: Spark's own, 15002.
        ({"conn_type": "spark_connect", "host": "connect.internal"}, "sc://connect.internal:15002"),
        # The host with its scheme, as the Spark provider takes it.
        ({"conn_type": "spark_connect", "host": "sc://connect.internal", "port": 15010}, "sc://connect.internal:15010"),
        ({"conn_type": "spark_connect", "host": "sc://connect.internal:15010"}, "sc://connect.internal:15010"),
        # More servers in the extra's urls, after the host's, each once, in order.
        ({"conn_type": "spark_connect", "host": "10.0.0.5", "port": 15002,
          "extra": {"urls": ["sc://10.0.0.6:15002", "sc://10.0.0.5:15002", "sc://10.0.0.7:15003"]}},
         "sc://10.0.0.5:15002,sc://10.0.0.6:15002,sc://10.0.0.7:15003"),
        ({"conn_type": "spark_connect", "extra": {"urls": "sc://10.0.0.6:15002, sc://10.0.0.5:15002"}},
         "sc://10.0.0.6:15002,sc://10.0.0.5:15002"),
        ({"conn_type": "spark_connect", "host": "[fd00::5]", "port": 15002}, "sc://[fd00::5]:15002"),
        # use_ssl off is no TLS asked for.
        ({"conn_type": "spark_connect", "host": "c", "port": 1, "extra": {"use_ssl": False}}, "sc://c:1"),
    ],
)
def test_the_spark_connect_servers_are_read_from_their_connection(
    monkeypatch: pytest.MonkeyPatch, body: dict, servers: str
) -> None:
    from adpipe.orchestration.connections import connection_env, task_settings

    _set(monkeypatch, adpipe_spark_connect=body)
    assert connection_env() == {"ADPIPE_SPARK_CONNECT": servers}
    assert task_settings({"ADPIPE_SPARK_CONNECT": "sc://127.0.0.1:1"}).spark_connect == servers


def test_the_default_spark_connect_port_is_the_one_the_servers_use() -> None:
    from adpipe.orchestration.connections import SPARK_CONNECT_PORT
    from adpipe.spark import DEFAULT_CONNECT_PORT

    assert SPARK_CONNECT_PORT == DEFAULT_CONNECT_PORT == 15002


def test_a_uri_connection_is_read_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """A secrets backend often holds URIs: the same fields, the same settings."""
    from adpipe.orchestration.connections import task_settings

    monkeypatch.setenv("AIRFLOW_CONN_ADPIPE_METASTORE_DB", "postgresql://hive:s3cr%2Ft@db.internal:6543/ms_prod")
    monkeypatch.setenv("AIRFLOW_CONN_ADPIPE_SPARK", "spark://master.internal:7077")
    # Airflow reads the scheme spark-connect as the type spark_connect.
    monkeypatch.setenv("AIRFLOW_CONN_ADPIPE_SPARK_CONNECT", "spark-connect://connect.internal:15010")
    s = task_settings({})
    assert (s.pg_host, s.pg_port, s.pg_user, s.pg_password, s.metastore_database) == (
        "db.internal", 6543, "hive", "s3cr/t", "ms_prod")
    assert s.spark_master == "spark://master.internal:7077"
    assert s.spark_connect == "sc://connect.internal:15010"


@pytest.mark.parametrize(
    ("conn_id", "body", "message"),
    [
        ("adpipe_kafka", {"conn_type": "kafka", "extra": {"group.id": "x"}}, "no bootstrap.servers"),
        ("adpipe_kafka", _secure_kafka("pw-123456", **{"sasl.mechanisms": "PLAIN"}), "sasl.mechanisms=PLAIN"),
        ("adpipe_kafka", {"conn_type": "kafka", "extra": {"bootstrap.servers": "k:1", "security.protocol": "SSL"}},
         "security.protocol=SSL"),
        ("adpipe_metastore_db", {"conn_type": "mysql", "host": "db"}, "type 'mysql', not postgres"),
        ("adpipe_budget_db", {"conn_type": "mysql", "host": "db"}, "type 'mysql', not postgres or sqlite"),
        ("adpipe_spark_connect", {"conn_type": "spark", "host": "c", "port": 15002}, "type 'spark', not spark_connect"),
        ("adpipe_spark_connect", {"conn_type": "spark_connect"}, "names no server"),
        ("adpipe_spark_connect", {"conn_type": "spark_connect", "host": "c", "password": "tok-123"}, "a token"),
        ("adpipe_spark_connect", {"conn_type": "spark_connect", "host": "c", "login": "u"}, "a user"),
        ("adpipe_spark_connect", {"conn_type": "spark_connect", "host": "c", "extra": {"use_ssl": True}}, "use_ssl"),
        ("adpipe_spark_connect", {"conn_type": "spark_connect", "extra": {"urls": ["grpc://c:15002"]}},
         "'grpc://c:15002' is not a Spark Connect server's sc://host:port"),
        ("adpipe_spark_connect", {"conn_type": "spark_connect", "host": "sc://c:port"}, "port"),
    ],
)
def test_a_connection_adpipe_cannot_use_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, conn_id: str, body: dict, message: str
) -> None:
    from adpipe.orchestration.connections import connection_env

    _set(monkeypatch, **{conn_id: body})
    with pytest.raises(SettingsError, match=f"Connection '{conn_id}'.*{message}"):
        connection_env()


def test_every_secret_of_a_connection_is_masked_in_task_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    from adpipe.orchestration.connections import connection_env
    from airflow.sdk._shared.secrets_masker import redact

    kafka_pw, ms_pw, budget_pw = "kafka-pw-91b2", "metastore-pw-77ac", "b@dget-pw/3e"
    _set(monkeypatch, adpipe_kafka=_secure_kafka(kafka_pw), adpipe_metastore_db=_pg("hive", ms_pw, "ms"),
         adpipe_budget_db=_pg("budget", budget_pw, "b"))
    env = connection_env()
    line = f"kafka {kafka_pw}; metastore {ms_pw}; budget url {env['ADPIPE_BUDGET_DB']}; budget {budget_pw}"
    shown = redact(line)
    for secret in (kafka_pw, ms_pw, budget_pw, "b%40dget-pw%2F3e"):
        assert secret not in shown, shown
    assert shown.count("***") == 4, shown


def _round_trip(monkeypatch: pytest.MonkeyPatch, connections: dict[str, str], worker: dict[str, str]) -> Settings:
    from adpipe.orchestration.connections import task_settings

    for name, value in connections.items():
        monkeypatch.setenv(name, value)
    return task_settings(worker)


def _same_addresses(a: Settings, b: Settings) -> None:
    # The password inline rather than in a file: the same client configuration.
    assert a.kafka.client_config() == b.kafka.client_config()
    assert a.kafka.spark_options() == b.kafka.spark_options()
    assert (a.pg_host, a.pg_port, a.pg_user, a.pg_password) == (b.pg_host, b.pg_port, b.pg_user, b.pg_password)
    assert (a.metastore_database, a.budget_db, a.spark_master) == (b.metastore_database, b.budget_db, b.spark_master)
    assert a.spark_connect == b.spark_connect


def test_the_connections_make_airflow_gives_map_back_to_its_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.local.airflow import connections_env

    secret = tmp_path / "airflow.password"
    secret.write_text("from-a-file-6c1e\n")
    env = {
        "ADPIPE_HOME": str(tmp_path), "ADPIPE_KAFKA_BOOTSTRAP": "127.0.0.1:39092", "ADPIPE_KAFKA_SECURITY": "sasl_ssl",
        "ADPIPE_KAFKA_USERNAME": "airflow", "ADPIPE_KAFKA_PASSWORD_FILE": str(secret), "ADPIPE_PG_PORT": "39094",
        "ADPIPE_PG_PASSWORD": "pg-pw-5d", "ADPIPE_METASTORE_DATABASE": "ms_x", "ADPIPE_SPARK_MASTER": "local[1]",
        "ADPIPE_BUDGET_DB": "postgresql+psycopg2://adpipe:pg-pw-5d@127.0.0.1:39094/budget_x",
    }
    settings = load_settings(env)
    # The worker has nothing but its home: every address and credential is a Connection's.
    from_connections = _round_trip(monkeypatch, connections_env(settings), {"ADPIPE_HOME": str(tmp_path)})
    _same_addresses(from_connections, settings)
    assert from_connections.kafka_credentials.password == "from-a-file-6c1e"  # inline now, from the Connection


@pytest.mark.parametrize(
    "servers", ["", "sc://10.0.0.5:15002", "sc://10.0.0.5:15002,sc://10.0.0.6:15003,sc://[fd00::7]:15002"]
)
def test_the_spark_connect_connection_make_airflow_gives_maps_back_to_its_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: str
) -> None:
    from adpipe.local.airflow import connections_env

    settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_SPARK_CONNECT": servers})
    made = connections_env(settings)
    # Only a deployment with servers has the Connection: without, the steps use warm load drivers.
    assert ("AIRFLOW_CONN_ADPIPE_SPARK_CONNECT" in made) == bool(servers)
    from_connections = _round_trip(monkeypatch, made, {"ADPIPE_HOME": str(tmp_path)})
    assert from_connections.spark_connect == servers


def test_docker_composes_airflow_reaches_what_the_other_services_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml
    from adpipe.settings import PROJECT_ROOT

    services = yaml.safe_load((PROJECT_ROOT / "docker-compose.yaml").read_text())["services"]
    scheduler = {k: str(v) for k, v in services["airflow-scheduler"]["environment"].items()}
    stream = load_settings({k: str(v) for k, v in services["stream"]["environment"].items()})
    connections = {k: v for k, v in scheduler.items() if k.startswith("AIRFLOW_CONN_")}
    worker = {k: v for k, v in scheduler.items() if k.startswith("ADPIPE_")}
    _same_addresses(_round_trip(monkeypatch, connections, worker), stream)
