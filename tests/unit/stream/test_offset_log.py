"""offset_log on a fake checkpoint in Spark's own on-disk format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adpipe.stream.offset_log import (
    BatchOffsets,
    CheckpointVersionError,
    LocalCheckpoint,
    OffsetLogError,
    batch_offsets,
    check_query_shape,
    last_committed_batch,
    query_id,
)

TOPIC = "exp-events"
QUERY_ID = "2961e763-1afb-4416-a9f2-f46f64916d24"


def write_offsets(
    checkpoint: Path,
    batch_id: int,
    watermark_ms: int,
    offsets: dict[int, int],
    topic: str = TOPIC,
    branches: int = 2,
) -> None:
    """As the job's query writes it: the one source once per branch reading it."""
    meta = {
        "batchWatermarkMs": watermark_ms,
        "batchTimestampMs": 1795425819628,
        "conf": {"spark.sql.shuffle.partitions": "4"},
    }
    source = {topic: {str(p): o for p, o in offsets.items()}}
    path = checkpoint / "offsets" / str(batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(meta, separators=(",", ":")), *[json.dumps(source)] * branches]
    path.write_bytes("\n".join(["v1", *lines]).encode())
    # Spark's checksum file beside every entry.
    (path.parent / f".{batch_id}.crc").write_bytes(b"crc\x00\x01")


def write_initial(checkpoint: Path, offsets: dict[int, int], topic: str = TOPIC) -> None:
    path = checkpoint / "sources" / "0" / "0"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({topic: {str(p): o for p, o in offsets.items()}}, separators=(",", ":"))
    path.write_bytes(b"\x00v1\n" + body.encode())


def write_commit(checkpoint: Path, batch_id: int) -> None:
    path = checkpoint / "commits" / str(batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'v1\n{"nextBatchWatermarkMs":0}')
    (path.parent / f".{batch_id}.crc").write_bytes(b"crc")


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """Three batches: 0 with input, 1 with input and a watermark, 2 without data."""
    write_initial(tmp_path, {0: 0, 1: 0, 2: 0, 3: 0})
    write_offsets(tmp_path, 0, 0, {0: 799, 1: 729, 2: 762, 3: 706})
    write_offsets(tmp_path, 1, 1795348987545, {0: 1000, 1: 729, 2: 800, 3: 900})
    write_offsets(tmp_path, 2, 1795349047545, {0: 1000, 1: 729, 2: 800, 3: 900})
    write_commit(tmp_path, 0)
    write_commit(tmp_path, 1)
    (tmp_path / "metadata").write_text(json.dumps({"id": QUERY_ID}))
    return tmp_path


def test_batch_zero_starts_at_the_initial_offsets(checkpoint: Path) -> None:
    assert batch_offsets(LocalCheckpoint(checkpoint), 0) == BatchOffsets(
        batch_id=0,
        topic=TOPIC,
        start={0: 0, 1: 0, 2: 0, 3: 0},
        end={0: 799, 1: 729, 2: 762, 3: 706},
        spark_watermark_ms=0,
    )


def test_batch_n_starts_where_batch_n_minus_1_ended(checkpoint: Path) -> None:
    assert batch_offsets(LocalCheckpoint(checkpoint), 1) == BatchOffsets(
        batch_id=1,
        topic=TOPIC,
        start={0: 799, 1: 729, 2: 762, 3: 706},
        end={0: 1000, 1: 729, 2: 800, 3: 900},
        spark_watermark_ms=1795348987545,
    )
    assert batch_offsets(LocalCheckpoint(checkpoint), 2).spark_watermark_ms == 1795349047545


def test_input_offsets(checkpoint: Path) -> None:
    assert batch_offsets(LocalCheckpoint(checkpoint), 0).input_offsets == 2996
    assert batch_offsets(LocalCheckpoint(checkpoint), 1).input_offsets == 433  # 201 + 0 + 38 + 194
    assert batch_offsets(LocalCheckpoint(checkpoint), 2).input_offsets == 0


def test_a_new_partition_counts_from_zero() -> None:
    offsets = BatchOffsets(3, TOPIC, {0: 5}, {0: 5, 1: 3}, 0)
    assert offsets.input_offsets == 3


def test_a_partition_added_since_the_last_batch_is_read_from_its_earliest_offset() -> None:
    offsets = BatchOffsets(3, "t", {0: 5, 1: 2}, {0: 9, 1: 2, 2: 4, 3: 0}, 0)
    assert offsets.kafka_json("start") == '{"t": {"0": 5, "1": 2, "2": -2, "3": -2}}'
    assert offsets.kafka_json("end") == '{"t": {"0": 9, "1": 2, "2": 4, "3": 0}}'
    assert offsets.kafka_assign() == '{"t": [0, 1, 2, 3]}'


def test_kafka_json(checkpoint: Path) -> None:
    offsets = batch_offsets(LocalCheckpoint(checkpoint), 1)
    assert offsets.kafka_json("start") == '{"exp-events": {"0": 799, "1": 729, "2": 762, "3": 706}}'
    assert offsets.kafka_json("end") == '{"exp-events": {"0": 1000, "1": 729, "2": 800, "3": 900}}'


def test_kafka_json_sorts_partitions_numerically() -> None:
    offsets = BatchOffsets(0, "t", {}, {10: 1, 2: 7, 0: 3}, 0)
    assert offsets.kafka_json("end") == '{"t": {"0": 3, "2": 7, "10": 1}}'


def test_missing_entry_raises(checkpoint: Path) -> None:
    with pytest.raises(OffsetLogError, match="offsets/3"):
        batch_offsets(LocalCheckpoint(checkpoint), 3)


def test_missing_previous_entry_raises(checkpoint: Path) -> None:
    (checkpoint / "offsets" / "1").unlink()
    with pytest.raises(OffsetLogError, match="offsets/1"):
        batch_offsets(LocalCheckpoint(checkpoint), 2)


def test_missing_initial_offsets_raises(checkpoint: Path) -> None:
    (checkpoint / "sources" / "0" / "0").unlink()
    with pytest.raises(OffsetLogError, match="sources/0/0"):
        batch_offsets(LocalCheckpoint(checkpoint), 0)


def test_initial_offsets_of_another_topic_raise(tmp_path: Path) -> None:
    write_initial(tmp_path, {0: 0}, topic="other")
    write_offsets(tmp_path, 0, 0, {0: 10})
    with pytest.raises(OffsetLogError, match="other"):
        batch_offsets(LocalCheckpoint(tmp_path), 0)


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        ('{"a":{"0":1},"b":{"0":2}}', "one topic"),
        ('{"t":{"0":1}}\n{"t":{"0":2}}', "one source"),  # the query's two branches disagree
    ],
    ids=["two_topics", "branches_disagree"],
)
def test_an_offsets_entry_of_more_than_one_source_raises(tmp_path: Path, sources: str, message: str) -> None:
    path = tmp_path / "offsets" / "0"
    path.parent.mkdir(parents=True)
    path.write_text('v1\n{"batchWatermarkMs":0}\n' + sources)
    with pytest.raises(OffsetLogError, match=message):
        batch_offsets(LocalCheckpoint(tmp_path), 0)


def test_last_committed_batch(checkpoint: Path) -> None:
    assert last_committed_batch(LocalCheckpoint(checkpoint)) == 1
    write_commit(checkpoint, 2)
    write_commit(checkpoint, 10)
    assert last_committed_batch(LocalCheckpoint(checkpoint)) == 10  # numeric, not by name


def test_last_committed_batch_without_commits(tmp_path: Path) -> None:
    assert last_committed_batch(LocalCheckpoint(tmp_path)) is None
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / ".0.crc").write_bytes(b"crc")
    assert last_committed_batch(LocalCheckpoint(tmp_path)) is None


def test_query_id(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    assert query_id(LocalCheckpoint(checkpoint)) == QUERY_ID
    empty = tmp_path_factory.mktemp("empty")
    assert query_id(LocalCheckpoint(empty)) is None
    (empty / "metadata").write_text("{not json")
    assert query_id(LocalCheckpoint(empty)) is None
    (empty / "metadata").write_text('{"other": 1}')
    assert query_id(LocalCheckpoint(empty)) is None


def test_a_source_listed_once_reads_as_well(tmp_path: Path) -> None:
    write_initial(tmp_path, {0: 0})
    write_offsets(tmp_path, 0, 0, {0: 10}, branches=1)
    assert batch_offsets(LocalCheckpoint(tmp_path), 0).end == {0: 10}


def test_a_checkpoint_of_the_query_shape_passes(checkpoint: Path) -> None:
    check_query_shape(LocalCheckpoint(checkpoint), 2)
    check_query_shape(LocalCheckpoint(checkpoint / "empty"), 2)  # nothing written yet


def test_a_checkpoint_of_an_older_query_is_refused_with_what_to_do(tmp_path: Path) -> None:
    write_initial(tmp_path, {0: 0})
    write_offsets(tmp_path, 0, 0, {0: 10}, branches=1)
    with pytest.raises(CheckpointVersionError, match="new ADPIPE_JOB_ID"):
        check_query_shape(LocalCheckpoint(tmp_path), 2)
