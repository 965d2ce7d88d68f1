"""A window's revisions in the tables (adpipe.lakehouse.revisions, the
MERGE of adpipe.lakehouse.merge) and the raw records the DLQ lists
(adpipe.lakehouse.rows): small local frames with explicit UTC times, the
expected rows written out by hand."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from adpipe import schemas as S
from adpipe.lakehouse import merge
from adpipe.lakehouse import revisions as V
from adpipe.lakehouse import rows as R
from adpipe.lakehouse import tables as T
from pyspark.sql import DataFrame, SparkSession

HOUR = datetime(2026, 11, 22, 12, tzinfo=UTC)
LOADED = datetime(2026, 11, 22, 13, 10)
NAIVE_HOUR = datetime(2026, 11, 22, 12)


def agg(uuid_: str, ad: str, minute: int, impressions: int, revision: int | None, region: str = "r1",
        offset: int = 0, load_run: int | None = None) -> tuple:
    start = NAIVE_HOUR + timedelta(minutes=minute)
    return (uuid_, ad, start, start + timedelta(minutes=1), impressions, 0, NAIVE_HOUR, region, "agg", 0, offset,
            LOADED, load_run, revision)


def frame(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, T.AGGREGATES_SCHEMA)


def picked(df: DataFrame) -> list[tuple]:
    return sorted((r.region, r.ad_id, r.window_start.minute, r.record_uuid, r.revision) for r in df.collect())


def test_the_latest_of_each_window_is_its_highest_revision_whatever_the_order_read(spark: SparkSession) -> None:
    rows = [
        agg("a2", "ad-a", 1, 9, 2, offset=5), agg("a0", "ad-a", 1, 5, 0, offset=1),
        agg("a1", "ad-a", 1, 7, 1, offset=9),
        agg("b0", "ad-b", 1, 3, None),  # a row of a migration cut short: revision 0
        agg("c0", "ad-a", 1, 4, 0, region="r2"),  # another region's window of the same ad and minute
        # Two rows of one revision (a broken upstream): the lowest Kafka position, at every rerun.
        agg("d0-late", "ad-d", 2, 1, 0, offset=8), agg("d0", "ad-d", 2, 1, 0, offset=3),
    ]
    assert picked(V.latest_per_window(frame(spark, rows))) == [
        ("r1", "ad-a", 1, "a2", 2), ("r1", "ad-b", 1, "b0", None), ("r1", "ad-d", 2, "d0", 0),
        ("r2", "ad-a", 1, "c0", 0),
    ]
    # The gate's candidate keeps both rows of a revision held twice (the duplicate fails it).
    assert picked(V.at_highest_revision(frame(spark, rows))) == [
        ("r1", "ad-a", 1, "a2", 2), ("r1", "ad-b", 1, "b0", None), ("r1", "ad-d", 2, "d0", 0),
        ("r1", "ad-d", 2, "d0-late", 0), ("r2", "ad-a", 1, "c0", 0),
    ]


def test_only_a_higher_revision_than_the_published_one_changes_the_table(spark: SparkSession) -> None:
    published = frame(spark, [agg("a1", "ad-a", 1, 7, 1), agg("b0", "ad-b", 1, 3, None), agg("c0", "ad-c", 1, 2, 0)])
    latest = frame(spark, [
        agg("a0", "ad-a", 1, 5, 0),  # older than the published (a backfill read it again): nothing
        agg("b1", "ad-b", 1, 4, 1),  # newer than a null (0): replaces it
        agg("c0", "ad-c", 1, 2, 0),  # the same (a rerun): nothing
        agg("d0", "ad-d", 1, 1, 0),  # a window the table lacks: inserted
    ])
    assert picked(V.newer_than_published(latest, published)) == [("r1", "ad-b", 1, "b1", 1), ("r1", "ad-d", 1, "d0", 0)]


def test_the_latest_revision_wins_the_merge_and_a_rerun_writes_no_version(spark: SparkSession) -> None:
    from delta.tables import DeltaTable

    table = f"default.latest_{uuid.uuid4().hex[:8]}"
    DeltaTable.create(spark).tableName(table).addColumns(T.AGGREGATES_SCHEMA).partitionedBy("event_hour").execute()

    def write(rows: list[tuple], only_changes: bool = True) -> int:
        latest = V.latest_per_window(frame(spark, rows))  # one row per window, as the load gives it
        if only_changes:
            latest = V.newer_than_published(latest, spark.table(table))
        return merge.merge_latest_revisions(spark, table, latest, T.WINDOW_KEY, [HOUR])

    def version() -> int:
        return DeltaTable.forName(spark, table).history(1).first()["version"]

    assert write([agg("a0", "ad-a", 1, 5, 0), agg("b0", "ad-b", 1, 3, 0)]) == 2
    assert write([agg("a1", "ad-a", 1, 7, 1)]) == 1  # revision 1 replaces revision 0
    after_revision = version()
    # Revision 0 read again after 1 (a rerun, a backfill, a repair's reading), then both again: nothing.
    assert write([agg("a0", "ad-a", 1, 5, 0), agg("b0", "ad-b", 1, 3, 0)]) == 0
    assert write([agg("a0", "ad-a", 1, 5, 0), agg("a1", "ad-a", 1, 7, 1), agg("b0", "ad-b", 1, 3, 0)]) == 0
    assert version() == after_revision
    # The MERGE's own condition keeps the newer too, given the older: the same rows (in a version of its own).
    assert write([agg("a0", "ad-a", 1, 5, 0)], only_changes=False) == 0
    rows = sorted((r.ad_id, r.record_uuid, r.impressions, r.revision) for r in spark.table(table).collect())
    assert rows == [("ad-a", "a1", 7, 1), ("ad-b", "b0", 3, 0)]


def test_aggregate_rows_carry_the_revision_and_an_absent_one_is_0(spark: SparkSession) -> None:
    base = {"ad_id": "ad-1", "window_start": "2026-11-22T12:07:00Z", "window_end": "2026-11-22T12:08:00Z",
            "impressions": 4, "clicks": 1}
    records = [{**base, "record_uuid": "old"}, {**base, "record_uuid": "r2", "revision": 2, "impressions": 6}]
    kafka = spark.createDataFrame(
        [(None, json.dumps(r).encode(), "agg", 0, i, LOADED, 0, []) for i, r in enumerate(records)],
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
        "timestampType int, headers array<struct<key:string,value:binary>>",
    )
    got = R.aggregate_table_rows(kafka, "r1", HOUR, LOADED)
    assert sorted((r.record_uuid, r.impressions, r.revision) for r in got.collect()) == [("old", 4, 0), ("r2", 6, 2)]
    assert got.schema.fieldNames() == T.AGGREGATES_SCHEMA.fieldNames()


def _raw(event_id: str, minute: int, partition: int, offset: int, region: str = "r1") -> tuple:
    at = NAIVE_HOUR + timedelta(minutes=minute, seconds=5)
    return (event_id, "ad-1", None, "impression", at, NAIVE_HOUR, region, "raw", partition, offset, LOADED, None)


def test_a_raw_record_the_dlq_lists_is_no_raw_row(spark: SparkSession) -> None:
    """e1 was sent twice, two minutes apart, to two partitions: the stream
    read partition 3's copy first and counted it; the DLQ lists partition
    0's as conflicting_duplicate. The first-per-key dedupe alone would keep
    the lowest position, partition 0's: the DLQ decides instead. Another
    region's record at the same position is not the one listed."""
    raw = spark.createDataFrame(
        [_raw("e1", 10, 3, 7), _raw("e1", 12, 0, 2), _raw("e2", 11, 0, 2, region="r2"), _raw("e3", 5, 1, 1)],
        T.RAW_SCHEMA,
    )
    headers = [(S.HEADER_SOURCE, b"raw/0/2"), (S.HEADER_REASON, S.REASON_CONFLICTING_DUPLICATE.encode()),
               (S.HEADER_EVENT_ID, b"e1")]
    dlq = spark.createDataFrame(
        [(None, b"{}", "dlq", 0, 0, LOADED, 0, headers), (None, b"{", "dlq", 0, 1, LOADED, 0, [])],
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
        "timestampType int, headers array<struct<key:string,value:binary>>",
    )
    listed = R.dlq_sources(dlq, "r1")
    assert [(r.region, r.event_key) for r in listed.collect()] == [("r1", "raw/0/2")]
    kept = R.without_dlq_copies(raw, listed)
    assert kept.columns == raw.columns
    got = sorted((r.event_id, r.region, r.kafka_partition, r.event_time.minute) for r in kept.collect())
    assert got == [("e1", "r1", 3, 10), ("e2", "r2", 0, 11), ("e3", "r1", 1, 5)]
    first = R._first_per_key(kept, ["event_id"]).where("event_id = 'e1'").collect()
    assert [(r.kafka_partition, r.event_time.minute) for r in first] == [(3, 10)]
