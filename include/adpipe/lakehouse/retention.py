"""Hours past the input's retention: reported, not failed.

Kafka deletes old records (its retention). An hour whose records it may no
longer hold in full (:func:`adpipe.lakehouse.ranges.retention_gaps`) cannot
be proven by the gate: its rows could lack what was deleted. Two cases:

- Something of the hour was loaded (published or staged rows, or rows a run
  read now), or Kafka still holds a valid raw event of it: the gate fails
  the hour (``kafka_retention``) and it is held, as any failed hour: what
  is there cannot be proven whole.
- Nothing of it was ever loaded and Kafka holds nothing of it: its records
  were deleted before any load read them (a deployment that starts its
  loads months back, an operator's backfill of old hours). Nobody can load
  it any more. The hour is *past retention*: not audited, not held, no
  failure; one WARNING line names the topics and partitions and what Kafka
  keeps of them, and the ledger records a ``past_retention`` step.

:func:`past_retention` decides (pure); :func:`hour_loaded` is the tables'
side of it."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from adpipe.lakehouse import tables as T
from adpipe.lakehouse.ranges import hour_label, iso_ms

# How many partitions a report line names (the others are counted).
NAMED_PARTITIONS = 12


@dataclass(frozen=True)
class PastRetention:
    """An hour past the input's retention of which nothing was loaded, and
    the gaps that make it so (:func:`~adpipe.lakehouse.ranges.retention_gaps`:
    region, topic, partition, the first offset Kafka keeps and its record's
    timestamp)."""

    hour: datetime
    gaps: tuple[dict, ...]

    @property
    def label(self) -> str:
        return hour_label(self.hour)

    def describe(self) -> str:
        """The one line that reports the hour."""
        return (
            f"hour {self.label} is past Kafka's retention: nothing of it was ever loaded and Kafka no longer holds "
            f"its records; reported as past_retention, not checked, not held. Kafka keeps "
            f"{describe_gaps(self.gaps)}"
        )


def describe_gaps(gaps: tuple[dict, ...] | list[dict]) -> str:
    """``region/topic[partition] from offset N (first record written T)``, for
    the first NAMED_PARTITIONS gaps, then how many more."""
    named = [
        f"{g['region']}/{g['topic']}[{g['partition']}] from offset {g['first_offset']} "
        f"({'empty' if g.get('first_timestamp_ms') is None else 'written ' + iso_ms(g['first_timestamp_ms'])})"
        for g in gaps[:NAMED_PARTITIONS]
    ]
    more = f" and {len(gaps) - NAMED_PARTITIONS} partitions more" if len(gaps) > NAMED_PARTITIONS else ""
    return ", ".join(named) + more


def past_retention(
    hour: datetime, gaps: tuple[dict, ...] | list[dict], loaded: bool, regions_with_input: tuple[str, ...] | list[str]
) -> PastRetention | None:
    """The hour is past retention when Kafka may no longer hold all of it
    (``gaps``), nothing of it was loaded (``loaded``: published or staged
    rows, rows read by this run) and Kafka holds no valid raw event of it
    (``regions_with_input`` empty); else None: the gate decides, and a gap
    fails it."""
    if not gaps or loaded or regions_with_input:
        return None
    return PastRetention(hour, tuple(gaps))


def hour_loaded(spark: SparkSession, hour: datetime, unstaged: dict[str, DataFrame] | None = None) -> bool:
    """Whether any row of ``hour`` is in a published table or its staging
    twin (whichever run wrote it, a repair's too), or in ``unstaged`` (a
    run's own rows it keeps in memory). One Spark job, partitions pruned by
    ``event_hour``."""
    in_hour = F.col("event_hour") == F.lit(hour)
    names = [*T.PUBLISHED, *(T.staged(t) for t in T.TABLES)]
    frames = [spark.table(name).where(in_hour).select(F.lit(1).alias("n")).limit(1) for name in names]
    frames += [df.where(in_hour).select(F.lit(1).alias("n")).limit(1) for df in (unstaged or {}).values()]
    return not functools.reduce(DataFrame.unionByName, frames).isEmpty()
