"""Read what Spark's checkpoint says about one micro-batch.

Spark writes ``offsets/N`` (the batch's end offsets and its watermark)
before it runs batch N and ``commits/N`` after the sink returned. A batch
replayed after a crash therefore reads the very same entries here, which is
what makes the late/DLQ routing of a replay identical to the first run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pyspark.sql import SparkSession

# Spark's offset JSON for "the partition's earliest offset".
EARLIEST = -2


class OffsetLogError(RuntimeError):
    """The checkpoint lacks an entry the running batch must have."""


class CheckpointVersionError(OffsetLogError):
    """The checkpoint was written by a query of another shape."""


@dataclass(frozen=True)
class BatchOffsets:
    batch_id: int
    topic: str
    start: dict[int, int]
    end: dict[int, int]
    # Spark's own watermark of the batch (on the batch ids, see
    # adpipe.spark.StreamOperators); the event-time watermark is adpipe.stream.watermark's.
    spark_watermark_ms: int

    @property
    def input_offsets(self) -> int:
        return sum(self.end[p] - self.start.get(p, 0) for p in self.end)

    @property
    def waiting(self) -> list[int]:
        """The partitions this batch reads: those that had records waiting
        when Spark planned it (offsets moved; a partition new since the
        previous batch from its first offset)."""
        return sorted(p for p, end in self.end.items() if end > self.start.get(p, 0))

    def kafka_json(self, which: str) -> str:
        """Spark's ``startingOffsets`` / ``endingOffsets`` of this batch, over
        the batch's partitions. A partition added to the topic since the
        previous batch has no start yet: it is read from its earliest offset
        (-2), as Spark's stream source reads a newly discovered partition."""
        if which == "start":
            offsets = {p: self.start.get(p, EARLIEST) for p in self.end}
        else:
            offsets = self.end
        return json.dumps({self.topic: {str(p): o for p, o in sorted(offsets.items())}})

    def kafka_assign(self) -> str:
        """Spark's ``assign`` option: exactly this batch's partitions (the
        topic may have more by now)."""
        return json.dumps({self.topic: sorted(self.end)})


class CheckpointFiles(Protocol):
    """Read access to a checkpoint, wherever it lives."""

    def read(self, relative: str) -> bytes | None:
        """The file's bytes; None when it does not exist."""

    def names(self, relative: str) -> list[str]:
        """The entries of a folder; empty when it does not exist."""

    def write(self, relative: str, text: str) -> None:
        """Write a file whole (a reader sees all of it or none), replacing it."""

    def delete(self, relative: str) -> None:
        """Delete a file if it is there."""


@dataclass(frozen=True)
class LocalCheckpoint:
    """A checkpoint in a local folder (tests; tools on the driver's host)."""

    root: Path

    def __str__(self) -> str:
        return str(self.root)

    def read(self, relative: str) -> bytes | None:
        try:
            return (self.root / relative).read_bytes()
        except FileNotFoundError:
            return None

    def names(self, relative: str) -> list[str]:
        folder = self.root / relative
        return [p.name for p in folder.iterdir()] if folder.is_dir() else []

    def write(self, relative: str, text: str) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)

    def delete(self, relative: str) -> None:
        (self.root / relative).unlink(missing_ok=True)


class HadoopCheckpoint:
    """A checkpoint at any URI Spark writes (``file://``, ``hdfs://``,
    ``s3a://``), read through Spark's own Hadoop FileSystem and
    configuration, so it reads exactly what the query wrote."""

    def __init__(self, spark: SparkSession, uri: str) -> None:
        jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j gateway
        self._jvm = jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001
        self._root = jvm.org.apache.hadoop.fs.Path(uri)
        self._fs = self._root.getFileSystem(self._conf)
        self.uri = uri

    def __str__(self) -> str:
        return self.uri

    def _path(self, relative: str):  # noqa: ANN202 - a Hadoop Path
        return self._jvm.org.apache.hadoop.fs.Path(self._root, relative)

    def read(self, relative: str) -> bytes | None:
        path = self._path(relative)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def names(self, relative: str) -> list[str]:
        path = self._path(relative)
        if not self._fs.exists(path):
            return []
        return [status.getPath().getName() for status in self._fs.listStatus(path)]

    def write(self, relative: str, text: str) -> None:
        # Through Spark's own checkpoint file manager (adpipe.spark.CheckpointWrites), as its logs are.
        self._jvm.adpipe.spark.CheckpointWrites.write(self.uri, relative, text, self._conf)

    def delete(self, relative: str) -> None:
        self._jvm.adpipe.spark.CheckpointWrites.delete(self.uri, relative, self._conf)


def _json_lines(files: CheckpointFiles, relative: str) -> list[str]:
    raw = files.read(relative)
    if raw is None:
        raise OffsetLogError(f"missing checkpoint entry {relative} in {files}")
    # The first line is a version tag (sometimes preceded by a length byte).
    return [line for line in raw.decode(errors="replace").splitlines()[1:] if line.strip()]


def _source_offsets(line: str) -> tuple[str, dict[int, int]]:
    parsed = json.loads(line)
    if len(parsed) != 1:
        raise OffsetLogError(f"expected offsets of one topic, got {sorted(parsed)}")
    ((topic, offsets),) = parsed.items()
    return topic, {int(p): int(o) for p, o in offsets.items()}


def _entry(files: CheckpointFiles, batch_id: int) -> tuple[int, str, dict[int, int]]:
    lines = _json_lines(files, f"offsets/{batch_id}")
    metadata = json.loads(lines[0])
    # One Kafka source, listed once per branch of the query that reads it
    # (once since the one-operator query; twice before): the entries must agree.
    if len(lines) < 2 or len(set(lines[1:])) != 1:
        raise OffsetLogError(f"offsets/{batch_id} must name one source, got {lines[1:]}")
    topic, offsets = _source_offsets(lines[1])
    return int(metadata.get("batchWatermarkMs", 0)), topic, offsets


def batch_offsets(files: CheckpointFiles, batch_id: int) -> BatchOffsets:
    watermark, topic, end = _entry(files, batch_id)
    if batch_id == 0:
        initial = _json_lines(files, "sources/0/0")
        start_topic, start = _source_offsets(initial[0]) if initial else (topic, {})
        if start_topic != topic:
            raise OffsetLogError(f"initial offsets name topic {start_topic}, batch 0 names {topic}")
    else:
        _watermark, _topic, start = _entry(files, batch_id - 1)
    return BatchOffsets(batch_id, topic, start, end, watermark)


def check_query_shape(files: CheckpointFiles, sources: int) -> None:
    """Before the query starts: the checkpoint's newest offsets entry must
    list the source as many times as the query reads it (``sources``).
    Spark would stop at its first batch with an assertion; this says what it
    means and what to do."""
    ids = [int(name) for name in files.names("offsets") if name.isdigit()]
    if not ids:
        return
    listed = len(_json_lines(files, f"offsets/{max(ids)}")) - 1
    if listed != sources:
        raise CheckpointVersionError(
            f"the checkpoint {files} was written by a query that read its source {listed} time(s); this "
            f"version's query reads it {sources} time(s) (one stateful operator: the windows, the dedupe and "
            "the late events). Spark cannot resume it: start this job with a new ADPIPE_JOB_ID, or move the checkpoint "
            "away once its last batch is committed."
        )


def last_committed_batch(files: CheckpointFiles) -> int | None:
    ids = [int(name) for name in files.names("commits") if name.isdigit()]
    return max(ids) if ids else None


def query_id(files: CheckpointFiles) -> str | None:
    raw = files.read("metadata")
    try:
        return json.loads(raw)["id"] if raw is not None else None
    except (KeyError, TypeError, json.JSONDecodeError):
        return None
