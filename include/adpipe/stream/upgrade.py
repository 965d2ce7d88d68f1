"""``adpipe stream --upgrade-checkpoint``: carry a checkpoint written by the
earlier version of the stream job over to this one, once.

The earlier version ran one Python stateful operator keyed by (event minute,
id bucket), whose state held each minute's event-id digests and its open
windows' counts, and closed windows by Spark's watermark. This version's two
operators (``adpipe.spark.StreamOperators``) keep other state, which Spark
cannot resume from the old one. The upgrade:

1. takes the job's leadership (no driver may run) and checks that the old
   checkpoint's last committed batch N is the ledger's;
2. reads the old state as of batch N with Spark's state reader: the digests
   (the same 16-byte BLAKE2b this version keys its ids by; their first event
   time is not known, so any later copy of them is a repeat, never a
   conflict) and the open windows' counts;
3. moves the old checkpoint aside (``<checkpoint>.before-upgrade-<time>``)
   and starts a new one in its place: its ``metadata`` (a new query id),
   the initial states (``adpipe/upgrade/ids``, ``.../windows``), where to
   start reading (batch N's end offsets) and the progress before its first
   batch (``adpipe/progress/-1``): the old watermark plus the allowed
   lateness, so that every window the old job emitted is final (a late event
   for one is listed late, never counted into a second revision 0);
4. writes the ledger entry of that progress for the new query (batch -1,
   batch N's end offsets) in a transaction of the job's own
   ``transactional.id``, which also fences any old producer.

The job's next start finds the new checkpoint without commits: its first
batch starts at those offsets with the initial states (Spark applies them in
a new checkpoint's first batch only, a replay of it included), and the
windows the old job had open close and are emitted as revision 0 with the
counts they had plus the new events. A crash anywhere before step 4 leaves
the old checkpoint in place or aside, whole: run the upgrade again (from
the aside copy, see the log)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from adpipe.settings import Settings
from adpipe.stream.offset_log import (
    CheckpointFiles,
    HadoopCheckpoint,
    batch_offsets,
    last_committed_batch,
    query_id,
)
from adpipe.stream.watermark import PROGRESS_DIR, Progress, ProgressLog

log = logging.getLogger("adpipe.stream")

UPGRADE_DIR = "adpipe/upgrade"
# The earlier version's id buckets per minute (its state's keys).
OLD_ID_BUCKETS = 8
MARKER = f"{UPGRADE_DIR}/from.json"


class UpgradeError(RuntimeError):
    """The checkpoint cannot be upgraded as it is (the message says why)."""


def is_old_checkpoint(files: CheckpointFiles) -> int | None:
    """The last committed batch of a checkpoint the earlier version wrote
    (committed batches, no progress entry for the last); None otherwise."""
    last = last_committed_batch(files)
    if last is None or files.read(f"{PROGRESS_DIR}/{last}") is not None:
        return None
    return last


def pending(files: CheckpointFiles) -> dict | None:
    """An upgraded checkpoint's start (marker), until its first batch commits."""
    if last_committed_batch(files) is not None:
        return None
    raw = files.read(MARKER)
    return None if raw is None else json.loads(raw)


def initial_states(spark: SparkSession, checkpoint_uri: str) -> tuple[DataFrame, DataFrame]:
    """The upgrade's initial states, as the new checkpoint holds them."""
    return (
        spark.read.parquet(f"{checkpoint_uri.rstrip('/')}/{UPGRADE_DIR}/ids"),
        spark.read.parquet(f"{checkpoint_uri.rstrip('/')}/{UPGRADE_DIR}/windows"),
    )


def _old_state(spark: SparkSession, path: str, variable: str) -> list:
    spark.streams.active  # noqa: B018 - Spark's state reader needs the streams' state store coordinator
    return spark.read.format("statestore").option("path", path).option("stateVarName", variable).load().collect()


def read_old_state(spark: SparkSession, path: str) -> tuple[list[tuple], list[tuple]]:
    """The earlier version's state at ``path``, as this version's initial
    states: (id bucket, segment, blob) rows of ids, one segment per old key
    (minute, old bucket) and new bucket (negative segment ids: this
    version's are batch ids), and (window minute, ad, impressions, clicks)
    rows of its open windows."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j gateway
    ids = []
    for row in _old_state(spark, path, "seen_digests"):
        minute, old_bucket = row.key.event_minute, row.key.id_bucket
        blobs = jvm.adpipe.spark.EventIds.upgradeSegments(bytes(row.value.digests), minute)
        for bucket, blob in enumerate(blobs):
            if blob is not None:
                ids.append((bucket, -1 - (minute * OLD_ID_BUCKETS + old_bucket), bytes(blob)))
    counts: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    for row in _old_state(spark, path, "window_counts"):
        table = pa.ipc.open_stream(pa.py_buffer(bytes(row.value.counts))).read_all()
        for ad_id, impressions, clicks in zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True):
            total = counts[(row.key.event_minute, ad_id)]
            total[0] += impressions
            total[1] += clicks
    windows = [(minute, ad_id, imp, clk) for (minute, ad_id), (imp, clk) in sorted(counts.items())]
    return ids, windows


def upgrade(settings: Settings, spark: SparkSession, sink_for: Callable[[CheckpointFiles], Any]) -> int:
    """Steps 1-4 of the module doc; returns the number of open windows
    carried over. ``sink_for``: the job's transactional sink for a
    checkpoint (the driver's, with its limits)."""
    from adpipe.stream.leadership import leadership

    uri = settings.checkpoint_uri.rstrip("/")
    with leadership(settings):
        old = HadoopCheckpoint(spark, uri)
        last = is_old_checkpoint(old)  # Step 1
        if last is None:
            raise UpgradeError(f"the checkpoint {uri} needs no upgrade (no committed batch, or this version's)")
        batch = batch_offsets(old, last)
        sink = sink_for(old)
        try:
            ledger = sink.read_ledger()
            if ledger is None or ledger.batch_id != last or ledger.offsets != batch.end:
                raise UpgradeError(
                    f"the ledger ({None if ledger is None else (ledger.batch_id, ledger.offsets)}) is not at the "
                    f"checkpoint's last committed batch {last} ({batch.end}): start the earlier version once to "
                    "settle it, then upgrade"
                )
            ids, windows = read_old_state(spark, uri)  # Step 2
            aside = f"{uri}.before-upgrade-{time.strftime('%Y%m%dT%H%M%S')}"  # Step 3
            _rename(spark, uri, aside)
            new = HadoopCheckpoint(spark, uri)
            new_query = str(uuid.uuid4())
            new.write("metadata", json.dumps({"id": new_query}))
            spark.createDataFrame(ids, _schema(spark, "INITIAL_IDS")).write.parquet(f"{uri}/{UPGRADE_DIR}/ids")
            spark.createDataFrame(windows, _schema(spark, "INITIAL_WINDOWS")).write.parquet(
                f"{uri}/{UPGRADE_DIR}/windows"
            )
            watermark_ms = batch.spark_watermark_ms + settings.allowed_lateness_s * 1000
            start = {"topic": batch.topic, "end_offsets": {str(p): o for p, o in batch.end.items()}}
            new.write(MARKER, json.dumps({"from": aside, "batch": last, "old_query_id": query_id(old), **start}))
            ProgressLog(new).write(Progress(-1, watermark_ms))
            sink.query_id = new_query  # Step 4
            sink.write_entry(-1, batch.end, watermark_ms)
        finally:
            sink.close()
    log.info(
        "checkpoint %s upgraded from batch %d of the earlier version (kept at %s): %d id segments and %d open "
        "windows carried over; the next start reads on from %s with the watermark at %s",
        uri, last, aside, len(ids), len(windows), batch.end, watermark_ms,
    )  # fmt: skip
    return len(windows)


def _schema(spark: SparkSession, name: str) -> str:
    """A Java StructType of StreamOperators, as Spark DDL."""
    return getattr(spark.sparkContext._jvm.adpipe.spark.StreamOperators, name).toDDL()  # noqa: SLF001


def _rename(spark: SparkSession, uri: str, to: str) -> None:
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j gateway
    source = jvm.org.apache.hadoop.fs.Path(uri)
    fs = source.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # noqa: SLF001
    if not fs.rename(source, jvm.org.apache.hadoop.fs.Path(to)):
        raise UpgradeError(f"could not move {uri} aside to {to}")


def starting_offsets(marker: dict) -> str:
    """Spark's ``startingOffsets`` of an upgraded checkpoint's first batch."""
    return json.dumps({marker["topic"]: marker["end_offsets"]})

