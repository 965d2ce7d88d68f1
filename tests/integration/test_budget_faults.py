"""The budget service under ordinary faults, on a real broker and a real
PostgreSQL: records the database refuses, conflicting duplicates, offsets
deleted by retention, a database outage, a frozen zombie, a publisher lock
held elsewhere, budgets changed live.

Aggregates are written here (plain JSON of the contract), and every
expected spend is computed here with Decimal arithmetic from what this file
wrote (``independent_spend`` of helpers.py), never with the service's code."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from adpipe import kafka_io
from adpipe import pg as pg_client
from adpipe.budget import db, schema
from adpipe.budget import verify as budget_verify
from adpipe.budget.batch import StaleOffsets, apply_batch
from adpipe.budget.service import BudgetService
from adpipe.local import postgres
from adpipe.settings import Settings
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from sqlalchemy import create_engine

from tests.integration.budget_helpers import (
    BudgetEnv,
    SourceRecord,
    aggregate,
    as_kafka,
    assignment,
    caught_up,
    expected_pauses,
    finish,
    independent_spend,
    normal_records,
    record,
    wait_until,
)

BIGINT_MAX = 2**63 - 1
OUTAGE_S = 30  # how long PostgreSQL stays down under load (issue 13)


def test_records_the_database_refuses_are_quarantined_and_the_rest_charged(budget: BudgetEnv) -> None:
    good = normal_records(60)
    # Two charges that fit BIGINT alone but not summed: validation passes them,
    # the database's spend row overflows (SQLSTATE 22003) on the second.
    impressions = (BIGINT_MAX // 2_345_678) * 1000 * 6 // 10
    big_first = record(aggregate("ad-000100", 1, impressions, 0), 2)
    big_second = record(aggregate("ad-000100", 2, impressions, 0), 2)
    # A record only a constraint of this database refuses (SQLSTATE 23514).
    poison = record(aggregate("ad-poison", 3), 1)
    invalid = [
        record(aggregate(window_start="2026-11-22T10:00:00.0000000000000000000000000000Z"), 0),  # > 40 characters
        record(aggregate(impressions=2**63), 3),  # beyond BIGINT
        record(
            b'{"record_uuid": "nul-1", "ad_id": "ad\\u0000x", "window_start": "2026-11-22T10:00:00Z", '
            b'"impressions": 1, "clicks": 0}',
            0,
        ),
        record(
            b'{"record_uuid": "sur-1", "ad_id": "ad\\ud800", "window_start": "2026-11-22T10:00:00Z", '
            b'"impressions": 1, "clicks": 0}',
            1,
        ),
        record(b"\x00\xff not even text", 2),
    ]
    charged_twice = json.loads(good[5].value)
    conflict = record({**charged_twice, "clicks": charged_twice["clicks"] + 40}, 3)
    budget.copy(good[:30])
    first = budget.once()  # creates the tables
    assert first.returncode == 0, first.log[-3000:]
    conn = pg_client.connect(budget.pg, budget.name)
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE budget_ledger ADD CONSTRAINT test_refuses_poison CHECK (ad_id <> 'ad-poison')")
    conn.close()
    budget.copy([big_first, big_second, poison, *invalid, conflict, *good[30:]], chunks=1)

    run = budget.once(ADPIPE_BUDGET_BATCH_SIZE="500")
    assert run.returncode == 0, run.log[-4000:]
    assert "splitting the batch to find it" in run.log
    kinds = dict(budget.query("SELECT kind, count(*) FROM budget_quarantine GROUP BY kind"))
    assert kinds == {"malformed": len(invalid), "rejected": 2, "conflict": 1}, kinds
    rejected = dict(budget.query("SELECT kafka_partition, reason FROM budget_quarantine WHERE kind = 'rejected'"))
    assert "22003" in rejected[2] and "23514" in rejected[1], rejected
    conflict_reason = budget.query("SELECT reason FROM budget_quarantine WHERE kind = 'conflict'")[0][0]
    assert charged_twice["record_uuid"] in conflict_reason
    # Everything else charged exactly once; the refused ones not at all.
    expected = independent_spend(as_kafka([*good, big_first]))
    assert {k: v for k, v in budget.spend().items() if v} == {k: v for k, v in expected.items() if v}
    report = budget_verify.check(budget.settings)
    assert report["ok"], report
    assert (report["conflicts"], report["rejected_by_database"]) == (1, 2), report
    shown = budget.cli("report")
    assert shown.returncode == 0, shown.log
    assert "CONFLICT" in shown.log and charged_twice["record_uuid"] in shown.log, shown.log[-2000:]
    assert "1 conflict" in shown.log and "2 rejected" in shown.log
    # The indexes the ledger's readers need (prune by age, verify and report by ad).
    indexes = {name for (name,) in budget.query("SELECT indexname FROM pg_indexes WHERE tablename = 'budget_ledger'")}
    assert {"budget_ledger_applied_at", "budget_ledger_ad_period"} <= indexes, indexes


def test_offsets_deleted_by_retention_are_a_reported_gap(budget: BudgetEnv) -> None:
    first = normal_records(40)
    budget.copy(first)
    assert budget.once().returncode == 0
    stored = budget.db_offsets()
    more = normal_records(40)
    budget.copy(more)
    # Retention (here: the admin API's delete) removes records the service never charged.
    ends = kafka_io.end_offsets(budget.bootstrap, budget.topic)
    cut = {p: stored[p] + (ends[p] - stored[p]) // 2 for p in stored}
    admin = AdminClient({"bootstrap.servers": budget.bootstrap})
    for future in admin.delete_records([TopicPartition(budget.topic, p, o) for p, o in cut.items()]).values():
        future.result(30)
    alerts = Path(budget.env["ADPIPE_HOME"]) / "alerts" / "alerts.jsonl"
    before = len(alerts.read_text().splitlines()) if alerts.exists() else 0

    run = budget.once()
    assert run.returncode == 0, run.log[-3000:]
    assert "deleted by retention" in run.log
    gaps = {
        p: (f, t, n)
        for p, f, t, n in budget.query("SELECT kafka_partition, from_offset, to_offset, lost_offsets FROM budget_gaps")
    }
    assert gaps == {p: (stored[p], cut[p], cut[p] - stored[p]) for p in stored if cut[p] > stored[p]}, gaps
    new_alerts = [json.loads(line) for line in alerts.read_text().splitlines()[before:]]
    mine = [a for a in new_alerts if a.get("topic") == budget.topic]
    assert {a["partition"]: a["lost_offsets"] for a in mine} == {p: n for p, (_f, _t, n) in gaps.items()}
    report = budget_verify.check(budget.settings)
    assert not report["ok"] and report["lost_to_retention_offsets"] == sum(n for *_x, n in gaps.values()), report
    # A new group with no offsets at all reads from 0: the same records are lost to it.
    fresh = budget.once(ADPIPE_BUDGET_GROUP=f"{budget.name}-fresh")
    assert fresh.returncode == 0, fresh.log[-3000:]
    lost_fresh = budget.query(f"SELECT sum(lost_offsets) FROM budget_gaps WHERE group_id = '{budget.name}-fresh'")
    assert lost_fresh == [(sum(cut.values()),)], lost_fresh


class SteadyProducer:
    """Aggregates into the topic at a steady rate, in small transactions,
    until stopped; keeps what it sent (the expectation)."""

    def __init__(self, budget: BudgetEnv) -> None:
        self.budget = budget
        self.sent: list[SourceRecord] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        producer = Producer(
            {"bootstrap.servers": self.budget.bootstrap, "transactional.id": f"{self.budget.name}-steady"}
        )
        producer.init_transactions(30)
        i = 0
        while not self.stop.is_set():
            chunk = [  # the k-th record: ad k mod 9, a window of its own
                record(aggregate(f"ad-{k % 9:06d}", (k // 9) % 50, 10 + j, j % 3, (k // 450) % 24), k % 4)
                for j, k in enumerate(range(i, i + 5))
            ]
            producer.begin_transaction()
            for rec in chunk:
                producer.produce(self.budget.topic, rec.value, rec.key, partition=rec.partition)
            producer.commit_transaction(30)
            self.sent.extend(chunk)
            i += 5
            time.sleep(0.2)

    def __enter__(self) -> SteadyProducer:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


@pytest.mark.slow  # restarts PostgreSQL: make test-extended
@pytest.mark.extended
def test_database_outage_under_load_pauses_and_resumes(budget: BudgetEnv, pg: Settings) -> None:
    # A poll interval far below the outage: only a consumer that keeps polling
    # while paused stays in the group.
    tight = {"ADPIPE_BUDGET_BATCH_SIZE": "20", "ADPIPE_BUDGET_MAX_POLL_INTERVAL_MS": "10000"}
    first, first_log = budget.start(tight)
    second, second_log = budget.start(tight)
    logs = (first_log, second_log)
    try:
        wait_until(
            "two instances sharing the partitions",
            lambda: all((a := assignment(path)) is not None and len(a) == 2 for path in logs),
        )
        shared_from = [len(path.read_text()) for path in logs]  # the rebalance of the second one's join is before
        with SteadyProducer(budget) as steady:
            wait_until("both applying", lambda: all("batch 3:" in path.read_text() for path in logs))
            postgres.down(pg)
            outage_ends = time.monotonic() + OUTAGE_S
            while time.monotonic() < outage_ends:  # alive at every moment of the outage
                assert first.poll() is None and second.poll() is None, first_log.read_text()[-3000:]
                time.sleep(1)
            postgres.up(pg)
            time.sleep(5)
        wait_until("the service catching up", lambda: caught_up(budget), timeout=120)
        assert first.poll() is None and second.poll() is None
        time.sleep(1)
        before_stop = [path.read_text()[start:] for path, start in zip(logs, shared_from, strict=True)]
    finally:
        for proc in (first, second):
            finish(proc)
    for proc, path, text in zip((first, second), logs, before_stop, strict=True):
        assert proc.returncode == 0, path.read_text()[-3000:]
        # The batch in flight waited the outage out; the publisher thread survived it.
        assert "consumption paused" in text and "the database answers again" in text, text[-3000:]
        assert "budget events: database unavailable" in text
        assert "revoked partitions" not in text and "lost (session expired)" not in text  # no rebalance
    expected = independent_spend(as_kafka(steady.sent))
    assert len(steady.sent) > 150
    assert {k: v for k, v in budget.spend().items() if v} == {k: v for k, v in expected.items() if v}
    assert budget.query("SELECT count(*) FROM budget_ledger") == [(len(steady.sent),)]
    assert budget_verify.check(budget.settings)["ok"]


@pytest.mark.slow  # restarts PostgreSQL: make test-extended
@pytest.mark.extended
def test_partitions_assigned_while_the_database_is_down_wait_for_it(budget: BudgetEnv, pg: Settings) -> None:
    """One of two instances dies during an outage: the survivor's rebalance
    cannot read the database's offsets; it keeps the partitions paused (never
    reading from Kafka's own offsets) until it can, then charges them."""
    survivor, survivor_log = budget.start()
    doomed, _doomed_log = budget.start()
    try:
        wait_until("two instances sharing the partitions", lambda: len(assignment(survivor_log) or []) == 2)
        postgres.down(pg)
        try:
            os.killpg(doomed.pid, signal.SIGKILL)
            doomed.wait()
            wait_until("the assignment without offsets", lambda: "cannot be read now" in survivor_log.read_text())
            time.sleep(3)
            assert survivor.poll() is None, survivor_log.read_text()[-3000:]
        finally:
            postgres.up(pg)
        records = normal_records(40)
        budget.copy(records)
        # The dead one's partitions (the consumer protocol hands the survivor
        # those alone; it keeps reading its own) are positioned once it can.
        unread = re.search(r"assigned partitions (\[[0-9, ]+\]), but their database offsets cannot be read now",
                           survivor_log.read_text())
        assert unread, survivor_log.read_text()[-3000:]
        waiting = json.loads(unread.group(1))
        wait_until(
            "the partitions positioned",
            lambda: all(f"partition {p} positioned at database offset" in survivor_log.read_text() for p in waiting),
        )
        wait_until("the records charged", lambda: caught_up(budget))
    finally:
        for proc in (survivor, doomed):
            finish(proc)
    assert survivor.returncode == 0, survivor_log.read_text()[-3000:]
    expected = independent_spend(as_kafka(records))
    assert {k: v for k, v in budget.spend().items() if v} == {k: v for k, v in expected.items() if v}
    assert budget_verify.check(budget.settings)["ok"]


def test_a_partition_paused_then_taken_away_is_read_when_given_back(budget: BudgetEnv) -> None:
    """librdkafka keeps a partition's pause through a rebalance that takes it
    away and gives it back. Partitions assigned while their database offsets
    could not be read (so paused), then moved to another member and back,
    are read again (a chaos run once held two for 14 minutes unread)."""
    records = normal_records(16)
    budget.copy(records, chunks=1)
    service = BudgetService(budget.settings)
    held, working = service.assignment, service.engine
    held.engine = create_engine("postgresql+psycopg2://nobody@127.0.0.1:9/none")
    service._configure_group()
    held.consumer = consumer = service._consumer()
    other = service._consumer()
    read: dict[int, list[bytes]] = defaultdict(list)

    def pump(*consumers: Consumer) -> None:
        for c in consumers:
            for m in c.consume(10, 0.2):
                if m.error() is None and c is consumer:
                    read[m.partition()].append(m.value())

    try:
        consumer.subscribe([budget.topic], on_assign=held.on_assign, on_revoke=held.on_revoke)
        wait_until("all four assigned, unread", lambda: pump(consumer) or held.unpositioned == {0, 1, 2, 3})
        other.subscribe([budget.topic])
        wait_until("two moved to the other member", lambda: pump(consumer, other) or len(held.unpositioned) == 2)
        moved = {0, 1, 2, 3} - held.unpositioned
        held.engine = working
        other.close()
        wait_until("the moved two given back", lambda: pump(consumer) or set(held.started_from) == moved)
        want = {p: [r.value for r in records if r.partition == p] for p in moved}
        wait_until("the given-back two read", lambda: pump(consumer) or {p: read[p] for p in moved} == want, 30)
    finally:
        consumer.close()
        working.dispose()
    assert not set(read) - moved  # the two still unpositioned are not read


def test_a_frozen_zombie_is_refused_by_the_offsets_compare_and_set(budget: BudgetEnv) -> None:
    small = {"ADPIPE_BUDGET_BATCH_SIZE": "10"}
    freeze = {"ADPIPE_FAULT": "budget_before_db_transaction", "ADPIPE_FAULT_SIGNAL": "STOP"}
    zombie, zombie_log = budget.start({**small, **freeze})
    survivor = None
    try:
        wait_until("the zombie owning every partition", lambda: assignment(zombie_log) == [0, 1, 2, 3])
        records = normal_records(80)
        budget.copy(records)
        wait_until(
            "the zombie frozen with a batch read",
            lambda: "SIGSTOP at budget_before_db_transaction" in zombie_log.read_text(),
        )
        assert budget.db_offsets() == {}  # no offsets row for any partition yet
        survivor, survivor_log = budget.start(small)
        # The zombie's session expires; the survivor takes every partition and applies them.
        wait_until("the survivor owning every partition", lambda: assignment(survivor_log) == [0, 1, 2, 3])
        wait_until("the survivor catching up", lambda: caught_up(budget))
        before = budget.snapshot()
        zombie.send_signal(signal.SIGCONT)
        wait_until(
            "the zombie's late batch refused", lambda: "this instance's records of it refused" in zombie_log.read_text()
        )
        time.sleep(3)
        assert budget.snapshot()[:2] == before[:2]
    finally:
        for proc in (zombie, survivor):
            if proc is not None:
                finish(proc)
    log = zombie_log.read_text()
    assert "resumed (SIGCONT)" in log
    assert re.search(r"batch 1: \d+ records: 0 applied", log), log[-3000:]
    expected = independent_spend(as_kafka(records))
    assert {k: v for k, v in budget.spend().items() if v} == {k: v for k, v in expected.items() if v}
    assert budget.query("SELECT count(*) FROM budget_ledger") == [(80,)]
    assert budget_verify.check(budget.settings)["ok"]


def test_publisher_skips_while_another_holds_its_lock_and_budgets_change_live(budget: BudgetEnv) -> None:
    records = normal_records(120, ads=6)
    budget.copy(records)
    expected = independent_spend(as_kafka(records))
    paused = expected_pauses(expected)
    assert paused
    holder = pg_client.connect(budget.pg, budget.name)
    with holder.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(7311002)")  # another instance is publishing (or stuck)
    try:
        started = time.monotonic()
        run = budget.once()
        assert run.returncode == 0, run.log[-3000:]
        assert time.monotonic() - started < 60
        assert run.totals()["applied"] == len(records)  # consumption went on
        assert budget.query("SELECT count(*) FROM budget_events WHERE sent_at IS NULL") == [(len(paused),)]
        assert sum(budget.budget_events().values()) == 0
    finally:
        holder.close()
    service, log_path = budget.start({"ADPIPE_BUDGET_PUBLISH_INTERVAL_MS": "500"})
    try:
        wait_until("the pauses published", lambda: sum(budget.budget_events().values()) == len(paused))
        # Raise every budget far above the spend: each pause lifts, once.
        prices = budget.workdir / "raise.csv"
        prices.write_text(
            # Prices change too: charges already made keep theirs (verify sums the ledger's).
            "scope,key,campaign_id,cpm,cpc,budget\ndefault,*,,9.99,4.5,100000\n"
            "campaign,cmp-A,,1.111111,,100000\nad,ad-000002,,3.5,,100000\n"
        )
        raised = budget.cli("prices", "--file", str(prices))
        assert raised.returncode == 0 and raised.log.count("ad_resumed") == len(paused), raised.log
        # Lower one with plain SQL: the service settles it within a round, no new record needed.
        budget.query("UPDATE budget_pricing SET budget_micros = 1 WHERE scope = 'default' RETURNING 1")
        # Ads priced by the default row alone (not ad-000002, not cmp-A's) pause again.
        repaused = {k for k, v in expected.items() if v > 0 and k[0] not in ("ad-000001", "ad-000002", "ad-000003")}
        assert repaused and repaused <= paused
        wait_until(
            "the resumes and the re-pauses published",
            lambda: sum(budget.budget_events().values()) == 2 * len(paused) + len(repaused),
        )
    finally:
        finish(service)
    by_key: dict[tuple[str, str], list[str]] = defaultdict(list)
    for rec in budget.read(budget.settings.topics.budget_events):
        body = json.loads(rec.value)
        by_key[(body["ad_id"], body["period"])].append(body["event_type"])
    # One long-lived producer published every round of this instance.
    service_log = log_path.read_text()
    assert service_log.count("published ") >= 2 and service_log.count("a new transactional producer") == 1, service_log
    for key, types in by_key.items():
        wanted = (["ad_paused", "ad_resumed"] if key in paused else []) + (["ad_paused"] if key in repaused else [])
        assert types == wanted, (key, types)
    assert set(by_key) == paused | repaused
    report = budget_verify.check(budget.settings)
    assert report["ok"], report


@dataclass
class ReadMessage:
    """A record as the consumer handed it over (partition, offset, value)."""

    _partition: int
    _offset: int
    _value: bytes

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


def test_two_first_writers_of_a_partition_without_offsets_row(budget: BudgetEnv) -> None:
    """Step 6's insert-only compare-and-set on PostgreSQL: two instances both
    believe they own partition 0, which has no offsets row yet. The second
    to commit is refused as a whole, even for records the first never had."""
    engine = db.make_engine(budget.settings)
    schema.ensure_schema(engine, budget.settings)
    with engine.connect() as conn:  # every connection carries its timeouts
        shown = [
            conn.exec_driver_sql(f"SHOW {name}").scalar()
            for name in ("statement_timeout", "idle_in_transaction_session_timeout")
        ]
        assert shown == ["30s", "1min"], shown
    mine = [ReadMessage(0, i, json.dumps(aggregate(minute=i)).encode()) for i in range(3)]
    theirs = [ReadMessage(0, i, json.dumps(aggregate(minute=i, clicks=9)).encode()) for i in range(3)]
    outcome: dict[str, object] = {}
    first = engine.connect()
    transaction = first.begin()
    applied = apply_batch(first, budget.settings, budget.topic, mine, {0: None})
    assert applied.applied == 3

    def second() -> None:
        try:
            with engine.begin() as conn:
                outcome["result"] = apply_batch(conn, budget.settings, budget.topic, theirs, {0: None})
        except StaleOffsets as exc:
            outcome["refused"] = exc.partitions

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(2)
    assert thread.is_alive()  # waits on the first one's offsets row
    transaction.commit()
    first.close()
    thread.join(30)
    engine.dispose()
    assert outcome == {"refused": [0]}, outcome
    assert budget.db_offsets() == {0: 3}
    assert budget.query("SELECT count(*), sum(clicks) FROM budget_ledger") == [(3, 9)]  # 3 records of 3 clicks


def test_a_batch_applied_again_after_a_revoke_and_reassignment_never_moves_the_offset_back(budget: BudgetEnv) -> None:
    """A batch held through a revoke and a re-assignment of its partition (the
    service holds one while it waits out a database outage: its polls run
    the rebalance callbacks) and committed again after the partition's offset
    moved past it: the stored offset stays. The real consumer group and the
    real database; the service's own assignment and commit objects."""
    records = [record(aggregate("ad-000001", minute, 10 + minute, minute % 2), 0) for minute in range(30)]
    budget.copy(records, chunks=1)
    service = BudgetService(budget.settings)
    schema.ensure_schema(service.engine, budget.settings)
    held, committer = service.assignment, service.committer
    service._configure_group()
    held.consumer = consumer = service._consumer()
    read: list = []

    def pump() -> None:
        for m in consumer.consume(50, 0.2):
            if m.error() is None and m.partition() in held.started_from:
                read.append(m)

    try:
        consumer.subscribe([budget.topic], on_assign=held.on_assign, on_revoke=held.on_revoke)
        wait_until("partition 0 read", lambda: pump() or len(read) == 30)
        applied_first = read[:10]
        committer.apply(applied_first)
        assert budget.db_offsets() == {0: 10}
        committer.apply(read[10:])
        assert budget.db_offsets() == {0: 30}
        # A real revoke and re-assignment by the group: the member leaves and joins again.
        consumer.unsubscribe()
        wait_until("partition 0 revoked", lambda: pump() or 0 not in held.started_from)
        consumer.subscribe([budget.topic], on_assign=held.on_assign, on_revoke=held.on_revoke)
        wait_until("partition 0 assigned again at 30", lambda: pump() or held.started_from.get(0) == 30)
        again = committer.apply(applied_first)  # the batch applied first, committed again
        assert (again.applied, again.already_applied) == (0, 10)
        assert budget.db_offsets() == {0: 30}, "the stored offset moved backwards"
        assert held.started_from[0] == 30
        more = [record(aggregate("ad-000001", minute, 10 + minute, 1), 0) for minute in range(30, 35)]
        budget.copy(more, chunks=1)
        wait_until("the new records read", lambda: pump() or len(read) == 35)
        committer.apply(read[30:])
    finally:
        consumer.close()
        service.engine.dispose()
    assert budget.db_offsets() == {0: read[-1].offset() + 1} and read[-1].offset() > 30  # past the marker at 30
    expected = independent_spend(as_kafka(records + more))
    assert {k: v for k, v in budget.spend().items() if v} == {k: v for k, v in expected.items() if v}
    assert budget.query("SELECT count(*) FROM budget_ledger") == [(35,)]
    assert budget_verify.check(budget.settings)["ok"]
