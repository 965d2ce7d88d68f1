"""Where a task's addresses and credentials come from under Airflow: its
Connections, read through the providers' own hooks, so that a secrets
backend (or ``AIRFLOW_CONN_*`` variables) can supply them; the command line
keeps its environment settings.

========================  =============  ==============================================
Connection                type           adpipe settings it gives
========================  =============  ==============================================
``adpipe_kafka``          kafka          its extra, librdkafka's settings:
                                         ``bootstrap.servers`` -> ADPIPE_KAFKA_BOOTSTRAP;
                                         ``security.protocol`` (PLAINTEXT or SASL_SSL)
                                         -> ADPIPE_KAFKA_SECURITY; ``sasl.mechanisms``
                                         (SCRAM-SHA-512 only); ``sasl.username``,
                                         ``sasl.password``, ``ssl.ca.location`` ->
                                         ADPIPE_KAFKA_USERNAME, _PASSWORD, _CA_FILE
``adpipe_metastore_db``   postgres       host, port, login, password -> ADPIPE_PG_HOST,
                                         _PORT, _USER, _PASSWORD (the PostgreSQL
                                         server); schema -> ADPIPE_METASTORE_DATABASE
``adpipe_budget_db``      postgres       the SQLAlchemy URL (``postgresql+psycopg2``)
                          (sqlite)       -> ADPIPE_BUDGET_DB (sqlite: host is the file)
``adpipe_spark``          spark          the master (host, or ``<type>://host:port``,
                                         as the Spark provider reads it) ->
                                         ADPIPE_SPARK_MASTER
``adpipe_spark_connect``  spark_connect  the load's Spark Connect servers ->
                                         ADPIPE_SPARK_CONNECT: host and port
                                         (``sc://host:port``; port 15002 when none),
                                         then its extra's ``urls`` (a list, or
                                         comma-separated ``sc://host:port``), in the
                                         order clients try them; no user, token or TLS
                                         (adpipe's servers take none)
========================  =============  ==============================================

A Connection that is not defined leaves those settings to the worker's
environment (logged once per task). A Connection's values win over the
environment's, all of its group at once: a plaintext ``adpipe_kafka`` clears
any ``ADPIPE_KAFKA_USERNAME`` the worker has.

The settings are built by :func:`adpipe.settings.load_settings`, the one
reader of configuration, from the worker's environment with these values
laid over it (:func:`task_env`); the same mapping is the environment of the
processes a task starts (the stream driver, the warm load driver, ``adpipe
verify``, spark-submit), so they see what the task sees. Every secret taken
from a Connection is registered with Airflow's secrets masker, so a task log
shows it as ``***`` wherever it appears, inside a URL too."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from adpipe.kafka_access import KAFKA_ENV, access_env
from adpipe.settings import Settings, SettingsError, load_settings

log = logging.getLogger(__name__)

KAFKA = "adpipe_kafka"
METASTORE_DB = "adpipe_metastore_db"
BUDGET_DB = "adpipe_budget_db"
SPARK = "adpipe_spark"
SPARK_CONNECT = "adpipe_spark_connect"
CONNECTION_IDS = (KAFKA, METASTORE_DB, BUDGET_DB, SPARK, SPARK_CONNECT)
# The budget service and the metastore's set-up use psycopg2.
SQLALCHEMY_SCHEME = "postgresql+psycopg2"
POSTGRES = ("postgres", "postgresql")
# Spark's own Spark Connect port (adpipe.spark.DEFAULT_CONNECT_PORT, not
# imported here: that would import pyspark into every task).
SPARK_CONNECT_PORT = 15002

# What each Connection replaces, whole: these variables of the worker's
# environment are never mixed with a Connection's values.
REPLACES = {
    KAFKA: KAFKA_ENV,
    METASTORE_DB: ("ADPIPE_PG_HOST", "ADPIPE_PG_PORT", "ADPIPE_PG_USER", "ADPIPE_PG_PASSWORD",
                   "ADPIPE_METASTORE_DATABASE"),
    BUDGET_DB: ("ADPIPE_BUDGET_DB",),
    SPARK: ("ADPIPE_SPARK_MASTER",),
    SPARK_CONNECT: ("ADPIPE_SPARK_CONNECT",),
}


class UnusableConnection(SettingsError):
    """A Connection adpipe cannot use (a type or a setting it does not take)."""


def _mask(secret: str) -> None:
    """Hide ``secret`` in every task log line (Airflow's masker)."""
    if secret:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)


def _get(hook_class: Any, conn_id: str) -> Any | None:
    """The Connection through ``hook_class`` (a provider's hook: its
    secrets backends, env variables, the API server), or None when undefined."""
    from airflow.exceptions import AirflowNotFoundException

    try:
        return hook_class.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def kafka_env(extra: Mapping[str, Any]) -> dict[str, str]:
    """``adpipe_kafka``'s extra (librdkafka settings, as the Kafka provider
    keeps them) as ``ADPIPE_KAFKA_*`` values (adpipe.kafka_access.access_env)."""
    try:
        env = access_env(extra, f"Connection {KAFKA!r}")
    except SettingsError as exc:
        raise UnusableConnection(str(exc)) from None
    _mask(env["ADPIPE_KAFKA_PASSWORD"])
    return env


def _postgres_url(conn_id: str) -> Any:
    """The Connection's SQLAlchemy URL, built by the Postgres provider's hook
    (its IAM tokens and ``sqlalchemy_query`` included)."""
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    url = PostgresHook(postgres_conn_id=conn_id, sqlalchemy_scheme=SQLALCHEMY_SCHEME).sqlalchemy_url
    _mask(url.password or "")
    return url


def metastore_env(conn: Any) -> dict[str, str]:
    """``adpipe_metastore_db`` as the PostgreSQL server's ``ADPIPE_PG_*`` and
    the metastore's database."""
    if conn.conn_type not in POSTGRES:
        raise UnusableConnection(f"Connection {METASTORE_DB!r} is of type {conn.conn_type!r}, not postgres")
    url = _postgres_url(METASTORE_DB)
    env = {
        "ADPIPE_PG_HOST": url.host or "",
        "ADPIPE_PG_PORT": str(url.port or 5432),
        "ADPIPE_PG_USER": url.username or "",
        "ADPIPE_PG_PASSWORD": url.password or "",
    }
    if url.database:
        env["ADPIPE_METASTORE_DATABASE"] = url.database
    return env


def budget_db_env(conn: Any) -> dict[str, str]:
    """``adpipe_budget_db`` as ``ADPIPE_BUDGET_DB``."""
    if conn.conn_type == "sqlite":
        return {"ADPIPE_BUDGET_DB": f"sqlite:///{conn.host}"}
    if conn.conn_type not in POSTGRES:
        raise UnusableConnection(f"Connection {BUDGET_DB!r} is of type {conn.conn_type!r}, not postgres or sqlite")
    url = _postgres_url(BUDGET_DB).render_as_string(hide_password=False)
    _mask(url)
    return {"ADPIPE_BUDGET_DB": url}


def spark_master(conn: Any) -> str:
    """The master of a Spark Connection, read as the Spark provider reads it:
    the host when it holds a whole master (``local[2]``, ``spark://h:7077``)
    or there is no port; else ``<conn_type>://host:port``."""
    if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
        master = conn.host
    else:
        master = f"{conn.conn_type}://{conn.host or ''}"
    return f"{master}:{conn.port}" if conn.port else master


def spark_connect_urls(conn: Any) -> str:
    """``adpipe_spark_connect`` as ``ADPIPE_SPARK_CONNECT``: the server at its
    host and port (the host may hold its ``sc://``; Spark's port 15002 when
    there is none), then those of its extra's ``urls`` (a list, or one
    comma-separated string), each once, in the order clients try them."""
    from adpipe.setting_values import connect_urls

    where = f"Connection {SPARK_CONNECT!r}"
    if conn.conn_type != "spark_connect":
        raise UnusableConnection(f"{where} is of type {conn.conn_type!r}, not spark_connect")
    extra = conn.extra_dejson
    if conn.login or conn.password or str(extra.get("use_ssl", "")).lower() not in ("", "false", "0"):
        raise UnusableConnection(f"{where} has a user, a token or use_ssl: adpipe's Spark Connect servers take none")
    urls = []
    try:
        if conn.host:
            host = conn.host if "://" in conn.host else f"sc://{conn.host}"
            if conn.port or urlparse(host).port is None:
                host = f"{host}:{conn.port or SPARK_CONNECT_PORT}"
            urls.append(host)
        more = extra.get("urls") or []
        urls += [str(u).strip() for u in (more.split(",") if isinstance(more, str) else more)]
        if not any(urls):
            raise UnusableConnection(f"{where} names no server: a host, or sc://host:port in its extra's urls")
        return connect_urls(
            {"ADPIPE_SPARK_CONNECT": ",".join(dict.fromkeys(u for u in urls if u))}, "ADPIPE_SPARK_CONNECT"
        )
    except UnusableConnection:
        raise
    except (SettingsError, ValueError) as exc:
        raise UnusableConnection(f"{where}: {exc}") from None


def connection_env() -> dict[str, str]:
    """The ``ADPIPE_*`` values of every adpipe Connection that is defined."""
    from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    env: dict[str, str] = {}
    missing = []
    kafka = _get(KafkaBaseHook, KAFKA)
    if kafka is None:
        missing.append(KAFKA)
    else:
        env.update(kafka_env(kafka.extra_dejson))
    for conn_id, to_env in ((METASTORE_DB, metastore_env), (BUDGET_DB, budget_db_env)):
        conn = _get(PostgresHook, conn_id)
        if conn is None:
            missing.append(conn_id)
        else:
            env.update(to_env(conn))
    spark = _get(SparkSubmitHook, SPARK)
    if spark is None:
        missing.append(SPARK)
    else:
        env["ADPIPE_SPARK_MASTER"] = spark_master(spark)
    spark_connect = _get(SparkConnectHook, SPARK_CONNECT)
    if spark_connect is None:
        missing.append(SPARK_CONNECT)
    else:
        env["ADPIPE_SPARK_CONNECT"] = spark_connect_urls(spark_connect)
    if missing:
        log.info("no Airflow Connection %s: those settings come from the environment", ", ".join(missing))
    return env


def task_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a task's settings are read from, and the one the
    processes it starts get: ``base`` (this process's) with the Connections'
    values over it."""
    return {**(os.environ if base is None else base), **connection_env()}


def task_settings(base: Mapping[str, str] | None = None) -> Settings:
    """The settings of a task under Airflow: :func:`task_env`'s (a caller
    that has that environment already reads it with ``load_settings``)."""
    return load_settings(task_env(base))
