"""A broker that lets no one in: ``adpipe kafka up --secure`` (SASL/SCRAM-
SHA-512 over TLS, ACLs) on its own home and ports, the whole pipeline on it
with each part as its own principal (producer, stream, budget, reader), and
clients without credentials, with a wrong password or beyond their ACLs
refused. Expected counts come from the producer's own summary; every log and
printed line of the run is searched for the passwords it used."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from adpipe import kafka_io
from adpipe import pg as pg_client
from adpipe.local import kafka_broker, kafka_security
from adpipe.settings import KafkaAccess, KafkaCredentials, Settings, isolated_env, load_settings
from confluent_kafka import KafkaError, Producer

from tests.conftest import JVM_OPTIONS, PORT_BASE, TEST_HOME
from tests.integration.helpers import expected_windows

BOOTSTRAP = f"127.0.0.1:{PORT_BASE + 50}"


@dataclass
class Secure:
    env: dict[str, str]  # no credentials: each part adds its user's
    settings: Settings
    home: Path
    printed: list[str]  # everything the commands printed

    def as_user(self, user: str) -> dict[str, str]:
        return {**self.env, "ADPIPE_KAFKA_SECURITY": "sasl_ssl", "ADPIPE_KAFKA_USERNAME": user}

    def access(self, user: str) -> KafkaAccess:
        return load_settings(self.as_user(user)).kafka

    def adpipe(self, user: str | None, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        env = self.as_user(user) if user else self.env
        proc = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "adpipe", *args], env=env, capture_output=True, text=True, timeout=timeout
        )
        self.printed += [proc.stdout, proc.stderr]
        return proc

    def passwords(self) -> dict[str, str]:
        folder = kafka_security.secrets_dir(self.settings)
        return {p.name: p.read_text().strip() for p in folder.iterdir()}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    home = TEST_HOME / "secure"
    name = f"s{uuid.uuid4().hex[:6]}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ADPIPE_KAFKA_")},
        "ADPIPE_HOME": str(home),
        "ADPIPE_KAFKA_BOOTSTRAP": BOOTSTRAP,
        "ADPIPE_KAFKA_CONTROLLER_PORT": str(PORT_BASE + 51),
        "ADPIPE_JVM_OPTIONS": JVM_OPTIONS,
        "ADPIPE_PG_PORT": str(PORT_BASE + 2),  # the session's PostgreSQL (the pg fixture)
        **isolated_env(name),
        "ADPIPE_BUDGET_GROUP": f"{name}-budget",
        "ADPIPE_SPARK_DRIVER_MEMORY": "1g",
        "ADPIPE_SHUFFLE_PARTITIONS": "2",
    }
    settings = load_settings(env)
    kafka_broker.down(settings)
    shutil.rmtree(home, ignore_errors=True)
    scene = Secure(env, settings, home, [])
    try:
        up = scene.adpipe(None, "kafka", "up", "--secure", timeout=180)
        assert up.returncode == 0, up.stderr[-3000:]
        assert "(SASL_SSL, SCRAM-SHA-512 users, ACLs)" in up.stdout and "created topics" in up.stdout
        yield scene
    finally:
        kafka_broker.down(settings)


def test_the_pipeline_runs_end_to_end_with_each_part_as_its_own_principal(
    secure: Secure, pg: Settings, tmp_path: Path
) -> None:
    s = secure.settings
    status = secure.adpipe(None, "kafka", "status")
    assert status.returncode == 0 and "SASL_SSL" in status.stdout, status.stdout + status.stderr
    for user in kafka_security.USERS:  # the users' secrets: 0600 files in a 0700 folder
        path = kafka_security.secrets_dir(s) / f"{user}.password"
        assert path.stat().st_mode & 0o077 == 0, path
    assert kafka_security.secrets_dir(s).stat().st_mode & 0o077 == 0
    assert all(p.stat().st_mode & 0o077 == 0 for p in (kafka_broker.nodes(s)[0].config, kafka_security.keystore(s)))

    summary_path = tmp_path / "summary.json"
    produced = secure.adpipe(
        "producer", "produce", "--events", "600", "--seed", "14", "--ads", "8", "--minutes", "6",
        "--duplicate-rate", "0.05", "--malformed-rate", "0.02", "--summary", str(summary_path),
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr[-3000:]
    summary = json.loads(summary_path.read_text())

    stream_log = tmp_path / "stream.log"
    with stream_log.open("w") as out:
        stream = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "adpipe", "stream", "--available-now", "--max-offsets-per-trigger", "400"],
            env=secure.as_user("stream"),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=400,
            check=False,
        )
    assert stream.returncode == 0, stream_log.read_text()[-4000:]

    # read_committed, as the reader: every window the job closed, once, with the producer's counts.
    reader = secure.access("reader")
    aggregates = [json.loads(r.value) for r in kafka_io.read_topic(reader, s.topics.aggregates)]
    commits = kafka_io.group_commits(reader, kafka_io.ledger_group(s.job_id), s.topics.events)
    watermark = kafka_io.committed_watermark(commits)
    assert watermark is not None
    expected = {
        k: v
        for k, v in expected_windows(summary).items()
        if int(datetime.fromisoformat(k[1]).timestamp() * 1000) + 60_000 <= watermark
    }
    actual = {(a["ad_id"], a["window_start"]): (a["impressions"], a["clicks"]) for a in aggregates}
    assert len(actual) == len(aggregates) and len(expected) >= 30
    assert actual == expected
    dlq = list(kafka_io.read_topic(reader, s.topics.dlq))
    assert len(dlq) == summary["malformed"] > 0

    database = f"adpipe_budget_{s.job_id}"
    pg_client.ensure_databases(pg, (database,))
    budget_db = {"ADPIPE_BUDGET_DB": pg.pg_url(database)}
    secure.env.update(budget_db)
    budget = secure.adpipe("budget", "budget", "--once")
    assert budget.returncode == 0, budget.stderr[-3000:]
    assert f"{len(aggregates)} applied" in budget.stderr

    verify = secure.adpipe("reader", "verify")
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
    report = json.loads(verify.stdout[verify.stdout.index("{") :])
    assert report["ok"] and report["aggregates"]["records"] == len(aggregates)
    assert report["budget"]["status"] == "ok", report["budget"]  # the spend, checked against the aggregates

    # No password of the run in anything it printed or logged.
    logs = [stream_log.read_text(), *secure.printed]
    logs += [p.read_text(errors="replace") for p in (secure.home / "kafka").glob("*.log")]
    logs += [(secure.home / "kafka" / "broker.out").read_text(errors="replace")]
    # The stream driver's own log4j lines (ADPIPE_JVM_LOGS=file, the default).
    spark_logs = list((secure.home / "logs").glob("adpipe-stream-*.log"))
    assert spark_logs
    logs += [p.read_text(errors="replace") for p in spark_logs]
    leaked = {name for name, secret in secure.passwords().items() for text in logs if secret in text}
    assert leaked == set()


def test_no_credentials_a_wrong_password_and_a_principal_beyond_its_acls_are_refused(secure: Secure) -> None:
    s = secure.settings
    # The right credentials answer...
    assert kafka_io.refusal(secure.access("reader")) is None
    # ...no credentials at all: the TLS listener drops a plaintext client before its first request.
    nobody = kafka_io.refusal(KafkaAccess(BOOTSTRAP))
    assert nobody is not None and "without credentials" in nobody
    # A wrong password: SCRAM refuses it.
    good = secure.access("reader").credentials
    wrong = KafkaAccess(BOOTSTRAP, KafkaCredentials("sasl_ssl", "reader", password="not-" + good.secret(),
                                                    ca_file=good.ca_file))  # fmt: skip
    refused = kafka_io.refusal(wrong)
    assert refused is not None and "refused the credentials" in refused and good.secret() not in refused
    # An unknown user likewise.
    stranger = KafkaAccess(BOOTSTRAP, KafkaCredentials("sasl_ssl", "mallory", password="x", ca_file=good.ca_file))
    assert "refused the credentials" in (kafka_io.refusal(stranger) or "")

    # Authenticated, but not allowed: the budget service may not write the stream's output...
    errors: list[KafkaError] = []
    producer = Producer(secure.access("budget").client_config())
    producer.produce(s.topics.aggregates, b"{}", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(30)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # ...and the producer may not read what the pipeline made.
    with pytest.raises(Exception, match="TOPIC_AUTHORIZATION_FAILED|[Aa]uthorization"):
        list(kafka_io.read_topic(secure.access("producer"), s.topics.aggregates, timeout_s=20))
