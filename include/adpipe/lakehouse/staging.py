"""Union & Load's staging (:mod:`adpipe.lakehouse.load`, step 1): which of a
run's rows are new (neither published nor staged), writing them to the
staging twins, and the rows an all-in-one load keeps in memory instead for
the hours it publishes for the first time (:class:`KeptRows`)."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from adpipe.lakehouse import tables as T
from adpipe.lakehouse.ledger import _append_ledger
from adpipe.lakehouse.merge import merge_new_rows
from adpipe.lakehouse.ranges import hour_label, parse_hour
from adpipe.lakehouse.read import _hour_labels, _in_hours
from adpipe.spark import in_threads

log = logging.getLogger(__name__)

# Per table, the rows of a run not published nor staged yet (lazy), and the
# hours of the run's rows of that table (rows_not_loaded).
NewRows = dict[str, tuple[DataFrame, list[datetime]]]


def pending_hours(spark: SparkSession, run_id: int) -> list[str]:
    """The hours with rows staged by runs up to ``run_id``, in one Spark job."""
    staged = [spark.table(T.staged(t)).where(F.col("load_run") <= run_id).select("event_hour") for t in T.TABLES]
    return _hour_labels(functools.reduce(DataFrame.unionByName, staged))


def rows_not_loaded(spark: SparkSession, table: str, source: DataFrame) -> tuple[DataFrame, list[datetime]]:
    """The rows of ``source`` that are neither published nor staged yet (a
    lazy frame), and the hours of ``source``. An aggregate record is
    published once it is in the revisions table (ads.ad_minute_aggregates
    holds only each window's latest)."""
    # ``source`` is kept (table_rows) by its first job, the hours, for what follows.
    hours = [parse_hour(h) for h in _hour_labels(source)]
    _schema, keys = T.TABLES[table]
    rows = source
    for loaded in (T.loaded_in(table), T.staged(table)):
        rows = rows.join(spark.table(loaded).where(_in_hours(hours)).select(*keys), list(keys), "left_anti")
    return rows, hours


def stage_rows(spark: SparkSession, table: str, rows: DataFrame, hours: list[datetime], run_id: int) -> int:
    """``rows`` (new ones, of ``hours``) into the staging twin of ``table``; returns how many."""
    _schema, keys = T.TABLES[table]
    staged = merge_new_rows(spark, T.staged(table), rows, keys, hours)
    log.info("run %d: %s: %d rows staged", run_id, T.staged(table), staged)
    return staged


def stage_new(
    spark: SparkSession, new: NewRows, run_id: int, tables: set[str], where: Column | None = None
) -> dict[str, int]:
    """The new rows of ``tables`` (those in ``where``) into their staging
    twins; rows staged per table (0 for the others). The tables are
    independent (their own Delta logs): staged side by side, one table's
    planning and commits fill the cores while another's tasks wait."""
    staged = in_threads({
        table: functools.partial(stage_rows, spark, table, df if where is None else df.where(where), hours, run_id)
        for table, (df, hours) in new.items() if table in tables
    })
    return {table: staged.get(table, 0) for table in T.TABLES}


def hours_to_audit(
    pending: set[str], asked: list[datetime], horizon: datetime | None, held: dict[str, str]
) -> tuple[list[datetime], list[str]]:
    """The hours a run audits: those asked, and the ``pending`` ones closed
    before its read (at or before ``horizon``) that no failed gate holds;
    and the held ones, left waiting."""
    ready = {h for h in map(parse_hour, pending) if h not in asked and horizon is not None and h <= horizon}
    waiting = sorted(hour_label(h) for h in ready if hour_label(h) in held)
    return sorted({h for h in ready if hour_label(h) not in held} | set(asked)), waiting


def hour_counts(df: DataFrame) -> dict[str, int]:
    """Rows of ``df`` per hour label (``2026-11-22T12``), in one Spark job."""
    label = F.date_format("event_hour", "yyyy-MM-dd'T'HH").alias("h")
    return {r["h"]: int(r["count"]) for r in df.groupBy(label).count().collect()}


@dataclass(frozen=True)
class FirstHours:
    """The hours an all-in-one load publishes for the first time (their new
    rows kept, not staged), the new rows per table and hour label, and the
    hours the run audits with the held ones it leaves waiting."""

    hours: list[datetime]
    counts: dict[str, dict[str, int]]
    audited: list[datetime]
    waiting: list[str]

    def keep(self, spark: SparkSession, new: NewRows, run_id: int) -> tuple[dict[str, int], KeptRows]:
        """Stage the new rows of the other hours and keep those of these
        (:class:`KeptRows`); the rows per table, staged or kept."""
        labels = {hour_label(h) for h in self.hours}
        later = {table for table, by_hour in self.counts.items() if any(h not in labels for h in by_hour)}
        rows = stage_new(spark, new, run_id, later, ~_in_hours(self.hours))
        for table, by_hour in self.counts.items():
            rows[table] += sum(n for h, n in by_hour.items() if h in labels)
        return rows, KeptRows({table: df.where(_in_hours(self.hours)) for table, (df, _h) in new.items()}, {})


@dataclass
class KeptRows:
    """An all-in-one load's own new rows of the hours it publishes for the
    first time (``StagedRun.direct``), kept in memory instead of staged: the
    gate audits them with the hour's staged rows, and publishing writes them
    once, straight into the published tables (a failed gate stages them).
    The ledger's ``staged`` row, which advances the coverage past them, is
    written only once they are published or staged (:meth:`record`): a
    crash before it makes the next run read them again."""

    rows: dict[str, DataFrame]  # per table, lazy over table_rows' kept rows: not published nor staged
    ledger: dict  # the fields of the ``staged`` ledger row
    recorded: bool = False

    def of_hours(self, table: str, hours: list[datetime]) -> DataFrame:
        return self.rows[table].where(_in_hours(hours))

    def stage(self, spark: SparkSession, hours: list[datetime], run_id: int) -> None:
        """The rows of ``hours`` (a failed gate's) into staging, held there."""
        in_threads({table: functools.partial(stage_rows, spark, table, self.of_hours(table, hours), hours, run_id)
                    for table in T.TABLES})

    def record(self, spark: SparkSession) -> None:
        if not self.recorded:
            _append_ledger(spark, **self.ledger)
            self.recorded = True
