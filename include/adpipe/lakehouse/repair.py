"""Repairing an hour (``adpipe load --hour H --repair``) and discarding a
held hour's staged rows (``--discard-staged``).

A repair rebuilds the hour from Kafka and makes the rebuilt hour visible
in one step: a reader of the whole-hour views (``ads.*_whole``) sees the
hour as it was, or as rebuilt, never a mix of the two nor nothing.

One repair (run R, under the load lock)
---------------------------------------
1. Read every record from the hour's start (less the slack) to the ends a
   load reads, shape the hour's rows (those of the hour only), and audit
   them with the gate; a failed gate writes a ``failed`` ledger row and
   nothing else.
2. Append a ``repairing`` ledger row (run R, the hour).
3. Append the rebuilt rows to each published table, ``load_run`` = R,
   beside the old ones: the views do not show them (no ledger row says R
   completed).
4. Append the ``repaired`` ledger row: the switch. From this commit on the
   views show the hour's rows of R and later runs only.
5. Delete the hour's older rows from the tables and its staged rows, then
   append a ``cleared`` ledger row.

A death between two steps: before 4, the views show the hour as it was
(R's rows are hidden), and the next load or repair deletes R's rows
(:func:`finish_repairs`: a ``repairing`` row with neither ``repaired`` nor
``cleared``); after 4, the views show the rebuilt hour, and the next load
or repair does step 5 (a ``repaired`` row without ``cleared``). Every load
step that publishes runs :func:`finish_repairs` first, so a run that
completes after a dead repair never makes that repair's rows visible.

Idempotent: the same records give the same rows; a second repair replaces
the first's (``load_run`` one higher).

Discarding a held hour's staged rows (:func:`discard_staged`) is for a
duplicate a broken upstream wrote to Kafka, which a repair would read
again; the hour's published rows stand. :func:`hour_action` runs either,
for the command line and for the Airflow form ``ad_hour_repair`` alike;
``held_only`` (``--held-only``, what the form runs) first checks, under the
load lock, that a failed gate holds the hour (:func:`require_held`), and
changes nothing otherwise."""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import asdict
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from adpipe import faults
from adpipe.lakehouse import quality
from adpipe.lakehouse import tables as T
from adpipe.lakehouse.errors import HourNotHeld
from adpipe.lakehouse.ledger import _append_ledger, last_steps, ledger_state, load_lock
from adpipe.lakehouse.merge import _hours_condition, delete_rows
from adpipe.lakehouse.metastore import metastore_session
from adpipe.lakehouse.outcome import LoadResult, gate_failure, write_manifest
from adpipe.lakehouse.ranges import hour_label, parse_hour, region_ranges
from adpipe.lakehouse.read import _in_hours, kafka_facts, table_rows
from adpipe.lakehouse.revisions import at_highest_revision, latest_per_window
from adpipe.settings import Settings
from adpipe.spark import in_threads

__all__ = ["HOUR_ACTIONS", "HourNotHeld", "discard_staged", "finish_repairs", "hour_action", "published_rows",
           "repair_hour", "require_held"]

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


def clear_staged(spark: SparkSession, hours: list[datetime], through_run: int) -> None:
    """Delete the staged rows of ``hours`` staged by runs up to ``through_run``."""
    condition = f"{_hours_condition('event_hour', hours) if hours else 'false'} AND load_run <= {int(through_run)}"

    def clear(table: str) -> None:
        delete_rows(spark, T.staged(table), condition)

    in_threads({table: functools.partial(clear, table) for table in T.TABLES})


def _delete(spark: SparkSession, hour: datetime, rows: str) -> None:
    """Delete the rows of ``hour`` that ``rows`` (SQL) names from every published table."""
    condition = f"{_hours_condition('event_hour', [hour])} AND ({rows})"

    def delete(table: str) -> None:
        delete_rows(spark, table, condition)

    in_threads({table: functools.partial(delete, table) for table in T.PUBLISHED})


def finish_repairs(spark: SparkSession) -> list[int]:
    """Finish what a repair that died left (module doc): the rows of one
    that died before its switch deleted, the older rows of one that died
    after it deleted; each then gets its ``cleared`` ledger row. Returns the
    repairs finished. Callers hold the load lock."""
    steps: dict[int, dict[str, list[str]]] = {}
    for row in spark.table(T.LOAD_RUNS).where(F.col("step").isin("repairing", "repaired", "cleared")).collect():
        steps.setdefault(row["run_id"], {})[row["step"]] = json.loads(row["hours"] or "[]")
    finished = []
    for run_id, done in sorted(steps.items()):
        if "cleared" in done or "repairing" not in done:
            continue
        hour = parse_hour(done["repairing"][0])
        if "repaired" in done:
            log.warning("repair run %d of %s completed but did not delete the hour's older rows: deleting them",
                        run_id, hour_label(hour))
            _clear_older(spark, hour, run_id)
            message = "older rows deleted after the switch"
        else:
            log.warning("repair run %d of %s died before its switch: deleting its rows (the hour stays as it was)",
                        run_id, hour_label(hour))
            _delete(spark, hour, f"load_run = {int(run_id)}")
            message = "rolled back: died before its switch"
        _append_ledger(spark, run_id, "cleared", "repair", hour, hours=[hour_label(hour)], message=message)
        finished.append(run_id)
    return finished


def _clear_older(spark: SparkSession, hour: datetime, run_id: int) -> None:
    """Step 5's deletes: the hour's rows older than repair ``run_id``, and its staged rows."""
    _delete(spark, hour, f"load_run IS NULL OR load_run < {int(run_id)}")
    clear_staged(spark, [hour], run_id)


def _append(spark: SparkSession, table: str, df: DataFrame) -> int:
    """``df`` appended to ``table`` (a column the table has and ``df`` lacks left null); its rows."""
    target = spark.table(table)
    columns = [F.col(c) if c in df.columns else F.lit(None).cast(target.schema[c].dataType).alias(c)
               for c in target.columns]
    df.select(*columns).write.format("delta").mode("append").saveAsTable(table)
    return df.count()


def repair_hour(
    settings: Settings, hour: datetime, spark: SparkSession | None = None, held_only: bool = False
) -> LoadResult:
    """Rebuild the published rows of ``hour`` from Kafka and switch the
    views to them in one ledger commit (module doc). Raises
    :class:`~adpipe.lakehouse.outcome.GateFailed` (nothing changed) when the
    rebuilt hour fails its gate. ``held_only``: raise :class:`HourNotHeld`,
    having read nothing from Kafka, unless a failed gate holds the hour."""
    started = time.monotonic()
    spark = spark or metastore_session(settings, f"adpipe-repair-{hour_label(hour)}")
    label = hour_label(hour)
    with load_lock(settings):
        if held_only:
            require_held(spark, hour, "repair")
        finish_repairs(spark)
        run_id = ledger_state(spark).next_run
        loaded_at = datetime.now(UTC).replace(microsecond=0)
        # Step 1: the hour rebuilt and audited. Kept (table_rows' local
        # checkpoints), lineage cut: the checks and the writes below read
        # shallow plans instead of re-planning four Kafka reads.
        ranges = [region_ranges(settings, r, hour, None) for r in settings.regions]
        rows = table_rows(spark, settings, ranges, loaded_at, run_id, hour)
        revisions = rows[T.AGGREGATES]
        frames = quality.HourFrames(raw_df=rows[T.RAW], quarantine_df=rows[T.QUARANTINE],
                                    aggregates_df=at_highest_revision(revisions), revisions_df=revisions)
        result = quality.validate_frames(settings, hour, frames, kafka_facts(settings, spark, hour))
        if not result.success:
            _append_ledger(spark, run_id, "failed", "repair", hour, hours=[label], message="\n".join(result.failed))
            raise gate_failure([result])
        # Step 2.
        _append_ledger(spark, run_id, "repairing", "repair", hour, hours=[label])
        # Step 3: beside the old rows, hidden from the views.
        fault_plan = faults.FaultPlan.from_env()
        written: dict[str, int] = {}
        for table, df in ((T.RAW, rows[T.RAW]), (T.QUARANTINE, rows[T.QUARANTINE]), (T.REVISIONS, revisions),
                          (T.AGGREGATES, latest_per_window(revisions))):
            written[table] = _append(spark, table, df)
            log.info("repair run %d: %s: %d rows of %s written (not shown yet)", run_id, table, written[table], label)
            if fault_plan is not None:
                fault_plan.hit(faults.REPAIR_AFTER_WRITE, run_id, 1)
        # Step 4: the switch.
        _append_ledger(spark, run_id, "repaired", "repair", hour, read=[asdict(r) for r in ranges], rows=written,
                       hours=[label])
        # Step 5.
        _clear_older(spark, hour, run_id)
        _append_ledger(spark, run_id, "cleared", "repair", hour, hours=[label], message="older rows deleted")
    write_manifest(settings, run_id, "repaired", {"hour": label, "rows": written})
    return LoadResult(hour=label, run_id=run_id, hours=[label], staged=written, inserted=written,
                      gate=[result.describe().splitlines()[0]], seconds=time.monotonic() - started)


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
                delete_rows(spark, T.staged(table), _hours_condition("event_hour", [hour]))
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
    :class:`~adpipe.lakehouse.outcome.GateFailed` (a repair's audit failed:
    nothing written, the hour stays held), :class:`HourNotHeld` (``held_only``)."""
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
