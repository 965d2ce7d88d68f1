"""Writing rows into a Delta table, once: insert-if-absent MERGEs by the
table's keys, retried on Delta's write conflicts (two loads of overlapping
hours), with the hours written named in the condition so that concurrent
MERGEs of other hours do not conflict."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from adpipe.lakehouse.errors import LoadError

log = logging.getLogger(__name__)


MERGE_ATTEMPTS = 8


# Delta's conflicts of optimistic concurrency: the class's name (delta-spark's
# Python class and io.delta.exceptions' Java class share it; the Python
# classes are siblings, none a subclass of DeltaConcurrentModificationException,
# so each is matched) and Delta's error class, what a Spark Connect client
# sees (None: the base class has none of its own).
_CONFLICTS = (
    ("DeltaConcurrentModificationException", None),
    ("ConcurrentWriteException", "DELTA_CONCURRENT_WRITE"),
    ("MetadataChangedException", "DELTA_METADATA_CHANGED"),
    ("ProtocolChangedException", "DELTA_PROTOCOL_CHANGED"),
    ("ConcurrentAppendException", "DELTA_CONCURRENT_APPEND"),
    ("ConcurrentDeleteReadException", "DELTA_CONCURRENT_DELETE_READ"),
    ("ConcurrentDeleteDeleteException", "DELTA_CONCURRENT_DELETE_DELETE"),
    ("ConcurrentTransactionException", "DELTA_CONCURRENT_TRANSACTION"),
)
_ERROR_CLASSES = tuple(error_class for _, error_class in _CONFLICTS if error_class)


def is_write_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is one of Delta's concurrent-write conflicts (to retry)."""
    return conflict_name(exc) is not None


def conflict_name(exc: BaseException) -> str | None:
    """The Delta conflict ``exc`` is (its class, Java class or error class),
    or None when it is none. A MERGE run as SQL fails with py4j's or Spark
    Connect's exception, not delta-spark's Python class: the conflict is
    then told by its Java class or error class in the message."""
    import delta.exceptions

    if isinstance(exc, tuple(getattr(delta.exceptions, name) for name, _ in _CONFLICTS)):
        return type(exc).__name__
    error_class = (getattr(exc, "getCondition", lambda: None)() or "").split(".")[0]
    if error_class in _ERROR_CLASSES:
        return error_class
    text = str(exc)
    for name, _ in _CONFLICTS:
        java = f"io.delta.exceptions.{name}"
        if f"{java}:" in text or f"{java} " in text:
            return name
    return next((name for name in _ERROR_CLASSES if f"[{name}]" in text or f"[{name}." in text), None)


def _hours_condition(column: str, hours: list[datetime]) -> str:
    literals = ", ".join(f"TIMESTAMP'{h.astimezone(UTC):%Y-%m-%d %H:%M:%S}'" for h in sorted(set(hours)))
    return f"{column} IN ({literals})"


def merge_new_rows(
    spark: SparkSession,
    table: str,
    source: DataFrame,
    keys: tuple[str, ...],
    hours: datetime | list[datetime],
    before_merge: Callable[[], None] | None = None,
) -> int:
    """Insert the rows of ``source`` whose key is not in the table's
    partitions of ``hours`` yet (insert-if-absent); a rerun finds nothing
    new and writes no table version at all. Columns the table has and the
    source lacks (one an operator added) are left null.

    Concurrent writers conflict in Delta's optimistic concurrency (any class
    of :func:`is_write_conflict`); the loser retries with backoff and
    jitter, and then finds the winner's rows present. ``before_merge`` runs
    before each MERGE (the tests hold two loads at a barrier there). Returns
    the number of rows inserted."""

    metrics = _merge(spark, table, source, keys, hours, insert_absent(source.columns), before_merge)
    return int(metrics["num_inserted_rows"]) if metrics is not None else 0


def merge_latest_revisions(
    spark: SparkSession, table: str, source: DataFrame, keys: tuple[str, ...], hours: datetime | list[datetime]
) -> int:
    """Each window of ``source`` (one row per ``keys``: the latest revision
    read, adpipe.lakehouse.revisions.latest_per_window) into the table: a
    window it lacks is inserted, and its row replaced only by a higher
    revision (a null one counts as 0). An older or the same revision read
    again (a rerun, a backfill, a repair's reading) never overwrites the
    newer. Give it the windows that change the table only
    (adpipe.lakehouse.revisions.newer_than_published): a MERGE with a
    matched clause rewrites every file it matches, whether the clause's
    condition holds or not, so a rerun would write a table version of the
    same rows. Conflicts are retried as by :func:`merge_new_rows`. Returns
    the rows inserted or replaced."""
    newer = "coalesce(s.revision, 0) > coalesce(t.revision, 0)"
    update = ", ".join(f"t.{_quoted(c)} = s.{_quoted(c)}" for c in source.columns)
    latest_wins = f"WHEN MATCHED AND {newer} THEN UPDATE SET {update} {insert_absent(source.columns)}"
    metrics = _merge(spark, table, source, keys, hours, latest_wins)
    if metrics is None:
        return 0
    return int(metrics["num_inserted_rows"]) + int(metrics["num_updated_rows"])


def _quoted(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def insert_absent(columns: list[str]) -> str:
    names = ", ".join(_quoted(c) for c in columns)
    values = ", ".join(f"s.{_quoted(c)}" for c in columns)
    return f"WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({values})"  # noqa: S608 - our column names, quoted


def merge_sql(table: str, condition: str, clauses: str) -> str:
    """The MERGE statement of :func:`_merge`: its source is the query's
    ``source`` DataFrame argument (SQL, not delta-spark's ``DeltaTable``:
    a Spark Connect session runs it as a local one does)."""
    return f"MERGE INTO {table} t USING {{source}} s ON {condition} {clauses}"


def delete_rows(spark: SparkSession, table: str, condition: str) -> None:
    """Delete the rows of ``table`` that ``condition`` (SQL) names."""
    spark.sql(f"DELETE FROM {table} WHERE {condition}")  # noqa: S608 - our table names and conditions


def _merge(
    spark: SparkSession,
    table: str,
    source: DataFrame,
    keys: tuple[str, ...],
    hours: datetime | list[datetime],
    clauses: str,
    before_merge: Callable[[], None] | None = None,
) -> Any:
    """A MERGE of ``source`` into ``table`` on ``keys`` within ``hours``
    (``clauses``: its WHEN clauses, SQL), retried on Delta's write
    conflicts; its metrics row, or None when there are no hours."""
    hours = [hours] if isinstance(hours, datetime) else list(hours)
    if not hours:
        return None
    # The partition list limits the MERGE's read (and so its conflicts) to these hours.
    in_hours = _hours_condition("t.event_hour", hours)
    condition = " AND ".join([f"t.{k} <=> s.{k}" for k in keys] + [in_hours])
    for attempt in range(1, MERGE_ATTEMPTS + 1):
        try:
            # No emptiness check first: it cost a second plan and run of the
            # source. A MERGE that writes nothing commits nothing (Delta
            # skips an empty commit: spark.databricks.delta.skipRecordingEmptyCommits,
            # set in adpipe.spark).
            if before_merge is not None:
                before_merge()
            # The MERGE's own metrics row: the table's latest history entry
            # may already be another load's commit.
            return spark.sql(merge_sql(table, condition, clauses), source=source).first()
        except Exception as exc:
            if not is_write_conflict(exc):
                raise
            if attempt == MERGE_ATTEMPTS:
                raise LoadError(f"{table}: still conflicting after {attempt} attempts: {exc}") from exc
            pause = min(30.0, 0.5 * 2**attempt) * (0.5 + random.random())  # noqa: S311 - jitter
            log.warning(
                "%s: concurrent write conflict (%s); retry %d in %.1fs",
                table,
                conflict_name(exc),
                attempt,
                pause,
            )
            time.sleep(pause)
    raise AssertionError("unreachable")
