"""Exactly-once proofs with real processes: a KRaft broker, Spark stream
jobs killed with SIGKILL at the seed's three failure timings, a clean
SIGTERM stop, a zombie fenced by its successor, and read-back with read_committed consumers.

Expected counts come from the producer's own summary, never from the job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from adpipe import kafka_io
from adpipe import schemas as S
from adpipe.faults import AFTER_COMMIT, AFTER_PRODUCE, DURING_COMMIT
from adpipe.stream import job as stream
from adpipe.stream import leadership
from adpipe.stream.sink import TransactionalSink
from confluent_kafka import KafkaException, Producer

from tests.integration.helpers import assert_exactly_once, reaped, wait_for

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)

# What the producer's malformed kinds must be rejected as (the contract).
REASON_OF_KIND = {
    "not_json": S.REASON_NOT_JSON,
    "not_object": S.REASON_NOT_OBJECT,
    "missing_event_id": S.REASON_BAD_EVENT_ID,
    "event_id_not_string": S.REASON_BAD_EVENT_ID,
    "missing_ad_id": S.REASON_BAD_AD_ID,
    "unknown_event_type": S.REASON_BAD_EVENT_TYPE,
    "bad_event_time": S.REASON_BAD_EVENT_TIME,
    "naive_event_time": S.REASON_BAD_EVENT_TIME,
    "bool_event_time": S.REASON_BAD_EVENT_TIME,
}


def test_steady_state_counts_late_and_dlq_exactly_then_verify_names_an_injected_duplicate(pipeline) -> None:  # noqa: ANN001
    s1 = pipeline.produce(events=1500, seed=11, minutes=4, start=START, duplicate_rate=0.06, malformed_rate=0.03)
    first = pipeline.stream()
    assert first.returncode == 0, first.log[-3000:]
    assert len(first.batch_lines()) >= 3  # several micro-batches, so dedupe spans batches
    s2 = pipeline.produce(events=600, seed=12, minutes=2, start=START + timedelta(minutes=4), late_rate=0.05)
    second = pipeline.stream()
    assert second.returncode == 0, second.log[-3000:]
    assert "Spark dropped" not in first.log + second.log  # the watermark dropped no row unseen

    assert s1["duplicates"] > 50 and s2["late"] == 30
    assert_exactly_once(pipeline, [s1, s2], min_windows=20 * 5)

    # The ledger names, per output partition, an offset the last batch's
    # output lies below (the loads wait until it is readable): readable now,
    # and past every record of the last batch that wrote output.
    settings = pipeline.settings
    commits = kafka_io.stream_commits(settings)
    outputs = kafka_io.committed_outputs(commits)
    last_batch = max(json.loads(meta)["batch_id"] for _offset, meta in commits.values())
    for topic, ends in outputs.items():
        readable = kafka_io.end_offsets(settings.kafka_bootstrap, topic)
        assert all(end <= readable[p] for p, end in ends.items())
        written = [r for r in pipeline.read(topic) if r.header(S.HEADER_BATCH) == str(last_batch)]
        assert written and all(r.offset < ends[r.partition] for r in written)

    late = pipeline.read(pipeline.settings.topics.late)
    late_ids = [json.loads(r.value)["event_id"] for r in late]
    assert sorted(late_ids) == sorted(e["event_id"] for e in s2["late_events"])
    assert {r.header(S.HEADER_REASON) for r in late} == {"late"}

    dlq = pipeline.read(pipeline.settings.topics.dlq)
    expected_reasons = Counter()
    for kind, n in s1["malformed_by_reason"].items():
        expected_reasons[REASON_OF_KIND[kind]] += n
    assert Counter(r.header(S.HEADER_REASON) for r in dlq) == expected_reasons
    assert len({r.header(S.HEADER_SOURCE) for r in dlq}) == s1["malformed"]
    # Each copy is its source record, key and value (carried through the
    # query when small, fetched by position otherwise), read here directly.
    raw = {(r.partition, r.offset): r for r in pipeline.read(settings.topics.events)}
    for r in dlq:
        topic, partition, offset = r.header(S.HEADER_SOURCE).rsplit("/", 2)
        assert topic == settings.topics.events
        assert (r.key, r.value) == (raw[int(partition), int(offset)].key, raw[int(partition), int(offset)].value)

    # A second copy of one aggregate, committed by another producer: verify
    # (the function and the CLI) names it.
    victim = pipeline.aggregates()[0]
    producer = Producer({"bootstrap.servers": pipeline.settings.kafka_bootstrap, "transactional.id": "intruder"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(pipeline.settings.topics.aggregates, json.dumps(victim).encode(), victim["ad_id"].encode())
    producer.commit_transaction(30)
    report = pipeline.verify()
    assert not report["ok"]
    assert report["aggregates"]["duplicated"] == [
        {"ad_id": victim["ad_id"], "window_start": victim["window_start"], "revision": 0, "copies": 2}
    ]
    assert report["aggregates"]["record_uuid_duplicated_count"] == 1
    cli = subprocess.run(
        [sys.executable, "-m", "adpipe", "verify"], env=pipeline.env, capture_output=True, text=True, check=False
    )
    assert cli.returncode == 1
    assert json.loads(cli.stdout)["aggregates"]["duplicated_count"] == 1


@pytest.mark.parametrize("point", [AFTER_PRODUCE, AFTER_COMMIT, DURING_COMMIT])
def test_sigkill_at_each_commit_point_then_restart_is_exactly_once(pipeline, point: str) -> None:  # noqa: ANN001
    s1 = pipeline.produce(events=1500, seed=21, minutes=4, start=START, duplicate_rate=0.04, malformed_rate=0.02)
    killed = pipeline.stream(fault={"ADPIPE_FAULT": point, "ADPIPE_FAULT_BATCH": "1"})
    assert killed.returncode == -9, killed.log[-3000:]
    assert f"fault injection: SIGKILL at {point}" in killed.log
    committed_at_crash = pipeline.aggregates()
    uncommitted_at_crash = pipeline.aggregates("read_uncommitted")

    restarted = pipeline.stream()
    assert restarted.returncode == 0, restarted.log[-3000:]
    aggregates = assert_exactly_once(pipeline, [s1], min_windows=20 * 3)

    uuid_of = {(a["ad_id"], a["window_start"]): a["record_uuid"] for a in aggregates}
    everything = pipeline.aggregates("read_uncommitted")
    # Every copy ever written, committed or aborted, carries the same key.
    assert all(uuid_of[(a["ad_id"], a["window_start"])] == a["record_uuid"] for a in everything)
    if point == AFTER_PRODUCE:
        # The killed transaction's records were written, and hidden.
        assert len(uncommitted_at_crash) > len(committed_at_crash)
        assert len(everything) > len(aggregates)
        assert "already committed" not in restarted.log
    elif point == AFTER_COMMIT:
        # Committed before the crash: the replayed batch is skipped, so
        # nothing was ever aborted or written twice.
        assert len(committed_at_crash) > 0
        assert "already committed by an earlier run" in restarted.log
        assert len(everything) == len(aggregates)
    else:
        # In flight: either the coordinator completed the commit (the replay
        # is skipped) or it never saw it (aborted, produced again).
        skipped = "already committed by an earlier run" in restarted.log
        assert skipped == (len(everything) == len(aggregates))


@pytest.mark.parametrize("signal_name", ["KILL", "STOP"])
def test_a_standby_driver_takes_over_from_an_active_one_killed_or_paused_mid_transaction(
    pipeline, signal_name: str  # noqa: ANN001
) -> None:
    """The active driver SIGKILLs (or SIGSTOPs) itself in a batch after
    producing into its transaction; the warm standby takes over (the
    leadership group hands it the job once the driver's session expires),
    fences the open transaction and replays the batch. A paused driver,
    resumed, finds its leadership lost and exits fenced (4)."""
    settings = pipeline.settings
    fast = {"ADPIPE_TRIGGER_INTERVAL_S": "1"}

    def leads(pid: int) -> bool:
        try:
            current = leadership.leader(settings)
        except KafkaException:  # the group not described this time (a loaded broker): asked again
            return False
        return current is not None and current.pid == pid
    fault = {"ADPIPE_FAULT": AFTER_PRODUCE, "ADPIPE_FAULT_BATCH": "1", "ADPIPE_FAULT_SIGNAL": signal_name}
    # No input yet, so the active driver runs no batch before the standby waits.
    active, active_log = pipeline.start_stream("--max-offsets-per-trigger", "400", extra_env={**fast, **fault})
    with reaped(active):
        wait_for(lambda: leads(active.pid), active, active_log, "the active driver leading", timeout_s=180)
        standby, standby_log = pipeline.start_stream("--standby", "--max-offsets-per-trigger", "400", extra_env=fast)
        with reaped(standby):
            def waits(pid: int) -> bool:
                try:
                    return [d.pid for d in leadership.drivers(settings) if not d.leads] == [pid]
                except KafkaException:
                    return False

            wait_for(lambda: waits(standby.pid), standby, standby_log, "the standby waiting to lead", timeout_s=180)
            # It waits from the start, warming up meanwhile: the fault comes once it is warm.
            wait_for(lambda: leadership.STANDBY_WARM_LINE in standby_log.read_text(), standby, standby_log,
                     "the standby's warm-up", timeout_s=180)
            if signal_name == "KILL":  # a driver without --standby is still refused
                refused = pipeline.stream(timeout=120)
                assert refused.returncode == 4 and f"(pid {active.pid} " in refused.log, refused.log[-3000:]

            # Atomic: the active driver runs meanwhile, and a batch of some partitions' records
            # only would make the others' earlier events late (CI met it once).
            s1 = pipeline.produce(atomic=True, events=1500, seed=41, minutes=4, start=START,
                                  duplicate_rate=0.04, malformed_rate=0.02)
            wait_for(lambda: f"fault injection: SIG{signal_name} at {AFTER_PRODUCE}" in active_log.read_text(),
                     standby, standby_log, "the active driver's fault", timeout_s=240, interval_s=0.5)
            if signal_name == "KILL":
                assert active.wait(timeout=60) == -9, active_log.read_text()[-3000:]

            def caught_up() -> bool:
                lag = kafka_io.stream_lag(settings)
                return bool(lag) and sum(lag.values()) == 0

            wait_for(caught_up, standby, standby_log, "the standby consuming all input", timeout_s=240, interval_s=1)
            log = standby_log.read_text()
            # Its first batch is the one the active driver was in, replayed.
            active_batches = re.findall(r"adpipe\.stream: batch (\d+):", active_log.read_text())
            took_over = re.search(r"standby: took over \((.*)\); batch (\d+) done", log)
            assert took_over and int(took_over[2]) == int(active_batches[-1]) + 1, log[-3000:]
            assert f"pid {active.pid} on " in took_over[1] and "left the group" in took_over[1]
            assert "older instances fenced, open transaction aborted" in log
            if signal_name == "STOP":
                assert active.poll() is None and leads(standby.pid)  # paused, its session expired
                os.kill(active.pid, signal.SIGCONT)
                assert active.wait(timeout=60) == 4, active_log.read_text()[-3000:]  # fenced at once
                assert "fenced: " in active_log.read_text()
            wait_for(lambda: leads(standby.pid), standby, standby_log, "the standby leading", timeout_s=30)
            # Stopped before the check: a batch committing while verify reads
            # would show windows past the watermark verify read first.
            standby.terminate()
            assert standby.wait(timeout=120) == 0, standby_log.read_text()[-3000:]
            # The interrupted transaction's records were written and stay hidden.
            assert len(pipeline.aggregates("read_uncommitted")) > len(pipeline.aggregates())
            assert_exactly_once(pipeline, [s1], min_windows=20 * 2)  # the watermark's lateness holds the rest


def test_sigterm_stops_cleanly_then_the_restarted_job_is_fenced_as_a_zombie(pipeline) -> None:  # noqa: ANN001
    s1 = pipeline.produce(events=600, seed=31, minutes=3, start=START)
    # 1. SIGTERM to the driver only, as a supervisor would: it finishes the
    # current batch and exits 0.
    with pipeline.continuous_stream() as (job, log_path):
        wait_for(
            pipeline.aggregates, job, log_path, "the stream job never committed aggregates", timeout_s=180, interval_s=1
        )
        job.terminate()
        assert job.wait(timeout=120) == 0, log_path.read_text()[-3000:]
    log = log_path.read_text()
    assert "stopping after the current batch" in log
    assert "stopped after" in log

    # 2. The restart continues from the checkpoint with new events. Once it
    # has run a batch (its transactional producer is up), a successor with
    # the same transactional.id takes over: init fences it. What is visible
    # then stays so: nothing the zombie writes after the fence is seen.
    s2 = pipeline.produce(events=600, seed=32, minutes=3, start=START + timedelta(minutes=3))
    with pipeline.continuous_stream() as (zombie, log_path):
        wait_for(
            lambda: "adpipe.stream: batch" in log_path.read_text(),
            zombie,
            log_path,
            "no batch after restart",
            timeout_s=180,
            interval_s=1,
        )
        # A second driver on the checkpoint in use is refused before it starts.
        second = pipeline.stream(timeout=120)
        assert second.returncode == 4, second.log[-3000:]
        assert f"led by another stream driver (pid {zombie.pid} " in second.log
        successor = TransactionalSink(
            pipeline.settings.kafka_bootstrap,
            stream.transactional_id(pipeline.settings),
            kafka_io.ledger_group(pipeline.settings.job_id),
            pipeline.settings.topics.events,
            None,
            60_000,
        )
        successor.read_ledger()  # runs init_transactions
        visible_at_fence = pipeline.aggregates()
        s3 = pipeline.produce(events=600, seed=33, minutes=3, start=START + timedelta(minutes=6))
        zombie.wait(timeout=180)
    log = log_path.read_text()
    assert zombie.returncode == 4, log[-3000:]
    assert "was fenced" in log
    assert pipeline.aggregates() == visible_at_fence
    successor.close()

    # 3. A recovery run: nothing lost, nothing twice across all three jobs.
    recovered = pipeline.stream()
    assert recovered.returncode == 0, recovered.log[-3000:]
    assert_exactly_once(pipeline, [s1, s2, s3], min_windows=20 * 7)
