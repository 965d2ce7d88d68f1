"""Union & Load: every region's new records into the ``ads`` Delta tables,
written, audited, then published.

Uber's Union & Load is a streaming job; ours is an hourly batch by design
(the project card): the Airflow DAG ``ad_union_and_load`` runs it once an
hour is closed, and any hour can be loaded again, repaired or backfilled.

One run (``adpipe load --hour H``; the DAG's tasks do the same steps)
---------------------------------------------------------------------
1. **Stage** (under the load lock): read, per region and topic, what arrived
   since the offsets earlier runs loaded (:mod:`adpipe.lakehouse.ranges`),
   union the regions, dedupe by each table's key, and insert the rows not
   published yet into the staging twins (``ads_staging.*``), each in the
   partition of its own ``event_hour``. Then append a ``staged`` row to the
   ledger ``ads.load_runs`` with the coverage after this run.
2. **Audit**: for each closed hour with staged rows (and the hour asked
   for), the Great Expectations gate on the candidate (published rows plus
   the staged ones) and what Kafka says of the hour. Per hour: a failed
   gate appends a ``failed`` ledger row for that hour naming the
   expectations, and the hour is *held*: its staged rows stay for
   inspection, later runs neither audit nor publish it (:func:`held_hours`;
   an hour they were not asked for is alerted once), until an operator
   loads it again, repairs it or discards its staged rows. One hour never
   holds back another. An hour past the input's retention of which nothing
   was ever loaded is not checked, nor held: a ``past_retention`` ledger
   row and a WARNING line report it (:mod:`adpipe.lakehouse.retention`).
3. **Publish** (under the load lock): the staged rows of the hours that passed are
   inserted into ``ads.*`` (insert-if-absent on each key, ``load_run`` =
   this run), removed from staging, and a ``published`` ledger row records
   the hours and, per hour, the late corrections (rows published into an
   hour after its first publication; also the view ``ads.late_corrections``).
   Rows of hours still open stay staged until their hour closes.

One write where the design allows: ``adpipe load`` runs the three steps in
one process, under one lock, and the new rows of the hours it publishes for
the first time (the bulk of every hour; up to two hours, a backfill of more
is staged) are not staged. It keeps them in
memory (the rows step 1 computed), audits them with the hour's published
and staged rows, and writes them once, into the published tables (a failed
gate stages them, held as above). Its ``staged`` ledger row, which moves
the offsets past them, then comes after publishing. Corrections to hours
already published, and the hours still open, are staged as above; the
DAG's separate steps stage everything.

A crash anywhere loses and doubles nothing: before the ``staged`` ledger
row the next run reads the same offsets again, and every write is
insert-if-absent on the table's key (a staged row already published, or
staged, is not written again); after it, the rows are in staging or
published, and the next run audits and publishes what is staged. ``adpipe load --hour H --repair``
(:mod:`adpipe.lakehouse.repair`) rebuilds one hour from Kafka (read from
the hour's start, whatever was loaded), audited the same way, and switches
the views to it in one step; an operator's discard of a held hour's staged
rows is that module's too.

Aggregates: staging holds every revision of a window read (by
``record_uuid``). Publishing writes each window's highest revision into
``ads.ad_minute_aggregates`` (one row per window: inserted, or replacing a
lower revision only; :func:`~adpipe.lakehouse.merge.merge_latest_revisions`),
then every record into the revisions table (insert-if-absent).
A revision of a window already published is a late correction as any row.

A manifest of each run (ranges read, rows, gate) is kept under
``$ADPIPE_HOME/load/runs/``.

This module is the write-audit-publish; its parts are
:mod:`~adpipe.lakehouse.read` (Kafka into rows),
:mod:`~adpipe.lakehouse.rows` and :mod:`~adpipe.lakehouse.revisions` (the
rows' shape, pure), :mod:`~adpipe.lakehouse.merge` (the MERGEs, with
conflict retries), :mod:`~adpipe.lakehouse.ledger` (the ledger and the load
lock) and :mod:`~adpipe.lakehouse.outcome` (results, manifests)."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from adpipe import alerting, faults, metrics
from adpipe.lakehouse import quality, retention
from adpipe.lakehouse import tables as T
from adpipe.lakehouse.errors import LoadError
from adpipe.lakehouse.handover import step_file, write_json
from adpipe.lakehouse.ledger import (
    _append_ledger,
    _failed_before,
    _failed_in_run,
    _finalized_hours,
    held_hours,
    ledger_state,
    load_lock,
    lock_still_held,
)
from adpipe.lakehouse.merge import merge_latest_revisions, merge_new_rows
from adpipe.lakehouse.metastore import metastore_session
from adpipe.lakehouse.outcome import Audit, GateFailed, LoadResult, gate_failure, write_manifest
from adpipe.lakehouse.ranges import (
    ONE_HOUR,
    OutputNotStable,
    TopicRange,
    advance,
    closed_hours,
    closed_through,
    hour_closed,
    hour_label,
    hours_between,
    iso_ms,
    parse_hour,
    read_since_ms,
    region_ranges,
)
from adpipe.lakehouse.read import (
    _in_hours,
    kafka_facts,
    table_rows,
)
from adpipe.lakehouse.repair import clear_staged, finish_repairs
from adpipe.lakehouse.revisions import latest_per_window, newer_than_published
from adpipe.lakehouse.staging import (
    FirstHours,
    KeptRows,
    NewRows,
    hour_counts,
    hours_to_audit,
    pending_hours,
    rows_not_loaded,
    stage_new,
)
from adpipe.settings import Settings
from adpipe.spark import in_threads

__all__ = [
    "ONE_HOUR",
    "Audit",
    "GateFailed",
    "LoadError",
    "LoadResult",
    "OutputNotStable",
    "StagedRun",
    "TopicRange",
    "audit",
    "hour_closed",
    "hour_label",
    "hours_between",
    "iso_ms",
    "kafka_facts",
    "load_hour",
    "parse_hour",
    "publish",
    "read_since_ms",
    "region_ranges",
    "stage",
    "step_file",
    "write_json",
]

log = logging.getLogger(__name__)


# --- write, audit, publish ----------------------------------------------------------------------


class HourOpen(LoadError):
    """An hour asked for is not closed by every region's stream yet."""


@dataclass
class StagedRun:
    """What a staging step did; handed to audit and publish (also through
    Airflow's XCom, as a dict)."""

    run_id: int
    kind: str
    hour: str  # the hour asked for (the first of a range)
    hours: list[str]  # the hours to audit and publish: closed ones with staged rows, and those asked for
    staged: dict[str, int] = field(default_factory=dict)  # rows staged by this run, per table
    read: list[dict] = field(default_factory=list)  # the ranges read, per region
    lost_to_retention: int = 0
    asked: list[str] = field(default_factory=list)  # the hours asked for (empty: ``hour`` alone)
    held: list[str] = field(default_factory=list)  # hours with staged rows a failed gate holds (not audited)
    direct: list[str] = field(default_factory=list)  # hours whose new rows this run keeps, not staged (KeptRows)

    def hour_list(self) -> list[datetime]:
        return [parse_hour(h) for h in self.hours]

    def asked_hours(self) -> list[str]:
        return self.asked or [self.hour]

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self), default=str))

    @classmethod
    def from_dict(cls, data: dict) -> StagedRun:
        return cls(**data)


# The most hours whose rows a load keeps instead of staging them: an hourly
# load publishes one for the first time, two after a late run. Each hour's
# audit scans every kept row (a checkpoint has no partitions to prune), so a
# backfill of many hours is staged as before.
KEEP_MAX_HOURS = 2


def _alert_cross_region(settings: Settings, spark: SparkSession, run_id: int, kept: KeptRows | None) -> None:
    """One alert for the cross-region copies this run found (each copy is
    staged, or kept, once, by the run that found it first)."""
    found = spark.table(T.staged(T.QUARANTINE)).where(F.col("load_run") == F.lit(run_id))
    if kept is not None:
        found = found.unionByName(kept.rows[T.QUARANTINE].select(*found.columns))
    by_hour = hour_counts(found.where(F.col("source") == F.lit(T.SOURCE_CROSS_REGION)))
    if not by_hour:
        return
    log.warning("run %d: events that reached more than one region (counted by each): %s", run_id, by_hour)
    alerting.send_alert(settings, {
        "at": datetime.now(UTC).isoformat(), "source": "union_and_load", "run_id": run_id,
        "hours": sorted(by_hour), "cross_region_duplicates": sum(by_hour.values()),
        "regions": [r.job_id for r in settings.regions],
        "message": f"{sum(by_hour.values())} raw events reached more than one region and were counted (and "
        f"charged) by each region's stream, per hour {by_hour}; listed in {T.CROSS_REGION_DUPLICATES}",
    })


def stage(
    settings: Settings,
    spark: SparkSession,
    hour: datetime,
    last_hour: datetime | None = None,
    allow_open: bool = False,
) -> StagedRun:
    """Step 1 (module doc): stage what arrived since the last run. ``hour``
    (to ``last_hour``): the hours asked for, which must be closed unless
    ``allow_open``; the first one bounds the read of a partition no run has
    loaded yet."""
    return _stage(settings, spark, hour, last_hour, allow_open, keep_first=False)[0]


def _stage(
    settings: Settings,
    spark: SparkSession,
    hour: datetime,
    last_hour: datetime | None,
    allow_open: bool,
    keep_first: bool,
) -> tuple[StagedRun, KeptRows | None]:
    """:func:`stage`; with ``keep_first`` (a load that audits and publishes
    in the same process), the new rows of the hours it will publish for the
    first time are kept, not staged (:class:`KeptRows`)."""
    started = time.monotonic()
    asked = hours_between(hour, last_hour)
    if not allow_open:
        open_hours = [h for h in asked if h not in closed_hours(settings, asked)]
        if open_hours:
            raise HourOpen(
                f"hour {hour_label(open_hours[0])} is not closed yet: a region's stream watermark has not passed "
                f"{hour_label(open_hours[0] + ONE_HOUR)} plus the allowed lateness "
                f"({settings.allowed_lateness_s} s). Wait, or pass --allow-open to load what is there (its windows "
                "may be incomplete, or revised later: a later load brings their revisions as late corrections)."
            )
    with load_lock(settings):
        finish_repairs(spark)  # a repair that died: its rows never shown by a later run's publication
        state = ledger_state(spark)
        run_id = state.next_run
        loaded_at = datetime.now(UTC).replace(microsecond=0)
        # Besides the hours asked, a run audits the hours with staged rows
        # that were closed before its read, so the read holds all they will
        # ever have. One that closes during the read waits for the next run:
        # audited now, its rows read before it closed would fail the gate for
        # no fault (adpipe chaos found it).
        horizon = closed_through(settings, asked[0], datetime.now(UTC).replace(minute=0, second=0, microsecond=0))
        ranges = [region_ranges(settings, r, hour, state.coverage.get(r.job_id)) for r in settings.regions]
        for rr in ranges:
            log.info(
                "run %d, region %s: raw %d records (to the stream's committed offsets), aggregates %d, late %d, "
                "dlq %d",
                run_id, rr.region, rr.raw.records(), rr.aggregates.records(), rr.late.records(), rr.dlq.records(),
            )
        new: NewRows = {}
        if any(rng.records() for rr in ranges for rng in rr.topics()):
            rows = table_rows(spark, settings, ranges, loaded_at, run_id)
            new = in_threads({table: functools.partial(rows_not_loaded, spark, table, source)
                              for table, source in rows.items()})
        else:  # a rerun, a backfill of loaded hours: no Kafka read, no MERGE of nothing
            log.info("run %d: no new record in any region's topics: nothing to stage", run_id)
        audit_hours = functools.partial(hours_to_audit, asked=asked, horizon=horizon, held=held_hours(spark))
        first = _first_hours(spark, run_id, new, audit_hours) if keep_first and new else None
        if first is not None:
            lock_still_held(settings)
            staged, kept = first.keep(spark, new, run_id)
            hours, waiting = first.audited, first.waiting
        else:
            kept = None
            lock_still_held(settings)
            staged = stage_new(spark, new, run_id, set(new))
            hours, waiting = audit_hours(set(pending_hours(spark, run_id)))
        if len(settings.regions) > 1:
            _alert_cross_region(settings, spark, run_id, kept)
        faults_plan = faults.FaultPlan.from_env()
        if faults_plan is not None:
            faults_plan.hit(faults.LOAD_AFTER_STAGE, run_id, 1)
        if waiting:
            log.warning("run %d: hours held by a failed gate, left for an operator: %s", run_id, ", ".join(waiting))
        lost = sum(n for rr in ranges for rng in rr.topics() for n in rng.lost.values())
        run = StagedRun(
            run_id, "load", hour_label(hour), [hour_label(h) for h in hours], staged, [asdict(r) for r in ranges], lost,
            asked=[hour_label(h) for h in asked], held=waiting,
            direct=[hour_label(h) for h in first.hours] if first is not None else [],
        )
        ledger = dict(
            run_id=run_id, step="staged", kind="load", hour=hour,
            coverage=advance(state.coverage, ranges), read=run.read, rows=staged, hours=run.hours,
            message=f"{lost} records lost to retention before any load read them" if lost else None,
        )
        if kept is not None:
            kept.ledger = ledger
            log.info("run %d: the rows of %s kept to be published once audited (not staged)", run_id,
                     ", ".join(run.direct))
        else:
            lock_still_held(settings)
            _append_ledger(spark, **ledger)
    write_manifest(settings, run_id, "staged", run.to_dict())
    metrics.load().staged(settings, run_id, staged, lost, time.monotonic() - started)
    return run, kept


def _first_hours(
    spark: SparkSession, run_id: int, new: NewRows, audit_hours: Callable[[set[str]], tuple[list[datetime], list[str]]]
) -> FirstHours | None:
    """For a load that audits and publishes in the same process: the hours
    it publishes for the first time, whose new rows it keeps instead of
    staging them; None for none, or for a backfill of more than
    KEEP_MAX_HOURS (staged, so that each hour's audit reads its own partition)."""
    counts = in_threads({table: functools.partial(hour_counts, df) for table, (df, _h) in new.items()})
    arrived = {h for by_hour in counts.values() for h, n in by_hour.items() if n}
    audited, waiting = audit_hours(set(pending_hours(spark, run_id)) | arrived)
    finalized = _finalized_hours(spark)
    first = [h for h in audited if hour_label(h) in arrived and hour_label(h) not in finalized]
    if not first or len(first) > KEEP_MAX_HOURS:
        return None
    return FirstHours(first, counts, audited, waiting)


def audit(settings: Settings, spark: SparkSession, run: StagedRun, kept: KeptRows | None = None) -> Audit:
    """Step 2: the gate on each hour's candidate (published plus staged
    rows, plus the run's ``kept`` ones). A failure is written to the ledger
    (the failed hour's kept rows staged first); nothing is published. An
    hour past the input's retention of which nothing was loaded is not
    checked: a ``past_retention`` ledger row and one WARNING line report it
    (:mod:`adpipe.lakehouse.retention`)."""
    started = time.monotonic()
    results = []
    past = []
    for hour in run.hour_list():
        facts = kafka_facts(settings, spark, hour)
        unstaged = kept.rows if kept is not None and hour_label(hour) in run.direct else None
        if facts.retention_gaps:
            gone = retention.past_retention(hour, facts.retention_gaps, retention.hour_loaded(spark, hour, unstaged),
                                            facts.regions_with_input)
            if gone is not None:
                past.append(gone)
                continue
        with quality.hour_frames(spark, hour, staged_through=run.run_id, unstaged=unstaged).for_gate() as frames:
            results.append(quality.validate_frames(settings, hour, frames, facts))
    failed = {hour_label(r.hour): "\n".join(r.failed) for r in results if not r.success}
    held_kept = [parse_hour(h) for h in failed if h in run.direct]
    if kept is not None and held_kept:
        kept.stage(spark, held_kept, run.run_id)
    for label, message in failed.items():
        # One ledger row per failed hour: publish leaves it out, later runs leave it held (held_hours).
        _append_ledger(spark, run.run_id, "failed", run.kind, parse_hour(label), hours=[label], message=message)
        if label not in run.asked_hours() and not _failed_before(spark, label, message, run.run_id):
            # An hour this run was not asked for fails nobody's task: it is said here, once.
            alerting.send_alert(settings, {
                "at": datetime.now(UTC).isoformat(), "source": "union_and_load", "hour": label,
                "run_id": run.run_id, "message": f"hour {label} held by its quality gate (its staged rows wait for "
                f"an operator; other hours go on being published): {message}",
            })
    for gone in past:
        # Not a failure: publish leaves the hour out, nothing holds it, nothing alerts; the line says it.
        log.warning("run %d: %s", run.run_id, gone.describe())
        _append_ledger(spark, run.run_id, T.STEP_PAST_RETENTION, run.kind, gone.hour, hours=[gone.label],
                       message=gone.describe())
    if failed:
        write_manifest(settings, run.run_id, "failed", {"failed": failed})
    if past:
        write_manifest(settings, run.run_id, T.STEP_PAST_RETENTION, {p.label: p.describe() for p in past})
    gates = [(hour_label(r.hour), r.success) for r in results]
    metrics.load().audited(settings, run.run_id, gates, time.monotonic() - started)
    return Audit(results, past)


def publish(
    settings: Settings, spark: SparkSession, run: StagedRun, kept: KeptRows | None = None
) -> dict[str, dict]:
    """Step 3: the audited hours' staged rows (and the run's ``kept`` ones)
    into the published tables. Returns ``{"inserted": {table: rows},
    "corrections": {hour: rows}}``."""
    started = time.monotonic()
    with load_lock(settings):
        finish_repairs(spark)
        failed = _failed_in_run(spark, run.run_id)
        hours = [h for h in run.hour_list() if hour_label(h) not in failed]
        # Corrections are counted only in the hours published before (a
        # first publication has none).
        finalized = _finalized_hours(spark)
        late_hours = [h for h in hours if hour_label(h) in finalized]
        fault_plan = faults.FaultPlan.from_env()

        def publish_table(table: str) -> tuple[dict[str, int], dict[str, int]]:
            lock_still_held(settings)  # a holder cut off past its session writes nothing more
            schema, keys = T.TABLES[table]
            staged = (
                spark.table(T.staged(table))
                .where(_in_hours(hours) & (F.col("load_run") <= run.run_id))
                .select(*schema.fieldNames())
            )
            if kept is not None:
                staged = staged.unionByName(kept.of_hours(table, hours).select(*schema.fieldNames()))
            staged = staged.withColumn("load_run", F.lit(run.run_id).cast("long"))
            published = spark.table(T.loaded_in(table)).where(_in_hours(hours)).select(*keys)
            new_rows = staged.join(published, list(keys), "left_anti")
            if table == T.AGGREGATES:
                rows, late = _publish_aggregates(spark, staged, new_rows, hours, late_hours)
            else:
                late = hour_counts(new_rows.where(_in_hours(late_hours))) if late_hours else {}
                rows = {table: merge_new_rows(spark, table, new_rows, keys, hours)}
            log.info("run %d: %s rows published", run.run_id, rows)
            if fault_plan is not None:
                fault_plan.hit(faults.LOAD_AFTER_PUBLISH, run.run_id, 1)
            return rows, late

        # The tables are independent (their own Delta logs), published side
        # by side as they are staged; a kill between two leaves the rest
        # staged, and the next run publishes them (insert-if-absent). With
        # the fault point after the first table armed, one at a time, so
        # that it is the point its name says.
        calls = {table: functools.partial(publish_table, table) for table in T.TABLES}
        if fault_plan is not None and fault_plan.point == faults.LOAD_AFTER_PUBLISH:
            done = {table: call() for table, call in calls.items()}
        else:
            done = in_threads(calls)
        inserted = {table: n for rows, _late in done.values() for table, n in rows.items()}
        corrections: dict[str, int] = {}
        for _rows, late in done.values():
            for h, n in late.items():
                corrections[h] = corrections.get(h, 0) + n
        clear_staged(spark, hours, run.run_id)
        if kept is not None:
            kept.record(spark)  # the coverage past the kept rows, now published
        lock_still_held(settings)
        _append_ledger(spark, run.run_id, "published", run.kind, parse_hour(run.hour), rows=inserted,
                       hours=[hour_label(h) for h in hours], corrections=corrections)
    if corrections:
        log.info("run %d: late corrections to hours already published: %s", run.run_id, corrections)
    write_manifest(settings, run.run_id, "published", {"inserted": inserted, "corrections": corrections})
    metrics.load().published(settings, run.run_id, inserted, sum(corrections.values()), time.monotonic() - started)
    return {"inserted": inserted, "corrections": corrections}


def _publish_aggregates(
    spark: SparkSession, staged: DataFrame, new_rows: DataFrame, hours: list[datetime], late_hours: list[datetime]
) -> tuple[dict[str, int], dict[str, int]]:
    """The audited aggregate records of ``hours`` (``staged``, every
    revision read; ``new_rows``, those not in the revisions table yet):
    each window's latest into ``ads.ad_minute_aggregates``, where it
    replaces a lower revision only, then each record into the revisions
    table. The latest are taken from every staged record, published already
    or not, so that a run that died between the two MERGEs is completed by
    the next one (which finds the records not in the revisions table yet,
    and stages them again). In this order: a run's own new rows are lazy
    frames that leave out what the revisions table holds. Returns the rows
    written per table and the late corrections (windows inserted or revised
    in hours published before)."""
    changes = newer_than_published(
        latest_per_window(staged), spark.table(T.AGGREGATES).where(_in_hours(hours))
    )
    late = hour_counts(changes.where(_in_hours(late_hours))) if late_hours else {}
    rows = merge_latest_revisions(spark, T.AGGREGATES, changes, T.WINDOW_KEY, hours)
    revisions = merge_new_rows(spark, T.REVISIONS, new_rows, ("record_uuid",), hours)
    return {T.AGGREGATES: rows, T.REVISIONS: revisions}, late


def load_hour(
    settings: Settings,
    hour: datetime,
    spark: SparkSession | None = None,
    last_hour: datetime | None = None,
    allow_open: bool = False,
) -> LoadResult:
    """Union & Load asked for ``hour`` (to ``last_hour``): stage, audit,
    publish (module doc). Raises :class:`HourOpen` for an hour not closed,
    :class:`GateFailed` (nothing published) for a failed audit."""
    started = time.monotonic()
    quality.import_ge_in_background()  # while the rows are staged
    # One lock for the three steps: the kept rows' run id and coverage are
    # written to the ledger only at the end (KeptRows).
    with load_lock(settings):
        spark = spark or metastore_session(settings, f"adpipe-load-{hour_label(hour)}")
        run, kept = _stage(settings, spark, hour, last_hour, allow_open, keep_first=True)
        audited = audit(settings, spark, run, kept)
        # Write-audit-publish per hour: the hours that passed are published
        # whatever another hour's gate says (an hour past retention is neither).
        passed = audited.passed()
        done = publish(settings, spark, run, kept) if passed else {"inserted": {}, "corrections": {}}
        if kept is not None:
            kept.record(spark)  # nothing passed: the kept rows are staged, held
    if audited.failed_asked(run.asked_hours()):
        raise gate_failure(audited.results, passed)
    return LoadResult(
        hour=run.hour, run_id=run.run_id, hours=passed, staged=run.staged, inserted=done["inserted"],
        corrections=done["corrections"], gate=[r.describe().splitlines()[0] for r in audited.results],
        seconds=time.monotonic() - started, held=[hour_label(r.hour) for r in audited.failed()] + run.held,
        past_retention=[p.label for p in audited.past_retention],
    )

