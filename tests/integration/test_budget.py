"""The budget service against a real broker and a real PostgreSQL.

Real transactional aggregates come from one run of the real stream job per
module; each test copies them into its own aggregates topic, with its own
budget database (a fresh PostgreSQL database), consumer group and budget
events topic. ``adpipe budget`` runs as real processes, SIGKILLed at named
points. The expected spend is computed by the tests (``independent_spend``
in helpers.py), from a plain read_committed read of the topic, with their
own Decimal arithmetic and prices."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from datetime import UTC, datetime

import pytest
from adpipe import kafka_io
from adpipe.settings import Settings, isolated_env, load_settings
from confluent_kafka import Producer

from tests.integration.budget_helpers import (
    MICRO,
    BudgetEnv,
    SourceRecord,
    assignment,
    expected_pauses,
    independent_spend,
    wait_until,
)
from tests.integration.helpers import BROKER_ENV, Pipeline


@pytest.fixture(scope="module")
def source(broker: Settings, tmp_path_factory: pytest.TempPathFactory) -> list[SourceRecord]:
    """Aggregates written by one run of the real stream job."""
    name = f"t{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        **BROKER_ENV,
        **isolated_env(name),
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
    # It is the last round claimed: the first run's publisher may have published a round of batch
    # 1's pauses before that run died in batch 2, and those are in Kafka and marked sent.
    unsent = set(budget.query(
        "SELECT ad_id, period FROM budget_events WHERE sent_at IS NULL "
        "AND round = (SELECT max(round) FROM budget_events)"
    ))
    sent = set(budget.query("SELECT ad_id, period FROM budget_events WHERE sent_at IS NOT NULL"))
    assert unsent and unsent | sent == set(published) and not unsent & sent, (published, unsent, sent)
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


def test_two_instances_one_killed_mid_run(budget: BudgetEnv, source: list[SourceRecord]) -> None:
    small = {"ADPIPE_BUDGET_BATCH_SIZE": "10"}
    doomed, doomed_log = budget.start({**small, **_fault("budget_after_db_commit", 4)})
    survivor, survivor_log = budget.start(small)
    try:
        # Both share the partitions before any data arrives.
        wait_until(
            "two instances sharing the partitions",
            lambda: (a := assignment(doomed_log)) is not None
            and (b := assignment(survivor_log)) is not None
            and len(a) == len(b) == 2
            and not set(a) & set(b),
        )
        budget.copy(source, chunks=8)
        doomed.wait(timeout=90)
        assert doomed.returncode == -signal.SIGKILL, doomed_log.read_text()[-3000:]
        dead_ones = assignment(doomed_log)
        ends = kafka_io.end_offsets(budget.bootstrap, budget.topic)
        # The survivor takes the dead one's partitions (after its session times out) from the database offsets.
        wait_until("the survivor owning every partition", lambda: assignment(survivor_log) == [0, 1, 2, 3])
        wait_until(
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
    # The consumer protocol's rebalance is incremental: the survivor kept its
    # own two partitions and was handed the dead one's alone (the classic
    # protocol revokes everything and assigns all four).
    takeover = [line for line in log.split("signal 15: stopping", 1)[0].splitlines()
                if "assigned partitions " in line and line.endswith("assignment now [0, 1, 2, 3]")][-1]
    handed = json.loads(takeover.split("assigned partitions ", 1)[1].split(" of ", 1)[0])
    assert handed == dead_ones and len(handed) == 2, takeover
    budget.assert_exact()
