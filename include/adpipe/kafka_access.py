"""How a client reaches Kafka, as the settings describe it: the contract's
topic names (:class:`Topics`), who the client is (:class:`KafkaCredentials`:
nobody, or a SASL/SCRAM-SHA-512 user over TLS), the cluster with those
credentials (:class:`KafkaAccess`, from which every adpipe client takes its
configuration) and one region's stream job (:class:`Region`).

Plain frozen dataclasses, no Kafka client library: :mod:`adpipe.settings`
builds them from the environment, :mod:`adpipe.kafka_io` and Spark's Kafka
source configure their clients from them. No other adpipe module sets
``bootstrap.servers`` (``tests/unit/test_kafka_access.py`` checks)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from adpipe.setting_values import SettingsError


@dataclass(frozen=True)
class Topics:
    """Kafka topic names of the contract (each overridable)."""

    events: str = "ad-events"
    aggregates: str = "ad-aggregates"
    dlq: str = "ad-events-dlq"
    late: str = "ad-events-late"
    budget_events: str = "ad-budget-events"

    def all(self) -> tuple[str, ...]:
        return (self.events, self.aggregates, self.dlq, self.late, self.budget_events)


# How clients reach Kafka (ADPIPE_KAFKA_SECURITY): without credentials, or
# SASL/SCRAM-SHA-512 over TLS.
KAFKA_SECURITY = ("plaintext", "sasl_ssl")
SCRAM_MECHANISM = "SCRAM-SHA-512"
# Spark reads bounded offset ranges (a micro-batch, a load's range). Under
# read_committed a partition's range often ends on a transaction marker, no
# record: its task's last fetch finds nothing and the broker holds it for
# fetch.max.wait.ms (500 ms by default), once per partition and batch. A
# fetch that finds data returns at once whatever this is.
SPARK_FETCH_MAX_WAIT_MS = 10
# Spark's Java clients give up a call after this long (Kafka's default is
# 60 s; Spark then asks again, a second later). A partition whose leader died
# keeps the driver's offset request "waiting for a node assignment" until
# its timeout, even after a new leader is elected: with 60 s, a micro-batch
# waited a minute after a broker's death (`make bench ARGS="--failover
# --part broker"`). The request timeout may not exceed it.
SPARK_API_TIMEOUT_MS = 15_000


def local_kafka_password_file(home: Path, username: str) -> Path:
    """Where ``adpipe kafka up --secure`` keeps a user's password (0600)."""
    return home / "kafka" / "secrets" / f"{username}.password"


def local_kafka_ca_file(home: Path) -> Path:
    """The PEM certificate of the local secure broker's own CA."""
    return home / "kafka" / "tls" / "ca.pem"


def _jaas_quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class KafkaCredentials:
    """Who a client is to a Kafka cluster: nobody (``plaintext``), or a
    SASL/SCRAM-SHA-512 user over TLS (``sasl_ssl``), its password given
    inline or, better, in a file read when a client is configured, and the
    PEM file of the CA that signed the brokers' certificates (empty: the
    system's trust store). The password never shows in ``repr``."""

    security: str = "plaintext"
    username: str = ""
    password: str = field(default="", repr=False)
    password_file: str = ""
    ca_file: str = ""

    @property
    def secure(self) -> bool:
        return self.security == "sasl_ssl"

    def secret(self) -> str:
        """The password (from the file, read now, when not given inline)."""
        if self.password:
            return self.password
        if not self.password_file:
            raise SettingsError(
                f"Kafka user {self.username!r} has no password: set ADPIPE_KAFKA_PASSWORD_FILE "
                "(or ADPIPE_KAFKA_PASSWORD)"
            )
        try:
            value = Path(self.password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise SettingsError(f"the Kafka password file {self.password_file} cannot be read: {exc.strerror}") from exc
        if not value:
            raise SettingsError(f"the Kafka password file {self.password_file} is empty")
        return value


@dataclass(frozen=True)
class KafkaAccess:
    """One Kafka cluster as a client reaches it: its bootstrap addresses and
    the credentials. Every adpipe client is configured from one of these:
    :meth:`client_config` (confluent-kafka / librdkafka) and
    :meth:`spark_options` (Spark's Kafka source, the Java client)."""

    bootstrap: str
    credentials: KafkaCredentials = field(default_factory=KafkaCredentials)

    @property
    def secure(self) -> bool:
        return self.credentials.secure

    def describe(self) -> str:
        """Where and as whom, never the password."""
        c = self.credentials
        return f"{self.bootstrap} (SASL_SSL, {SCRAM_MECHANISM} as {c.username})" if c.secure else self.bootstrap

    def client_config(self) -> dict[str, str]:
        """``bootstrap.servers`` and, on a secured cluster, the librdkafka
        security settings; a client adds its own settings to these."""
        config = {"bootstrap.servers": self.bootstrap}
        c = self.credentials
        if c.secure:
            config.update(
                {
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanisms": SCRAM_MECHANISM,
                    "sasl.username": c.username,
                    "sasl.password": c.secret(),
                }
            )
            if c.ca_file:
                config["ssl.ca.location"] = c.ca_file
        return config

    def spark_options(self) -> dict[str, str]:
        """The same for Spark's Kafka source (``kafka.``-prefixed Java client
        settings). Spark redacts an option whose value names a password from
        its plans and logs; the Java client logs ``sasl.jaas.config`` hidden."""
        options = {
            "kafka.bootstrap.servers": self.bootstrap,
            "kafka.fetch.max.wait.ms": str(SPARK_FETCH_MAX_WAIT_MS),
            "kafka.default.api.timeout.ms": str(SPARK_API_TIMEOUT_MS),
            "kafka.request.timeout.ms": str(SPARK_API_TIMEOUT_MS),
        }
        c = self.credentials
        if c.secure:
            jaas = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f"username={_jaas_quoted(c.username)} password={_jaas_quoted(c.secret())};"
            )
            options.update(
                {
                    "kafka.security.protocol": "SASL_SSL",
                    "kafka.sasl.mechanism": SCRAM_MECHANISM,
                    "kafka.sasl.jaas.config": jaas,
                }
            )
            if c.ca_file:
                options.update({"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": c.ca_file})
        return options


# The variables a cluster's access is configured by (adpipe.settings reads them).
KAFKA_ENV = ("ADPIPE_KAFKA_BOOTSTRAP", "ADPIPE_KAFKA_SECURITY", "ADPIPE_KAFKA_USERNAME", "ADPIPE_KAFKA_PASSWORD",
             "ADPIPE_KAFKA_PASSWORD_FILE", "ADPIPE_KAFKA_CA_FILE")


def access_env(config: Mapping[str, object], source: str) -> dict[str, str]:
    """librdkafka settings, as :meth:`KafkaAccess.client_config` writes them
    (and Airflow's Kafka Connections keep them), read back as the
    ``ADPIPE_KAFKA_*`` values that give the same access: every one of
    :data:`KAFKA_ENV`, so none of another source's is left. ``source``
    names them in a refusal: a cluster reached otherwise than over
    PLAINTEXT or SASL_SSL with SCRAM-SHA-512."""
    bootstrap = str(config.get("bootstrap.servers") or "")
    if not bootstrap:
        raise SettingsError(f"{source}: no bootstrap.servers")
    env = dict.fromkeys(KAFKA_ENV, "")
    env["ADPIPE_KAFKA_BOOTSTRAP"] = bootstrap
    protocol = str(config.get("security.protocol") or "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        env["ADPIPE_KAFKA_SECURITY"] = "plaintext"
        return env
    mechanism = str(config.get("sasl.mechanisms") or config.get("sasl.mechanism") or "").upper()
    if protocol != "SASL_SSL" or mechanism != SCRAM_MECHANISM:
        raise SettingsError(
            f"{source}: security.protocol={protocol}, sasl.mechanisms={mechanism or None}; adpipe reaches Kafka "
            f"over PLAINTEXT or SASL_SSL with {SCRAM_MECHANISM}"
        )
    env.update(
        ADPIPE_KAFKA_SECURITY="sasl_ssl",
        ADPIPE_KAFKA_USERNAME=str(config.get("sasl.username") or ""),
        ADPIPE_KAFKA_PASSWORD=str(config.get("sasl.password") or ""),
        ADPIPE_KAFKA_CA_FILE=str(config.get("ssl.ca.location") or ""),
    )
    return env


@dataclass(frozen=True)
class Region:
    """One region's stream job as Union & Load sees it: its job id (which
    names its ledger group and record_uuid namespace), broker, topics and
    the credentials this process uses on that broker."""

    job_id: str
    kafka_bootstrap: str
    topics: Topics
    kafka_credentials: KafkaCredentials = field(default_factory=KafkaCredentials)

    @property
    def kafka(self) -> KafkaAccess:
        return KafkaAccess(self.kafka_bootstrap, self.kafka_credentials)


def kafka_credentials(
    home: Path,
    security: str,
    username: str,
    password: str,
    password_file: str,
    ca_file: str,
    names: tuple[str, str] = ("ADPIPE_KAFKA_SECURITY", "ADPIPE_KAFKA_USERNAME"),
) -> KafkaCredentials:
    """Credentials with the local defaults: the password file of
    ``adpipe kafka up --secure`` for the user, and its CA when it exists."""
    if security not in KAFKA_SECURITY:
        raise SettingsError(f"{names[0]}={security!r} must be one of {', '.join(KAFKA_SECURITY)}")
    if security == "plaintext":
        return KafkaCredentials()
    if not username:
        raise SettingsError(f"{names[0]}=sasl_ssl needs {names[1]}")
    if not password and not password_file:
        password_file = str(local_kafka_password_file(home, username))
    if not ca_file and local_kafka_ca_file(home).exists():
        ca_file = str(local_kafka_ca_file(home))
    return KafkaCredentials(security, username, password, password_file, ca_file)


def regions_of(
    raw: str, bootstrap: str, topics: Topics, credentials: KafkaCredentials, home: Path
) -> tuple[Region, ...]:
    """``ADPIPE_REGIONS``: a JSON list (or ``@file`` holding one) of objects
    with ``job_id`` and optionally ``kafka_bootstrap``, ``events``,
    ``aggregates``, ``dlq``, ``late``, and the credentials on that region's
    broker: ``kafka_security``, ``kafka_username``, ``kafka_password_file``,
    ``kafka_ca_file`` (defaults: this process's values; a password only in a
    file)."""
    if not raw.strip():
        return ()
    try:
        text = Path(raw[1:]).read_text() if raw.startswith("@") else raw
        items = json.loads(text)
    except (OSError, ValueError) as exc:
        raise SettingsError(f"ADPIPE_REGIONS is not a JSON list or @file of one: {exc}") from exc
    if not isinstance(items, list) or not all(isinstance(i, dict) and i.get("job_id") for i in items):
        raise SettingsError('ADPIPE_REGIONS must be a list of objects, each with a "job_id"')
    security_keys = {"kafka_security", "kafka_username", "kafka_password_file", "kafka_ca_file"}
    known = {"job_id", "kafka_bootstrap", "events", "aggregates", "dlq", "late"} | security_keys
    regions = []
    for item in items:
        unknown = set(item) - known
        if unknown:
            raise SettingsError(f"ADPIPE_REGIONS: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        region_topics = replace(topics, **{k: item[k] for k in ("events", "aggregates", "dlq", "late") if k in item})
        region_credentials = credentials
        if security_keys & set(item):
            # Another user on that broker: its own password file (never an
            # inline password in the list); the same user: the same password.
            username = item.get("kafka_username", credentials.username)
            same_user = username == credentials.username and "kafka_password_file" not in item
            region_credentials = kafka_credentials(
                home,
                item.get("kafka_security", credentials.security),
                username,
                credentials.password if same_user else "",
                item.get("kafka_password_file", credentials.password_file if same_user else ""),
                item.get("kafka_ca_file", credentials.ca_file),
                ("ADPIPE_REGIONS: kafka_security", "kafka_username"),
            )
        regions.append(
            Region(str(item["job_id"]), item.get("kafka_bootstrap", bootstrap), region_topics, region_credentials)
        )
    if len({r.job_id for r in regions}) != len(regions):
        raise SettingsError("ADPIPE_REGIONS: job_id values must be distinct")
    return tuple(regions)
