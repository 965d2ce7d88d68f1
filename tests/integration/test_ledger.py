"""The ledger cannot lie: a ledger that lost its offsets, or that names other
offsets for a batch than the checkpoint does, stops the job with a clear
error instead of a guess (skipping loses data, writing duplicates it)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from adpipe import kafka_io
from adpipe.stream.cli import EXIT_FENCED
from adpipe.stream.offset_log import LocalCheckpoint, last_committed_batch
from confluent_kafka import Consumer, TopicPartition

from tests.integration.helpers import make_pipeline

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _ledger(pipeline) -> dict[int, tuple[int, str]]:  # noqa: ANN001
    return kafka_io.stream_commits(pipeline.settings)


def test_an_expired_ledger_or_one_for_other_offsets_stops_the_job(broker, tmp_path: Path) -> None:  # noqa: ANN001
    # The checkpoint is a file:// URI outside ADPIPE_HOME: the job reads its
    # offset log through Spark's Hadoop FileSystem, wherever it is.
    elsewhere = tmp_path / "checkpoints elsewhere"
    pipeline = make_pipeline(tmp_path, {"ADPIPE_CHECKPOINT_URI": f"file://{elsewhere}"})
    summary = pipeline.produce(events=400, seed=41, minutes=3, start=START)
    first = pipeline.stream(max_offsets=150)
    assert first.returncode == 0, first.log[-3000:]
    aggregates = pipeline.aggregates()
    assert aggregates and summary["distinct_on_time"] == 400
    checkpoint = pipeline.settings.checkpoint_dir
    assert checkpoint == elsewhere / pipeline.settings.job_id and (checkpoint / "offsets" / "0").exists()
    assert not (pipeline.settings.home / "checkpoints" / pipeline.settings.job_id).exists()
    last = last_committed_batch(LocalCheckpoint(checkpoint))
    ledger = _ledger(pipeline)
    assert {json.loads(meta)["batch_id"] for _o, meta in ledger.values()} == {last}

    # 1. The ledger's offsets are gone (an idle group past offsets.retention.minutes).
    group = kafka_io.ledger_group(pipeline.settings.job_id)
    admin = kafka_io.admin(pipeline.settings.kafka_bootstrap)
    admin.delete_consumer_groups([group])[group].result()
    assert _ledger(pipeline) == {}
    refused = pipeline.stream()
    assert refused.returncode == EXIT_FENCED, refused.log[-3000:]
    assert f"committed batches up to {last} but the ledger group {group} holds no offsets" in refused.log
    assert "started: query" not in refused.log  # refused before the query started
    accepted = pipeline.stream(max_offsets=150, extra_args=("--accept-empty-ledger",))
    assert accepted.returncode == 0, accepted.log[-3000:]
    assert f"written again from the checkpoint's last batch {last}" in accepted.log
    assert {json.loads(meta)["batch_id"] for _o, meta in _ledger(pipeline).values()} == {last}
    assert {p: o for p, (o, _m) in _ledger(pipeline).items()} == {p: o for p, (o, _m) in ledger.items()}
    assert pipeline.aggregates() == aggregates  # nothing new, nothing again

    # 2. The ledger names other end offsets for the batch Spark replays.
    pipeline.produce(events=100, seed=42, minutes=1, start=START.replace(minute=3))
    again = pipeline.stream(max_offsets=1000)
    assert again.returncode == 0, again.log[-3000:]
    replayed = last_committed_batch(LocalCheckpoint(checkpoint))
    (checkpoint / "commits" / str(replayed)).unlink()  # Spark will run this batch again
    forged = {p: (o + 1, meta) for p, (o, meta) in _ledger(pipeline).items()}
    consumer = Consumer({"bootstrap.servers": pipeline.settings.kafka_bootstrap, "group.id": group})
    topic = pipeline.settings.topics.events
    offsets = [TopicPartition(topic, p, o, metadata=m) for p, (o, m) in forged.items()]
    consumer.commit(offsets=offsets, asynchronous=False)
    consumer.close()
    stopped = pipeline.stream()
    assert stopped.returncode == EXIT_FENCED, stopped.log[-3000:]
    assert f"the ledger says batch {replayed} ended at offsets" in stopped.log
    assert "they describe different batches" in stopped.log
