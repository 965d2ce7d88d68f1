"""The local broker's security, for ``adpipe kafka up --secure``: a broker
that lets no one in without a password, and each adpipe principal only as
far as its work needs.

* **TLS**: a CA of this home and a key for the brokers signed by it, made
  once with the JDK's ``keytool`` (keystore passwords passed in files, never
  on a command line). Clients verify the brokers with the CA's certificate,
  ``tls/ca.pem`` (``ADPIPE_KAFKA_CA_FILE``; the default when it exists).
* **Users**: SASL/SCRAM-SHA-512, one password per user, generated once into
  ``secrets/<user>.password`` (mode 0600, folder 0700): ``admin`` (the
  brokers themselves and ``adpipe kafka up``: the only super user),
  ``producer``, ``stream``, ``budget``, ``reader`` (verify, Union & Load) and
  ``airflow`` (the DAGs: the stream job, loads, verify). ``admin`` is
  written into the metadata when the storage is formatted (KRaft's
  ``--add-scram``, from an argument file, so the password is on no command
  line); the others are created through the admin API at every ``up``.
* **Listeners**: every one SASL_SSL on the nodes' own addresses (loopback by
  default). Clients and brokers authenticate with SCRAM-SHA-512; the
  controller listener with PLAIN against a user the broker configuration
  holds, because a controller must authenticate brokers before it has read
  any SCRAM credential from the metadata log. No listener takes a client
  without a password, so no listener has an anonymous super user.
* **ACLs** (:func:`acl_rules`): ``StandardAuthorizer`` with
  ``allow.everyone.if.no.acl.found=false``: a principal may do only what a
  rule allows. The broker's ``server.properties`` holds the admin and
  keystore passwords, and is written 0600.

Everything lives under ``$ADPIPE_HOME/kafka``: ``tls/`` and ``secrets/``."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from adpipe.kafka_io import PROBE_GROUPS, leadership_group, ledger_group
from adpipe.settings import (
    SCRAM_MECHANISM,
    KafkaAccess,
    KafkaCredentials,
    Settings,
    local_kafka_ca_file,
    local_kafka_password_file,
)

log = logging.getLogger(__name__)

ADMIN = "admin"
# Every user `kafka up --secure` makes, in the order `kafka up` lists them.
USERS = (ADMIN, "producer", "stream", "budget", "reader", "airflow")
SCRAM_ITERATIONS = 8192
# Prefix of the budget service's event publishers' transactional ids and
# ledger groups (adpipe.budget.producer: one per publisher id).
BUDGET_EVENTS_PREFIX = "adpipe-budget-events-"
# Prefix of the consumer groups Spark's Kafka source makes up (its
# groupIdPrefix defaults: spark-kafka-source, spark-kafka-relation).
SPARK_GROUP_PREFIX = "spark-kafka-"


class SecurityError(RuntimeError):
    """The local broker's TLS material or users could not be made."""


def tls_dir(settings: Settings) -> Path:
    return settings.kafka_dir / "tls"


def secrets_dir(settings: Settings) -> Path:
    return local_kafka_password_file(settings.home, ADMIN).parent


def ca_file(settings: Settings) -> Path:
    return local_kafka_ca_file(settings.home)


def keystore(settings: Settings) -> Path:
    return tls_dir(settings) / "broker.p12"


def _store_password_file(settings: Settings, name: str) -> Path:
    return secrets_dir(settings) / f"{name}.storepass"


def write_secret(path: Path, value: str) -> None:
    """A file only its owner may read, from its first byte on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")


def _secret(path: Path) -> str:
    return path.read_text().rstrip("\r\n")


def password(settings: Settings, user: str) -> str:
    return _secret(local_kafka_password_file(settings.home, user))


def ensure_passwords(settings: Settings) -> None:
    """A generated password per user and keystore, made once."""
    wanted = [local_kafka_password_file(settings.home, u) for u in USERS]
    wanted += [_store_password_file(settings, name) for name in ("ca", "broker")]
    for path in wanted:
        if not path.exists():
            write_secret(path, secrets.token_urlsafe(24))
        path.chmod(0o600)


def _keytool(*args: str) -> None:
    proc = subprocess.run(["keytool", *args], capture_output=True, text=True, check=False)  # noqa: S603, S607
    if proc.returncode != 0:
        raise SecurityError(f"keytool {args[0]} failed: {proc.stdout}{proc.stderr}")


def ensure_tls(settings: Settings, hosts: list[str]) -> None:
    """The CA and the brokers' keystore (made once), the key's certificate
    naming every node's host (an IP address or a name) and ``localhost``."""
    if keystore(settings).exists() and ca_file(settings).exists():
        return
    folder = tls_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    # Passwords from their files (-storepass:file), never on the command line.
    ca_store, ca_pass = folder / "ca.p12", ("-storepass:file", str(_store_password_file(settings, "ca")))
    ks, ks_pass = keystore(settings), ("-storepass:file", str(_store_password_file(settings, "broker")))
    for stale in (ca_store, ks, ca_file(settings)):
        stale.unlink(missing_ok=True)
    names = dict.fromkeys([*hosts, "127.0.0.1", "localhost"])
    san = "SAN=" + ",".join(f"ip:{h}" if h.replace(".", "").isdigit() or ":" in h else f"dns:{h}" for h in names)
    common = ["-keyalg", "RSA", "-keysize", "2048", "-storetype", "PKCS12"]
    log.info("making the local Kafka CA and broker certificate in %s (keytool)", folder)
    csr, crt = folder / "broker.csr", folder / "broker.crt"
    try:
        _keytool("-genkeypair", "-alias", "ca", "-dname", "CN=adpipe local Kafka CA", "-ext", "bc:c",
                 "-validity", "3650", "-keystore", str(ca_store), *ca_pass, *common)  # fmt: skip
        _keytool("-exportcert", "-rfc", "-alias", "ca", "-keystore", str(ca_store), *ca_pass,
                 "-file", str(ca_file(settings)))  # fmt: skip
        _keytool("-genkeypair", "-alias", "broker", "-dname", "CN=adpipe-kafka-broker", "-validity", "825",
                 "-ext", san, "-keystore", str(ks), *ks_pass, *common)  # fmt: skip
        _keytool("-certreq", "-alias", "broker", "-keystore", str(ks), *ks_pass, "-file", str(csr))
        _keytool("-gencert", "-alias", "ca", "-keystore", str(ca_store), *ca_pass, "-infile", str(csr),
                 "-outfile", str(crt), "-rfc", "-validity", "825", "-ext", san,
                 "-ext", "ku:c=digitalSignature,keyEncipherment", "-ext", "eku=serverAuth,clientAuth")  # fmt: skip
        _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_file(settings)),
                 "-keystore", str(ks), *ks_pass)  # fmt: skip
        _keytool("-importcert", "-alias", "broker", "-file", str(crt), "-keystore", str(ks), *ks_pass)
    except SecurityError:
        ks.unlink(missing_ok=True)  # made again from the start next time
        raise
    finally:
        csr.unlink(missing_ok=True)
        crt.unlink(missing_ok=True)
    for private in (ca_store, ks):
        private.chmod(0o600)


def _jaas(module: str, user: str, secret: str, *extra: str) -> str:
    return (
        f'org.apache.kafka.common.security.{module} required username="{user}" password="{secret}"'
        + "".join(f" {e}" for e in extra)
        + ";"
    )


def listener_properties(settings: Settings, host: str, port: int, controller_port: int) -> list[str]:
    """A secure node's listener, TLS, SASL and authorizer settings (with the
    admin and keystore passwords: the file they go into is 0600)."""
    admin_secret = password(settings, ADMIN)
    store_secret = _secret(_store_password_file(settings, "broker"))
    return [
        f"listeners=SASL_SSL://{host}:{port},CONTROLLER://{host}:{controller_port}",
        f"advertised.listeners=SASL_SSL://{host}:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=SASL_SSL",
        "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SASL_SSL",
        f"sasl.mechanism.inter.broker.protocol={SCRAM_MECHANISM}",
        "sasl.mechanism.controller.protocol=PLAIN",
        f"listener.name.sasl_ssl.sasl.enabled.mechanisms={SCRAM_MECHANISM}",
        f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config="
        + _jaas("scram.ScramLoginModule", ADMIN, admin_secret),
        "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
        "listener.name.controller.plain.sasl.jaas.config="
        + _jaas("plain.PlainLoginModule", ADMIN, admin_secret, f'user_{ADMIN}="{admin_secret}"'),
        "ssl.keystore.type=PKCS12",
        f"ssl.keystore.location={keystore(settings)}",
        f"ssl.keystore.password={store_secret}",
        f"ssl.key.password={store_secret}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={ca_file(settings)}",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users=User:{ADMIN}",
        "allow.everyone.if.no.acl.found=false",
    ]


def format_scram_args(settings: Settings) -> list[str]:
    """The storage tool's arguments that put the admin user into the first
    metadata (the brokers authenticate to each other as admin)."""
    return ["--add-scram", f"{SCRAM_MECHANISM}=[name={ADMIN},password={password(settings, ADMIN)}]"]


def access(settings: Settings, user: str, bootstrap: str) -> KafkaAccess:
    """How ``user`` of the local secure broker reaches it."""
    secret = str(local_kafka_password_file(settings.home, user))
    credentials = KafkaCredentials("sasl_ssl", user, password_file=secret, ca_file=str(ca_file(settings)))
    return KafkaAccess(bootstrap, credentials)


@dataclass(frozen=True)
class AclRule:
    """One ALLOW rule: ``User:<user>`` may do ``operation`` on the resource."""

    user: str
    resource: str  # TOPIC, GROUP, TRANSACTIONAL_ID
    name: str
    pattern: str  # LITERAL, PREFIXED
    operation: str  # READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS


def _rules(user: str, resource: str, names: list[str] | tuple[str, ...], operation: str, pattern: str = "LITERAL"):
    return [AclRule(user, resource, n, pattern, operation) for n in names]


def acl_rules(settings: Settings) -> list[AclRule]:
    """What each principal may do, for these settings' topics, job id and
    budget group. Read and Write imply Describe.

    * producer: write the raw topic (an idempotent producer needs no more).
    * stream: read the raw topic; write the three output topics and read
      their limits (max.message.bytes); its transactional id (the ledger
      group's name and "-", as adpipe.stream.job.transactional_id forms it)
      and its ledger group, where each batch's offsets are committed in the
      batch's transaction; its leadership group and that group's topic
      (:mod:`adpipe.stream.leadership`); Spark's own groups and adpipe's probes.
    * budget: read the aggregates (and their retention, for ``budget
      prune``) in its group; publish budget events in transactions of its
      publishers (ids and ledger groups by prefix).
    * reader: read every topic; look at (never commit to) the stream's
      ledger groups and the budget group; Spark's groups and the probes.
    * airflow: the stream job's rights and the reader's (the DAGs run the
      stream job, loads, verify and the budget ledger's prune).
    """
    t = settings.topics
    ledger = ledger_group(settings.job_id)
    leader = leadership_group(settings.job_id)
    stream = [
        *_rules("stream", "TOPIC", [t.events], "READ"),
        *_rules("stream", "TOPIC", [t.aggregates, t.dlq, t.late], "WRITE"),
        *_rules("stream", "TOPIC", [t.aggregates, t.dlq, t.late], "DESCRIBE_CONFIGS"),
        *_rules("stream", "TRANSACTIONAL_ID", [f"{ledger}-"], "WRITE", "PREFIXED"),
        *_rules("stream", "GROUP", [ledger, leader, *PROBE_GROUPS], "READ"),
        *_rules("stream", "TOPIC", [leader], "READ"),
        *_rules("stream", "GROUP", [SPARK_GROUP_PREFIX], "READ", "PREFIXED"),
    ]
    reader = [
        *_rules("reader", "TOPIC", t.all(), "READ"),
        *_rules("reader", "TOPIC", t.all(), "DESCRIBE_CONFIGS"),
        *_rules("reader", "GROUP", [ledger_group("")], "DESCRIBE", "PREFIXED"),
        *_rules("reader", "GROUP", [settings.budget_group], "DESCRIBE"),
        *_rules("reader", "GROUP", PROBE_GROUPS, "READ"),
        *_rules("reader", "GROUP", [SPARK_GROUP_PREFIX], "READ", "PREFIXED"),
    ]
    return [
        *_rules("producer", "TOPIC", [t.events], "WRITE"),
        *_rules("producer", "GROUP", PROBE_GROUPS, "READ"),
        *stream,
        *_rules("budget", "TOPIC", [t.aggregates], "READ"),
        *_rules("budget", "TOPIC", [t.aggregates], "DESCRIBE_CONFIGS"),
        # Read too: a publisher commits its round to its ledger group in the
        # round's transaction, which asks for Read on the topic.
        *_rules("budget", "TOPIC", [t.budget_events], "WRITE"),
        *_rules("budget", "TOPIC", [t.budget_events], "READ"),
        *_rules("budget", "GROUP", [settings.budget_group, *PROBE_GROUPS], "READ"),
        # Its session timeout and heartbeat are the group's configs (consumer protocol).
        *_rules("budget", "GROUP", [settings.budget_group], "ALTER_CONFIGS"),
        *_rules("budget", "GROUP", [BUDGET_EVENTS_PREFIX], "READ", "PREFIXED"),
        *_rules("budget", "TRANSACTIONAL_ID", [BUDGET_EVENTS_PREFIX], "WRITE", "PREFIXED"),
        *reader,
        *[AclRule("airflow", r.resource, r.name, r.pattern, r.operation) for r in stream + reader],
    ]


def ensure_users(settings: Settings, admin: KafkaAccess, timeout_s: float = 30.0) -> None:
    """Every user but admin (made at format time) with its password."""
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    client = AdminClient(admin.client_config())
    upserts = [
        UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS), password(settings, user).encode()
        )
        for user in USERS
        if user != ADMIN
    ]
    for user, future in client.alter_user_scram_credentials(upserts, request_timeout=timeout_s).items():
        future.result()
        log.debug("SCRAM user %s set", user)


def ensure_acls(settings: Settings, admin: KafkaAccess, timeout_s: float = 30.0) -> int:
    """Create the rules of :func:`acl_rules` (an existing one is kept as it
    is); return how many there are."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    bindings = [
        AclBinding(
            ResourceType[r.resource],
            r.name,
            ResourcePatternType[r.pattern],
            f"User:{r.user}",
            "*",
            AclOperation[r.operation],
            AclPermissionType.ALLOW,
        )
        for r in dict.fromkeys(acl_rules(settings))
    ]
    client = AdminClient(admin.client_config())
    for future in client.create_acls(bindings, request_timeout=timeout_s).values():
        future.result()
    return len(bindings)


def client_exports(settings: Settings, user: str) -> str:
    """The environment a client of ``user`` needs (no password: its file)."""
    return (
        f"export ADPIPE_KAFKA_SECURITY=sasl_ssl ADPIPE_KAFKA_USERNAME={user} "
        f"ADPIPE_KAFKA_PASSWORD_FILE={local_kafka_password_file(settings.home, user)} "
        f"ADPIPE_KAFKA_CA_FILE={ca_file(settings)}"
    )
