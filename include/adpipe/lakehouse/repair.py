"""An operator's actions on one hour, after a failed gate held it
(``adpipe.lakehouse.load``: its staged rows wait, later loads leave it):

* :func:`repair_hour` (``adpipe load --hour H --repair``) — the hour rebuilt
  from Kafka, read from its start whatever was loaded, audited by the same
  gate, and written over its published partitions in one Delta commit per
  table; also for an hour published wrongly before the gate existed.
* :func:`discard_staged` (``--discard-staged``) — the hour's staged rows
  deleted, once judged unpublishable (a duplicate a broken upstream wrote to
  Kafka, which a repair would read again); its published rows stand.

:func:`hour_action` runs either, for the command line and for the Airflow
form ``ad_hour_repair`` alike; ``held_only`` (``--held-only``, what the form
runs) first checks, under the load lock, that a failed gate holds the hour
(:func:`require_held`), and changes nothing otherwise."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from adpipe.lakehouse import quality
from adpipe.lakehouse import tables as T
from adpipe.lakehouse.errors import HourNotHeld
from adpipe.lakehouse.ledger import _append_ledger, last_steps, ledger_state, load_lock
from adpipe.lakehouse.load import LoadResult, _clear_staged, _gate_failure, _write_manifest
from adpipe.lakehouse.merge import _hours_condition
from adpipe.lakehouse.metastore import metastore_session
from adpipe.lakehouse.ranges import hour_label, region_ranges
from adpipe.lakehouse.read import _in_hours, kafka_facts, table_rows
from adpipe.settings import Settings

__all__ = ["HOUR_ACTIONS", "HourNotHeld", "discard_staged", "hour_action", "published_rows", "repair_hour",
           "require_held"]

log = logging.getLogger(__name__)


def require_held(spark: SparkSession, hour: datetime, action: str) -> None:
    """Raise :class:`HourNotHeld` unless a failed gate holds ``hour`` (its
    last ledger step is ``failed``), saying what its last step was."""
    label = hour_label(hour)
    steps = last_steps(spark)
    last = steps.get(label)
    if last is not None and last.step == "failed":
        return
    held = sorted(h for h, s in steps.items() if s.step == "failed")
    was = f"its last step: {last.describe()}" if last is not None else "no load has audited it"
    raise HourNotHeld(
        f"hour {label} is not held by a failed gate ({was}): nothing to {action.replace('_', ' ')}. "
        f"Hours held now: {', '.join(held) or 'none'}"
    )


def repair_hour(
    settings: Settings, hour: datetime, spark: SparkSession | None = None, held_only: bool = False
) -> LoadResult:
    """Rebuild the published partitions of ``hour`` from Kafka: every record
    from the hour's start (less the slack) to the ends a load reads, the rows
    of that hour only, audited like a load, then written over the hour's
    partitions in one Delta commit per table (``replaceWhere``). Idempotent:
    the same records give the same rows. ``held_only``: raise
    :class:`HourNotHeld`, having read nothing from Kafka, unless a failed
    gate holds the hour."""
    started = time.monotonic()
    spark = spark or metastore_session(settings, f"adpipe-repair-{hour_label(hour)}")
    with load_lock(settings):
        if held_only:
            require_held(spark, hour, "repair")
        run_id = ledger_state(spark).next_run
        loaded_at = datetime.now(UTC).replace(microsecond=0)
        ranges = [region_ranges(settings, r, hour, None) for r in settings.regions]
        # Kept (table_rows' local checkpoints), lineage cut: the checks and
        # the write below read shallow plans instead of re-planning four Kafka
        # reads, joins and a window for every expectation.
        rows = table_rows(spark, settings, ranges, loaded_at, run_id, hour)
        frames = quality.HourFrames(raw_df=rows[T.RAW], quarantine_df=rows[T.QUARANTINE],
                                    aggregates_df=rows[T.AGGREGATES])
        result = quality.validate_frames(settings, hour, frames, kafka_facts(settings, spark, hour))
        if not result.success:
            _append_ledger(spark, run_id, "failed", "repair", hour, hours=[hour_label(hour)],
                           message="\n".join(result.failed))
            raise _gate_failure([result])
        written: dict[str, int] = {}
        for table, df in rows.items():
            target = spark.table(table)
            columns = [F.col(c) if c in df.columns else F.lit(None).cast(target.schema[c].dataType).alias(c)
                       for c in target.columns]
            written[table] = df.count()
            df.select(*columns).write.format("delta").mode("overwrite").option(
                "replaceWhere", _hours_condition("event_hour", [hour])
            ).saveAsTable(table)
        _clear_staged(spark, [hour], run_id)
        _append_ledger(spark, run_id, "repaired", "repair", hour, read=[asdict(r) for r in ranges], rows=written,
                       hours=[hour_label(hour)])
    _write_manifest(settings, run_id, "repaired", {"hour": hour_label(hour), "rows": written})
    return LoadResult(hour=hour_label(hour), run_id=run_id, hours=[hour_label(hour)], staged=written,
                      inserted=written, gate=[result.describe().splitlines()[0]],
                      seconds=time.monotonic() - started)


def discard_staged(
    settings: Settings, hour: datetime, spark: SparkSession | None = None, held_only: bool = False
) -> dict[str, int]:
    """Delete the staged rows of ``hour`` (after a failed gate, once an
    operator has inspected them and decided they must not be published); a
    ``discarded`` ledger row records how many per table. The Kafka records
    stay loaded (the coverage does not go back): ``--repair`` rebuilds the
    hour from Kafka if it should be published after all. ``held_only``:
    raise :class:`HourNotHeld`, deleting nothing, unless a failed gate holds
    the hour."""
    from delta.tables import DeltaTable

    spark = spark or metastore_session(settings, f"adpipe-discard-{hour_label(hour)}")
    with load_lock(settings):
        if held_only:
            require_held(spark, hour, "discard_staged")
        run_id = ledger_state(spark).next_run
        counts = {}
        for table in T.TABLES:
            staged = spark.table(T.staged(table)).where(_in_hours([hour]))
            counts[table] = staged.count()
            if counts[table]:
                DeltaTable.forName(spark, T.staged(table)).delete(_in_hours([hour]))
        _append_ledger(spark, run_id, "discarded", "discard", hour, rows=counts, hours=[hour_label(hour)])
    log.warning("run %d: discarded the staged rows of %s: %s", run_id, hour_label(hour), counts)
    return counts


def published_rows(spark: SparkSession, hour: datetime) -> dict[str, int]:
    """How many rows of ``hour`` each published table holds."""
    return {table: spark.table(table).where(_in_hours([hour])).count() for table in T.TABLES}


# What an operator does to one hour a failed gate holds: ``adpipe load
# --repair`` / ``--discard-staged``, and the Airflow form ``ad_hour_repair``.
HOUR_ACTIONS = ("repair", "discard_staged")


def hour_action(
    settings: Settings, hour: datetime, action: str, spark: SparkSession | None = None, held_only: bool = False
) -> str:
    """Run ``action`` (:data:`HOUR_ACTIONS`) on ``hour``: :func:`repair_hour`
    or :func:`discard_staged`. Returns what it did in one line, ending with
    the rows of the hour published now. Raises what they raise:
    :class:`GateFailed` (a repair's audit failed: nothing written, the hour
    stays held), :class:`HourNotHeld` (``held_only``)."""
    spark = spark or metastore_session(settings, f"adpipe-{action}-{hour_label(hour)}")
    if action == "repair":
        said = repair_hour(settings, hour, spark, held_only=held_only).describe()
    elif action == "discard_staged":
        counts = discard_staged(settings, hour, spark, held_only=held_only)
        said = f"discarded the staged rows of {hour_label(hour)}: {counts}"
    else:
        raise ValueError(f"action {action!r}: expected one of {', '.join(HOUR_ACTIONS)}")
    published = ", ".join(f"{table} {rows}" for table, rows in published_rows(spark, hour).items())
    return f"{said}; hour {hour_label(hour)} published: {published}"
