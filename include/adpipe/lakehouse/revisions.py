"""The aggregates' revisions, pure: a window may be emitted more than once
(revisions 0, 1, ..., each with the window's full counts), and
``ads.ad_minute_aggregates`` keeps the highest revision loaded of each
(``region``, ``ad_id``, ``window_start``), while
``ads.ad_minute_aggregate_revisions`` keeps every one. DataFrame in,
DataFrame out: the MERGEs that write them are in
:mod:`adpipe.lakehouse.merge`."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from adpipe.lakehouse import tables as T


def revision_of(df: DataFrame | None = None) -> Column:
    """A row's revision: 0 where it is null (a row of a migration cut short)."""
    column = F.col("revision") if df is None else df["revision"]
    return F.coalesce(column, F.lit(0).cast("long"))


def latest_per_window(aggregates_df: DataFrame) -> DataFrame:
    """Aggregate rows (any revisions) -> one per window: its highest
    revision; of two rows of one revision (a broken upstream, which the gate
    fails), the lowest Kafka position, so that the choice is the same at
    every rerun. What a MERGE into the table takes as its source."""
    order = Window.partitionBy(*T.WINDOW_KEY).orderBy(
        revision_of().desc(), "kafka_topic", "kafka_partition", "kafka_offset", "record_uuid"
    )
    return aggregates_df.withColumn("__n", F.row_number().over(order)).where(F.col("__n") == 1).drop("__n")


def newer_than_published(latest_df: DataFrame, published_df: DataFrame) -> DataFrame:
    """Each window's latest row (``latest_per_window``) -> those that change
    the published table (``published_df``, its rows of the same hours): a
    window it lacks, or a revision above the one it holds. An older or the
    same revision read again (a rerun, a backfill, a repair's reading) is
    nothing."""
    held = published_df.select(*T.WINDOW_KEY, revision_of(published_df).alias("__published"))
    joined = latest_df.join(held, list(T.WINDOW_KEY), "left")
    return joined.where(F.col("__published").isNull() | (revision_of() > F.col("__published"))).select(
        *latest_df.columns
    )


def at_highest_revision(aggregates_df: DataFrame) -> DataFrame:
    """Aggregate rows (published and candidate) -> the rows at their
    window's highest revision, every one of them: two rows of one window and
    revision stay two (the gate fails the duplicate; ``latest_per_window``
    would hide it)."""
    top = Window.partitionBy(*T.WINDOW_KEY)
    return (
        aggregates_df.withColumn("__top", F.max(revision_of()).over(top))
        .where(revision_of() == F.col("__top"))
        .drop("__top")
    )
