"""The local secure broker's pure parts: its listener settings, the ACLs of
each principal, and secrets kept in 0600 files."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from adpipe.kafka_io import ledger_group
from adpipe.local import kafka_broker, kafka_security
from adpipe.local.kafka_security import AclRule, acl_rules
from adpipe.settings import Settings, load_settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    s = load_settings({"ADPIPE_HOME": str(tmp_path / "home"), "ADPIPE_JOB_ID": "eu", "ADPIPE_BUDGET_GROUP": "bg"})
    kafka_security.ensure_passwords(s)
    return s


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_every_password_is_generated_once_into_a_0600_file_in_a_0700_folder(settings: Settings) -> None:
    folder = kafka_security.secrets_dir(settings)
    files = sorted(folder.iterdir())
    assert {f.name for f in files} == {f"{u}.password" for u in kafka_security.USERS} | {
        "ca.storepass",
        "broker.storepass",
    }
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    before = {f.name: f.read_text() for f in files}
    kafka_security.ensure_passwords(settings)
    assert {f.name: f.read_text() for f in files} == before  # kept, not made again
    assert len(set(before.values())) == len(before) and all(len(v.strip()) >= 32 for v in before.values())


def test_a_secure_node_has_only_sasl_ssl_listeners_and_denies_by_default(settings: Settings) -> None:
    plain = _props(kafka_broker.server_properties(settings))
    secure = _props(kafka_broker.server_properties(settings, secure=True))
    assert secure["listeners"] == "SASL_SSL://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert secure["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SASL_SSL"
    assert "PLAINTEXT" not in secure["listeners"] + secure["advertised.listeners"]
    assert secure["inter.broker.listener.name"] == "SASL_SSL"
    assert secure["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    assert secure["listener.name.sasl_ssl.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert secure["sasl.mechanism.controller.protocol"] == "PLAIN"
    assert secure["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert secure["super.users"] == "User:admin"
    assert secure["allow.everyone.if.no.acl.found"] == "false"
    assert secure["ssl.truststore.type"] == "PEM" and secure["ssl.truststore.location"].endswith("tls/ca.pem")
    admin = kafka_security.password(settings, "admin")
    assert f'password="{admin}"' in secure["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    # Everything else as the plaintext broker's (the compose test holds that one).
    shared = set(plain) & set(secure)
    assert {k for k in shared if plain[k] != secure[k]} == {
        "listeners",
        "advertised.listeners",
        "inter.broker.listener.name",
        "listener.security.protocol.map",
    }


def test_the_admin_user_is_made_at_format_time(settings: Settings) -> None:
    admin = kafka_security.password(settings, "admin")
    assert kafka_security.format_scram_args(settings) == [
        "--add-scram",
        f"SCRAM-SHA-512=[name=admin,password={admin}]",
    ]


def test_client_exports_name_the_password_file_never_the_password(settings: Settings) -> None:
    line = kafka_security.client_exports(settings, "stream")
    assert "ADPIPE_KAFKA_USERNAME=stream" in line and "ADPIPE_KAFKA_SECURITY=sasl_ssl" in line
    assert f"ADPIPE_KAFKA_PASSWORD_FILE={kafka_security.secrets_dir(settings)}/stream.password" in line
    assert kafka_security.password(settings, "stream") not in line
    access = kafka_security.access(settings, "stream", "127.0.0.1:9092")
    assert access.client_config()["sasl.password"] == kafka_security.password(settings, "stream")


def _of(rules: list[AclRule], user: str) -> set[tuple[str, str, str, str]]:
    return {(r.resource, r.name, r.pattern, r.operation) for r in rules if r.user == user}


def test_each_principal_may_do_its_own_work_only(settings: Settings) -> None:
    from adpipe.stream.job import transactional_id

    rules = acl_rules(settings)
    t = settings.topics
    assert {r.user for r in rules} == set(kafka_security.USERS) - {"admin"}  # admin: the super user
    writes = {user: {r.name for r in rules if r.user == user and r.operation == "WRITE" and r.resource == "TOPIC"}
              for user in kafka_security.USERS}  # fmt: skip
    assert writes["producer"] == {t.events}
    assert writes["stream"] == writes["airflow"] == {t.aggregates, t.dlq, t.late}
    assert writes["budget"] == {t.budget_events}
    assert writes["reader"] == set()
    # The stream job's transactional id and ledger group are its own, not another job's.
    stream = _of(rules, "stream")
    prefixes = [name for kind, name, pattern, _op in stream if kind == "TRANSACTIONAL_ID" and pattern == "PREFIXED"]
    assert prefixes == ["adpipe-agg-eu-"] and transactional_id(settings).startswith(prefixes[0])
    assert ("GROUP", ledger_group("eu"), "LITERAL", "READ") in stream
    assert not any(name.startswith("adpipe-agg-") for kind, name, _p, _o in _of(rules, "budget") if kind == "GROUP")
    # The budget service: its group, the aggregates, its events in transactions.
    budget = _of(rules, "budget")
    assert {("GROUP", "bg", "LITERAL", "READ"), ("TOPIC", t.aggregates, "LITERAL", "READ")} <= budget
    assert ("TRANSACTIONAL_ID", "adpipe-budget-events-", "PREFIXED", "WRITE") in budget
    # The reader may look at the stream's ledger, never commit to it.
    reader = _of(rules, "reader")
    assert ("GROUP", "adpipe-agg-", "PREFIXED", "DESCRIBE") in reader
    assert not any(kind == "GROUP" and name.startswith("adpipe-agg-") and op == "READ" for kind, name, _p, op in reader)
    assert {name for kind, name, _p, op in reader if kind == "TOPIC" and op == "READ"} == set(t.all())
    # Airflow runs the stream job, loads and verify: both sets of rights.
    assert _of(rules, "airflow") == stream | reader
