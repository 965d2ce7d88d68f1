"""The budget service against a real broker and a real PostgreSQL.

Real transactional aggregates come from one run of the real stream job per
module; each test copies them into its own aggregates topic, with its own
budget database (a fresh PostgreSQL database), consumer group and budget
events topic. ``adpipe budget`` runs as real processes, SIGKILLed at named
points. The expected spend is computed here, from a plain read_committed
read of the topic, with this file's own Decimal arithmetic and prices."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import pytest
from adpipe import kafka_io
from adpipe import pg as pg_client
from adpipe.budget import verify as budget_verify
from adpipe.settings import Settings, load_settings
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.conftest import BROKER_ENV, Pipeline

PRICES_CSV = (
    "scope,key,campaign_id,cpm,cpc,budget\n"
    "default,*,,2.345678,0.333333,1.50\n"
    "campaign,cmp-A,,1.111111,,\n"
    "ad,ad-000001,cmp-A,,0.123457,\n"
    "ad,ad-000002,,3.5,,1000\n"
    "ad,ad-000003,cmp-A,,,\n"
)
# The same prices, resolved by hand: (cpm, cpc, budget) in currency units.
DEFAULT = (Decimal("2.345678"), Decimal("0.333333"), Decimal("1.50"))
BY_AD = {
    "ad-000001": (Decimal("1.111111"), Decimal("0.123457"), Decimal("1.50")),
    "ad-000002": (Decimal("3.5"), Decimal("0.333333"), Decimal("1000")),
    "ad-000003": (Decimal("1.111111"), Decimal("0.333333"), Decimal("1.50")),
}
MICRO = Decimal("0.000001")


@dataclass(frozen=True)
class SourceRecord:
    partition: int
    key: bytes | None
    value: bytes


@pytest.fixture(scope="module")
def source(broker: Settings, tmp_path_factory: pytest.TempPathFactory) -> list[SourceRecord]:
    """Aggregates written by one run of the real stream job."""
    name = f"t{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        **BROKER_ENV,
        "ADPIPE_TOPIC_EVENTS": f"{name}-ad-events",
        "ADPIPE_TOPIC_AGGREGATES": f"{name}-ad-aggregates",
        "ADPIPE_TOPIC_DLQ": f"{name}-ad-events-dlq",
        "ADPIPE_TOPIC_LATE": f"{name}-ad-events-late",
        "ADPIPE_TOPIC_BUDGET_EVENTS": f"{name}-ad-budget-events",
        "ADPIPE_JOB_ID": name,
        "ADPIPE_SPARK_DRIVER_MEMORY": "1g",
    }
    settings = load_settings(env)
    kafka_io.ensure_pipeline_topics(settings)
    pipe = Pipeline(env, settings, tmp_path_factory.mktemp("budget-source"))
    pipe.produce(events=3000, seed=11, ads=30, campaigns=5, minutes=8, start=datetime(2026, 11, 22, 23, 56, tzinfo=UTC))
    run = pipe.stream(max_offsets=3000)
    assert run.returncode == 0, run.log[-3000:]
    records = [
        SourceRecord(r.partition, r.key, r.value) for r in pipe.read(settings.topics.aggregates) if r.value is not None
    ]
    assert len(records) > 150, len(records)
    return records


def _price(ad: str) -> tuple[Decimal, Decimal, Decimal]:
    return BY_AD.get(ad, DEFAULT)


def independent_spend(records: list[kafka_io.Record]) -> dict[tuple[str, str], Decimal]:
    """Spend per (ad, day) from read_committed records: first copy of each
    record_uuid, malformed ones ignored, Decimal rounded per record."""
    seen: set[str] = set()
    spend: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for rec in records:
        try:
            body = json.loads(rec.value)
            impressions, clicks = body["impressions"], body["clicks"]
            assert isinstance(impressions, int) and isinstance(clicks, int) and impressions >= 0 and clicks >= 0
        except (ValueError, KeyError, TypeError, AssertionError):
            continue
        if body["record_uuid"] in seen:
            continue
        seen.add(body["record_uuid"])
        cpm, cpc, _budget = _price(body["ad_id"])
        charge = (impressions * cpm / 1000).quantize(MICRO, rounding=ROUND_HALF_EVEN) + clicks * cpc
        assert body["window_start"].endswith("Z")
        spend[(body["ad_id"], body["window_start"][:10])] += charge
    return dict(spend)


def expected_pauses(spend: dict[tuple[str, str], Decimal]) -> set[tuple[str, str]]:
    return {key for key, amount in spend.items() if amount >= _price(key[0])[2]}


def finish(proc: subprocess.Popen, timeout: float = 60, terminate: bool = True) -> None:
    """Wait for a process started in its own session (after a SIGTERM when
    ``terminate``); SIGKILL its whole group if it is still there then."""
    if terminate and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class Run:
    returncode: int
    log: str

    def totals(self) -> dict[str, int]:
        """The counters of the service's last line ("budget service stopped: ...")."""
        line = self.log.split("budget service stopped: ", 1)[1].split("\n", 1)[0]
        batches, rest = line.split(" batches, ", 1)
        return {"batches": int(batches)} | {k: int(v) for k, v in (p.rsplit(" ", 1) for p in rest.split(", "))}

    def batch(self, n: int) -> tuple[int, int]:
        """(records, applied) of batch n."""
        line = next(x for x in self.log.splitlines() if f"adpipe.budget: batch {n}: " in x)
        after = line.split(f"batch {n}: ", 1)[1]
        return int(after.split(" records", 1)[0]), int(after.split(": ", 1)[1].split(" applied", 1)[0])


class BudgetEnv:
    """One test's budget service: topic, database, group, processes."""

    def __init__(self, pg: Settings, workdir: Path) -> None:
        self.name = f"b{uuid.uuid4().hex[:10]}"
        conn = pg_client.connect(pg, "postgres")
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{self.name}"')
        conn.close()
        self.pg = pg
        self.workdir = workdir
        self.env = {
            **os.environ,
            **BROKER_ENV,
            "ADPIPE_TOPIC_AGGREGATES": f"{self.name}-ad-aggregates",
            "ADPIPE_TOPIC_BUDGET_EVENTS": f"{self.name}-ad-budget-events",
            "ADPIPE_BUDGET_DB": pg.pg_url(self.name),
            "ADPIPE_BUDGET_GROUP": f"{self.name}-group",
            "ADPIPE_BUDGET_BATCH_SIZE": "25",
            "ADPIPE_BUDGET_SESSION_TIMEOUT_MS": "6000",
        }
        self.settings = load_settings(self.env)
        self.bootstrap = self.settings.kafka_bootstrap
        self.topic = self.settings.topics.aggregates
        kafka_io.ensure_topics(self.bootstrap, [self.topic, self.settings.topics.budget_events], 4)
        prices = workdir / "prices.csv"
        prices.write_text(PRICES_CSV)
        loaded = self.cli("prices", "--file", str(prices))
        assert loaded.returncode == 0 and "loaded 5 pricing rows" in loaded.log, loaded.log

    # -- Kafka
    def copy(self, records: list[SourceRecord], chunks: int = 4, abort: bool = False) -> None:
        """Produce records into this test's aggregates topic, in ``chunks``
        transactions (committed, or aborted), to the partitions given."""
        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "transactional.id": f"{self.name}-copy-{uuid.uuid4().hex[:6]}"}
        )
        producer.init_transactions(30)
        size = max(1, -(-len(records) // chunks))
        for i in range(0, len(records), size):
            producer.begin_transaction()
            for rec in records[i : i + size]:
                producer.produce(self.topic, rec.value, rec.key, partition=rec.partition)
            producer.flush(30)
            if abort:
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)

    def read(self, topic: str | None = None) -> list[kafka_io.Record]:
        return list(kafka_io.read_topic(self.bootstrap, topic or self.topic))

    def budget_events(self) -> Counter[tuple[str, str]]:
        return Counter(
            (json.loads(r.value)["ad_id"], json.loads(r.value)["period"])
            for r in self.read(self.settings.topics.budget_events)
        )

    def kafka_committed(self) -> dict[int, int]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.settings.budget_group})
        try:
            parts = [TopicPartition(self.topic, p) for p in range(4)]
            return {tp.partition: tp.offset for tp in kafka_io.committed_offsets(consumer, parts)}
        finally:
            consumer.close()

    # -- processes
    def _popen(self, args: tuple[str, ...], extra_env: dict[str, str] | None) -> tuple[subprocess.Popen, Path]:
        log_path = self.workdir / f"budget-{uuid.uuid4().hex[:6]}.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "adpipe", "budget", *args],
                env={**self.env, **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return proc, log_path

    def cli(self, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 120) -> Run:
        proc, log_path = self._popen(args, extra_env)
        finish(proc, timeout, terminate=False)
        return Run(proc.returncode, log_path.read_text())

    def once(self, fault: dict[str, str] | None = None, **extra: str) -> Run:
        return self.cli("--once", extra_env={**(fault or {}), **extra})

    def start(self, extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        return self._popen((), extra_env)

    # -- PostgreSQL
    def query(self, sql: str) -> list[tuple]:
        conn = pg_client.connect(self.pg, self.name)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall()
        finally:
            conn.close()

    def spend(self) -> dict[tuple[str, str], Decimal]:
        return {
            (a, p): Decimal(micros).scaleb(-6)
            for a, p, micros in self.query("SELECT ad_id, period, spend_micros FROM budget_spend")
        }

    def db_offsets(self) -> dict[int, int]:
        return dict(self.query("SELECT kafka_partition, next_offset FROM budget_offsets"))

    def snapshot(self) -> tuple:
        return (
            self.spend(),
            self.query("SELECT count(*), sum(spend_micros) FROM budget_ledger"),
            sorted(self.query("SELECT ad_id, period, event_id, sent_at IS NOT NULL FROM budget_events")),
            sorted(self.query("SELECT ad_id, period, state, generation FROM budget_status")),
            self.budget_events(),
        )

    def assert_exact(self) -> dict[tuple[str, str], Decimal]:
        """Spend per ad and period equals the independent computation to the
        micro-unit; each expected pause is in the database and published once."""
        expected = independent_spend(self.read())
        actual = self.spend()
        assert {k: v for k, v in actual.items() if v} == {k: v for k, v in expected.items() if v}
        per_ad_expected: dict[str, Decimal] = defaultdict(Decimal)
        per_ad_actual: dict[str, Decimal] = defaultdict(Decimal)
        for (ad, _p), v in expected.items():
            per_ad_expected[ad] += v
        for (ad, _p), v in actual.items():
            per_ad_actual[ad] += v
        assert per_ad_actual == per_ad_expected
        pauses = expected_pauses(expected)
        assert pauses and len(pauses) < len(expected), "the prices should pause some ads, not all"
        assert set(self.query("SELECT ad_id, period FROM budget_status WHERE state = 'paused'")) == pauses
        assert self.query("SELECT count(*) FROM budget_events WHERE sent_at IS NULL") == [(0,)]
        assert self.budget_events() == Counter(dict.fromkeys(pauses, 1))
        report = budget_verify.check(self.settings)
        assert report["ok"] and report["status"] == "ok", report
        assert report["expected_spend_micros"] == report["actual_spend_micros"] == int(sum(expected.values()) * 10**6)
        return expected


@pytest.fixture
def budget(pg: Settings, tmp_path: Path) -> BudgetEnv:
    return BudgetEnv(pg, tmp_path)


def _fault(point: str, batch: int) -> dict[str, str]:
    return {"ADPIPE_FAULT": point, "ADPIPE_FAULT_BATCH": str(batch)}


def test_once_report_and_whole_topic_replay_changes_nothing(budget: BudgetEnv, source: list[SourceRecord]) -> None:
    budget.copy(source)
    run = budget.once()
    assert run.returncode == 0, run.log[-3000:]
    assert "drained" in run.log, run.log[-2000:]
    assert run.totals()["applied"] == run.totals()["records"] == len(source), run.totals()
    expected = budget.assert_exact()
    before = budget.snapshot()

    # Replay 1: a new consumer group (no offsets anywhere) reads the whole topic again.
    replay = budget.once(ADPIPE_BUDGET_GROUP=f"{budget.name}-replay")
    assert replay.returncode == 0, replay.log[-3000:]
    assert (replay.totals()["applied"], replay.totals()["duplicates"]) == (0, len(source)), replay.log[-2000:]
    # Replay 2: the database's offsets for the group are lost too.
    budget.query("DELETE FROM budget_offsets RETURNING 1")
    replay = budget.once()
    assert replay.returncode == 0, replay.log[-2000:]
    assert (replay.totals()["applied"], replay.totals()["duplicates"]) == (0, len(source)), replay.log[-2000:]
    assert budget.snapshot() == before
    budget.assert_exact()

    report = budget.cli("report")
    assert report.returncode == 0, report.log
    assert "paused" in report.log and "active" in report.log
    total = sum(expected.values())
    assert f"total spend {total.quantize(MICRO)}" in report.log, report.log[-500:]
    as_json = budget.cli("report", "--json")
    assert as_json.returncode == 0
    rows = json.loads(as_json.log[as_json.log.index("[") :])
    assert {(r["ad_id"], r["period"]): r["status"] for r in rows if r["status"] == "paused"} == dict.fromkeys(
        expected_pauses(expected), "paused"
    )


def test_sigkill_between_database_commit_and_kafka_commit(budget: BudgetEnv, source: list[SourceRecord]) -> None:
    budget.copy(source)
    run = budget.once(_fault("budget_after_db_commit", 3))
    assert run.returncode == -signal.SIGKILL, run.log[-3000:]
    assert "fault injection: SIGKILL at budget_after_db_commit" in run.log
    db_offsets = budget.db_offsets()
    kafka = budget.kafka_committed()
    # The database is ahead of Kafka's offsets: the last batch's Kafka commit was lost.
    assert db_offsets and any(kafka.get(p, -1) < o for p, o in db_offsets.items()), (db_offsets, kafka)
    applied_before = budget.query("SELECT count(*) FROM budget_ledger")[0][0]
    assert 0 < applied_before < len(source)

    rerun = budget.once()
    assert rerun.returncode == 0, rerun.log[-3000:]
    # It started from the database's offsets, not Kafka's: nothing was read twice.
    for p, o in db_offsets.items():
        assert f"{p}: {o}" in rerun.log.split("at database offsets", 1)[1].split("\n", 1)[0]
    totals = rerun.totals()
    assert (totals["records"], totals["applied"], totals["duplicates"], totals["already_applied"]) == (
        len(source) - applied_before,
        len(source) - applied_before,
        0,
        0,
    ), totals
    budget.assert_exact()


def test_sigkill_before_database_commit_and_after_budget_events_commit(
    budget: BudgetEnv, source: list[SourceRecord]
) -> None:
    budget.copy(source)
    # Dies inside batch 2's transaction: batch 1 only is in the database.
    run = budget.once(_fault("budget_before_db_commit", 2))
    assert run.returncode == -signal.SIGKILL, run.log[-3000:]
    records, applied = run.batch(1)
    assert records == applied > 0
    assert budget.query("SELECT count(*) FROM budget_ledger")[0][0] == applied
    # Dies after the first round of budget events committed in Kafka, before the outbox is marked sent.
    run = budget.once(_fault("budget_after_events_commit", 1))
    assert run.returncode == -signal.SIGKILL, run.log[-3000:]
    published = budget.budget_events()
    # The killed round's events are committed in Kafka while the outbox still calls them unsent
    # (pauses of batches applied meanwhile, by the consuming thread, wait unsent in later rounds).
    unsent = set(budget.query("SELECT ad_id, period FROM budget_events WHERE sent_at IS NULL AND round = 1"))
    assert unsent and unsent == set(published), (published, unsent)
    # The restart finds the round in the Kafka ledger: marks it sent, publishes the rest once.
    rerun = budget.once()
    assert rerun.returncode == 0, rerun.log[-3000:]
    assert "was published before a crash" in rerun.log, rerun.log[-3000:]
    budget.assert_exact()


def test_duplicate_record_uuids_in_the_topic(budget: BudgetEnv, source: list[SourceRecord]) -> None:
    budget.copy(source)
    dup_same = source[::13]  # again, to the same partition, in committed transactions
    dup_other = [SourceRecord((r.partition + 1) % 4, r.key, r.value) for r in source[5::17]]  # another partition
    budget.copy(dup_same, chunks=2)
    budget.copy(dup_other, chunks=1)
    plain = Producer({"bootstrap.servers": budget.bootstrap, "enable.idempotence": True})  # not transactional
    for rec in source[7:12]:
        plain.produce(budget.topic, rec.value, rec.key, partition=rec.partition)
    plain.flush(30)
    # Aborted: new record_uuids with huge counts that a read_committed reader never sees.
    ghost = [
        SourceRecord(
            i % 4,
            b"ad-000004",
            json.dumps(
                {
                    "record_uuid": str(uuid.uuid4()),
                    "ad_id": "ad-000004",
                    "window_start": "2026-11-22T23:58:00Z",
                    "window_end": "2026-11-22T23:59:00Z",
                    "impressions": 10**6,
                    "clicks": 10**4,
                }
            ).encode(),
        )
        for i in range(8)
    ]
    budget.copy(ghost, chunks=1, abort=True)
    bad = [
        SourceRecord(0, b"x", b"{not json"),
        SourceRecord(
            1,
            b"y",
            json.dumps(
                {
                    "record_uuid": "neg",
                    "ad_id": "ad-000001",
                    "window_start": "2026-11-22T23:58:00Z",
                    "impressions": -5,
                    "clicks": 0,
                }
            ).encode(),
        ),
    ]
    budget.copy(bad, chunks=1)
    copies = len(dup_same) + len(dup_other) + 5

    run = budget.once()
    assert run.returncode == 0, run.log[-3000:]
    totals = run.totals()
    assert (totals["applied"], totals["duplicates"], totals["quarantined"]) == (len(source), copies, 2), totals
    assert budget.query("SELECT count(*) FROM budget_ledger") == [(len(source),)]
    assert budget.query("SELECT count(*) FROM budget_quarantine") == [(2,)]
    expected = budget.assert_exact()
    # The duplicates and the aborted records add nothing to what the source alone is worth.
    assert expected == independent_spend([kafka_io.Record("", r.partition, 0, r.key, r.value, {}) for r in source])


def _assignment(log_path: Path) -> list[int] | None:
    lines = [line for line in log_path.read_text().splitlines() if "assignment now" in line]
    return json.loads(lines[-1].rsplit("assignment now ", 1)[1]) if lines else None


def _wait(what: str, predicate, timeout: float = 90.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_two_instances_one_killed_mid_run(budget: BudgetEnv, source: list[SourceRecord]) -> None:
    small = {"ADPIPE_BUDGET_BATCH_SIZE": "10"}
    doomed, doomed_log = budget.start({**small, **_fault("budget_after_db_commit", 4)})
    survivor, survivor_log = budget.start(small)
    try:
        # Both share the partitions before any data arrives.
        _wait(
            "two instances sharing the partitions",
            lambda: (a := _assignment(doomed_log)) is not None
            and (b := _assignment(survivor_log)) is not None
            and len(a) == len(b) == 2
            and not set(a) & set(b),
        )
        budget.copy(source, chunks=8)
        doomed.wait(timeout=90)
        assert doomed.returncode == -signal.SIGKILL, doomed_log.read_text()[-3000:]
        ends = kafka_io.end_offsets(budget.bootstrap, budget.topic)
        # The survivor takes the dead one's partitions (after its session times out) from the database offsets.
        _wait("the survivor owning every partition", lambda: _assignment(survivor_log) == [0, 1, 2, 3])
        _wait(
            "the survivor catching up",
            lambda: all(budget.db_offsets().get(p, 0) >= end - 1 for p, end in ends.items() if end),
        )
        time.sleep(1.0)  # an EOF poll and a publish round
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(timeout=60)
    finally:
        for proc in (doomed, survivor):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    log = survivor_log.read_text()
    assert survivor.returncode == 0, log[-3000:]
    assert "signal 15: stopping" in log and "budget service stopped" in log
    assert "revoked partitions" in log
    budget.assert_exact()
