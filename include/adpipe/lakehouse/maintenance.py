"""Daily maintenance of the ``ads`` Delta tables: ``OPTIMIZE``, then
``VACUUM ... RETAIN n HOURS`` (``adpipe maintain``, the
``ad_table_maintenance`` DAG).

Why: every hourly load MERGEs a few small files into each hour's partition
(and a rerun, a backfill or a late correction adds more), so reads slow down
as files pile up; OPTIMIZE bin-packs each partition's small files into few
large ones. The files it replaces stay on disk, still referenced by the older
table versions, until VACUUM deletes them once no version of the last
n = ``ADPIPE_VACUUM_RETENTION_H`` hours needs them (168 at least: Delta's
default, and its retention check stays on), so time travel, a reader and a
load that began before an OPTIMIZE never lose a file.

Per table, in order:

1. The table is looked up in the metastore; one that does not exist yet is
   skipped with a log line.
2. Its ``delta.deletedFileRetentionDuration`` is made ``interval <n> hours``
   (one metadata commit, ``SET TBLPROPERTIES``, only when it differs). This
   is the retention VACUUM applies: Delta 4 ignores a ``RETAIN`` other than
   0 hours (``spark.databricks.delta.vacuum.retentionWindowIgnore.enabled``,
   on by default; it logs a warning saying so), so the clause alone would
   leave the table at Delta's default whatever n says.
3. ``OPTIMIZE <table>``: one Delta commit (operation ``OPTIMIZE``, none when
   there is nothing to compact) that removes small files and adds their
   compacted copies with ``dataChange=false``: the same rows before and after,
   and a stream reading the table sees no new data. Its metrics row gives
   the files added and removed.
4. ``VACUUM <table> RETAIN <n> HOURS``: deletes the files in the table's
   folder that no version of the last n hours references (files removed
   longer ago than that, and files no commit ever added, older than that).
   Delta records it as two commits, ``VACUUM START`` and ``VACUUM END`` (the
   number of files deleted is read from the latter; that logging is on by
   default on ``file:``, ``hdfs:`` and the cloud stores, otherwise the number
   is not reported). Its file listing runs one task per core: with Spark's
   default of 10,000 (``parallelPartitionDiscovery.parallelism``) a VACUUM
   of an empty table took 46 s on 2 cores, with 2 tasks 1.8 s.

If the process dies: during or after step 2, the property is set or not,
and a rerun sets it; during step 3, nothing is committed and the files it
wrote are unreferenced, for a later VACUUM to delete once older than the
retention; between steps 3 and 4, the table is compacted and the old files
wait for the next run's VACUUM; during step 4, only unreferenced files were
being deleted, so no data is lost and the next run deletes the rest. Every
step is safe to rerun: a compacted table has nothing more to OPTIMIZE, and
VACUUM deletes only what is still there.

A concurrent load MERGE can conflict with OPTIMIZE (or with the property's
commit) in Delta's optimistic concurrency: the loser's commit fails, nothing
half-written; the load retries its own conflicts, and the DAG's task retry
reruns the maintenance."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from adpipe.lakehouse import tables as T
from adpipe.settings import Settings
from adpipe.spark import default_parallelism

log = logging.getLogger(__name__)

# What maintenance runs on when not told: the published tables (the
# aggregates' revisions among them), their staging twins and the loads'
# ledger: every Delta table a load writes.
DEFAULT_TABLES: tuple[str, ...] = (*T.PUBLISHED, *(T.staged(t) for t in T.TABLES), T.LOAD_RUNS)

# A table name goes into SQL text: [database.]table, plain identifiers only.
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")

RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
_LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


@dataclass(frozen=True)
class TableMaintenance:
    """What maintenance did to one table."""

    table: str
    # True when the table did not exist (nothing was run on it).
    skipped: bool = False
    # OPTIMIZE: compacted files written, small files replaced.
    files_added: int = 0
    files_removed: int = 0
    # VACUUM: files deleted from storage (None: Delta did not log the VACUUM).
    files_deleted: int | None = None
    seconds: float = 0.0

    def describe(self) -> str:
        if self.skipped:
            return f"{self.table}: skipped, no such table yet"
        deleted = "not reported" if self.files_deleted is None else str(self.files_deleted)
        return (
            f"{self.table}: OPTIMIZE removed {self.files_removed} files and added {self.files_added}; "
            f"VACUUM deleted {deleted} files; {self.seconds:.1f} s"
        )


def check_table_name(name: str) -> str:
    """``name`` when it is a plain ``[database.]table`` identifier, else ValueError."""
    if not _TABLE_NAME.match(name):
        raise ValueError(f"{name!r} is not a table name of the form [database.]table")
    return name


def optimize_counts(rows: Iterable[Any]) -> tuple[int, int]:
    """(files added, files removed) from the rows ``OPTIMIZE`` returns: one
    per table, ``metrics`` a struct with ``numFilesAdded`` and ``numFilesRemoved``."""
    added = removed = 0
    for row in rows:
        metrics = row["metrics"]
        added += int(metrics["numFilesAdded"] or 0)
        removed += int(metrics["numFilesRemoved"] or 0)
    return added, removed


def vacuum_deleted_files(history: Iterable[Any], after_version: int) -> int | None:
    """The files deleted by the newest ``VACUUM END`` committed after
    ``after_version``, from ``DESCRIBE HISTORY`` rows (``version``,
    ``operation``, ``operationMetrics``); None when there is none (VACUUM
    logging off on this storage)."""
    ends = [r for r in history if r["operation"] == "VACUUM END" and r["version"] > after_version]
    if not ends:
        return None
    newest = max(ends, key=lambda r: r["version"])
    metrics = newest["operationMetrics"] or {}
    return int(metrics.get("numDeletedFiles", 0))


def _latest_version(spark: SparkSession, table: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY {table} LIMIT 1").first()["version"])


def retention_interval(hours: int) -> str:
    """``delta.deletedFileRetentionDuration`` for ``hours``."""
    return f"interval {hours} hours"


def _set_retention(spark: SparkSession, table: str, hours: int) -> None:
    wanted = retention_interval(hours)
    properties = spark.sql(f"DESCRIBE DETAIL {table}").first()["properties"] or {}
    if properties.get(RETENTION_PROPERTY) != wanted:
        log.info("%s: %s %s -> %s", table, RETENTION_PROPERTY, properties.get(RETENTION_PROPERTY), wanted)
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('{RETENTION_PROPERTY}' = '{wanted}')")


@contextmanager
def _listing_parallelism(spark: SparkSession) -> Iterator[None]:
    """VACUUM lists the table's folder with one task per core, not Spark's
    default 10,000 (see the module docstring); the session's value is
    restored afterwards."""
    saved = spark.conf.get(_LISTING_PARALLELISM, None)
    spark.conf.set(_LISTING_PARALLELISM, str(max(1, default_parallelism(spark))))
    try:
        yield
    finally:
        if saved is None:
            spark.conf.unset(_LISTING_PARALLELISM)
        else:
            spark.conf.set(_LISTING_PARALLELISM, saved)


def maintain_table(settings: Settings, spark: SparkSession, table: str) -> TableMaintenance:
    """OPTIMIZE then VACUUM one table (the steps of the module docstring)."""
    check_table_name(table)
    started = time.monotonic()
    hours = settings.vacuum_retention_h
    # Step 1: a table that is not there yet is skipped.
    if not spark.catalog.tableExists(table):
        log.info("%s does not exist yet: skipped", table)
        return TableMaintenance(table, skipped=True)
    # Step 2: the retention VACUUM applies is the table's own property.
    _set_retention(spark, table, hours)
    # Step 3: compact the small files (one commit, or none).
    added, removed = optimize_counts(spark.sql(f"OPTIMIZE {table}").collect())
    log.info("%s: OPTIMIZE removed %d files, added %d", table, removed, added)
    # Step 4: delete the files no version of the retention window needs.
    before = _latest_version(spark, table)
    with _listing_parallelism(spark):
        spark.sql(f"VACUUM {table} RETAIN {hours} HOURS").collect()
    history = spark.sql(f"DESCRIBE HISTORY {table} LIMIT 10").collect()
    deleted = vacuum_deleted_files(history, before)
    result = TableMaintenance(table, False, added, removed, deleted, round(time.monotonic() - started, 3))
    log.info("%s", result.describe())
    return result


def optimize_and_vacuum(
    settings: Settings, spark: SparkSession, tables: Sequence[str] = DEFAULT_TABLES
) -> list[TableMaintenance]:
    """Run ``OPTIMIZE`` then ``VACUUM <table> RETAIN <n> HOURS`` (n =
    ``settings.vacuum_retention_h``, also set as the table's
    ``delta.deletedFileRetentionDuration``) on each of ``tables`` (default:
    the three ``ads`` tables), one table after the other; a table that does
    not exist is skipped. Returns one summary per table, in the given order.
    Raises on the first failure (names are checked before anything runs)."""
    for table in tables:
        check_table_name(table)
    return [maintain_table(settings, spark, table) for table in tables]
