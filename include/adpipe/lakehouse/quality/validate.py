"""Running the quality gate on one hour: the checkpoints on the hour's
frames, with the numbers the aggregates must match computed in Spark from
the raw events, and what Kafka says of the hour (:class:`KafkaFacts`); the
verdict is logged, kept as JSON under ``gx/uncommitted/hourly_results`` and
returned as a :class:`~adpipe.lakehouse.quality.report.QualityResult`.

The frames are built in Spark. GE checks them on its pandas engine when the
hour is small (``ADPIPE_GATE_PANDAS_MAX_ROWS`` raw events plus windows): its
Spark engine runs a Spark job or more per expectation, seconds per hour
even for a handful of rows, while collecting a small hour is one job per
frame. A bigger hour stays in Spark, and so does one that fails to collect."""

from __future__ import annotations

import importlib
import json
import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from adpipe.lakehouse.quality.context import context_lock, docs_index, gx_root, set_up_checkpoints
from adpipe.lakehouse.quality.frames import (
    HourFrames,
    emitted_only,
    hour_frames,
    normalize_hour,
    pandas_frame,
    reconciliation_frame,
    with_hour_check,
    with_late_flag,
    with_window_checks,
)
from adpipe.lakehouse.quality.report import QualityResult, failure_line, hour_tag
from adpipe.lakehouse.quality.suites import (
    AGGREGATES_CHECKED_COLUMNS,
    AGGREGATES_NAME,
    INDEX_COLUMNS,
    P_EXPECTED_CLICKS,
    P_EXPECTED_IMPRESSIONS,
    P_EXPECTED_REGIONS,
    P_EXPECTED_WINDOWS,
    P_MAX_LATE_SHARE,
    P_MIN_RAW_ROWS,
    PANDAS,
    RAW_CHECKED_COLUMNS,
    RAW_NAME,
    RECONCILIATION_NAME,
    SPARK,
)
from adpipe.settings import Settings

# The gate's logger, as before it was split: its lines read the same.
log = logging.getLogger("adpipe.lakehouse.quality")


def _expected_parameters(recon_df: DataFrame) -> dict[str, int]:
    row = recon_df.agg(
        F.count("expected_impressions").alias(P_EXPECTED_WINDOWS),
        F.coalesce(F.sum("expected_impressions"), F.lit(0)).alias(P_EXPECTED_IMPRESSIONS),
        F.coalesce(F.sum("expected_clicks"), F.lit(0)).alias(P_EXPECTED_CLICKS),
        F.count(F.lit(1)).alias("recon_rows"),
    ).first()
    assert row is not None
    return {k: int(row[k]) for k in (P_EXPECTED_WINDOWS, P_EXPECTED_IMPRESSIONS, P_EXPECTED_CLICKS, "recon_rows")}


@dataclass(frozen=True)
class KafkaFacts:
    """What Kafka says about an hour, independently of the tables
    (:func:`adpipe.lakehouse.load.kafka_facts`): the regions whose raw topic
    holds a valid event of the hour, the topics that no longer hold all of
    its records (deleted by retention), and each stream's watermark."""

    regions_with_input: tuple[str, ...] = ()
    retention_gaps: tuple[dict, ...] = ()
    # Per region, its stream's committed watermark (epoch ms; a region that
    # never committed is absent): windows past it have no aggregate yet.
    # None: reconcile every raw event.
    watermarks: dict[str, int] | None = None

    def failures(self) -> list[str]:
        return [
            f"kafka_retention: {g['region']} {g['topic']}[{g['partition']}] keeps records from offset "
            f"{g['first_offset']} only, written after the hour began: Kafka can no longer prove this hour"
            for g in self.retention_gaps
        ]


def import_ge_in_background() -> threading.Thread:
    """Start importing Great Expectations (about 3 s that the gate would
    otherwise wait for) in a daemon thread: a load stages its rows first,
    and the driver's Python mostly waits on Spark meanwhile. The gate's own
    import waits for this one to finish (Python's import lock); one that
    fails here fails there again, with its error."""

    def run() -> None:
        try:
            importlib.import_module("great_expectations")
        except Exception:  # noqa: BLE001 - reported by the gate's own import
            log.debug("importing Great Expectations in the background failed", exc_info=True)

    thread = threading.Thread(target=run, name="ge-import", daemon=True)
    thread.start()
    return thread


def validate_frames(
    settings: Settings, hour: datetime, frames: HourFrames, facts: KafkaFacts | None = None
) -> QualityResult:
    """Run the hour's GE checkpoints on the given frames (no table reads).

    ``facts`` (:func:`kafka_facts`): an hour whose raw topics received
    records is never "empty" (the raw checks then run, and fail on no rows),
    each region with input must have rows, and an hour Kafka no longer holds
    in full fails. An hour with neither on-time raw events nor aggregates
    skips the aggregates and reconciliation checkpoints (GE's column sum of
    an empty column is null, not 0); an hour with nothing at all and no
    input passes with a note.
    """
    from great_expectations.core.run_identifier import RunIdentifier

    facts = facts or KafkaFacts()
    hour = normalize_hour(hour)
    tag = hour_tag(hour)
    # Only the columns the suites read: GE caches (or we collect) what it checks.
    raw_df = with_late_flag(with_hour_check(frames.raw_df), frames.quarantine_df).select(*RAW_CHECKED_COLUMNS)
    aggregates_df = with_window_checks(frames.aggregates_df).select(*AGGREGATES_CHECKED_COLUMNS)
    recon_df = reconciliation_frame(
        emitted_only(frames.raw_df, facts.watermarks), frames.quarantine_df, frames.aggregates_df
    )
    # Cached now, so GE's runs on them (which persist the same frames) read
    # what the parameters and the row count below computed, instead of
    # joining again; each is unpersisted after its run, or below if none.
    for df in (raw_df, recon_df):
        df.persist()

    # The numbers GE compares the aggregates with, computed in Spark from raw.
    stats = _expected_parameters(recon_df)
    recon_rows = stats.pop("recon_rows")
    parameters: dict[str, Any] = {
        **stats,
        P_MAX_LATE_SHARE: settings.max_late_share,
        P_MIN_RAW_ROWS: 1 if facts.regions_with_input else 0,
        P_EXPECTED_REGIONS: sorted(facts.regions_with_input),
    }
    raw_rows = raw_df.count()

    notes: list[str] = []
    to_run: list[tuple[str, DataFrame]] = []
    if raw_rows or facts.regions_with_input:
        to_run.append((RAW_NAME, raw_df))
    else:
        notes.append("no raw events in this hour and no raw input in Kafka: raw checks skipped")
    if recon_rows:
        to_run += [(AGGREGATES_NAME, aggregates_df), (RECONCILIATION_NAME, recon_df)]
    else:
        notes.append("no on-time raw events and no aggregates in this hour: nothing to reconcile")
    if not to_run:
        notes.append("empty hour: valid")
    for df in (raw_df, recon_df):
        if all(df is not checked for _name, checked in to_run):
            df.unpersist()
    engine, batches = _batches(settings, to_run, raw_rows + recon_rows)

    run_time = datetime.now(UTC)  # a record of when the check ran, not a partition
    run_id = RunIdentifier(run_name=f"adpipe-{tag}", run_time=run_time)
    failed: list[str] = []
    all_succeeded = True
    evaluated = 0
    suite_results: dict[str, Any] = {}
    data_docs: Path | None = None

    # The lock is held through the runs too: GE writes results, suites and
    # the Data Docs index as it goes. Hours are validated one at a time anyway.
    with context_lock(settings):
        context, checkpoints = set_up_checkpoints(settings, engine)
        for (name, df), batch in zip(to_run, batches, strict=True):
            log.info("GE: validating %s for hour %s (%s)", name, tag, engine)
            try:
                result = checkpoints[name].run(
                    batch_parameters={"dataframe": batch},
                    expectation_parameters=dict(parameters),
                    run_id=run_id,
                )
            finally:
                df.unpersist()  # GE's Spark engine persists the batch DataFrame
            all_succeeded = all_succeeded and bool(result.success)
            for suite_result in result.run_results.values():
                evaluated += int(suite_result.statistics.get("evaluated_expectations", 0))
                suite_results[name] = suite_result.to_json_dict()
                failed += [failure_line(name, evr, INDEX_COLUMNS[name]) for evr in suite_result.results
                           if not evr.success]
        data_docs = docs_index(context)

    failed += facts.failures()
    success = all_succeeded and not failed
    results_path = gx_root(settings) / "uncommitted" / "hourly_results" / tag / f"{run_time:%Y%m%dT%H%M%S%fZ}.json"
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(
        json.dumps(
            {
                "hour": hour.isoformat(),
                "run_name": run_id.run_name,
                "run_time": run_time.isoformat(),
                "success": success,
                "engine": engine,
                "evaluated": evaluated,
                "failed": failed,
                "notes": notes,
                "parameters": parameters,
                "data_docs": str(data_docs) if data_docs else None,
                "suites": suite_results,
            },
            indent=2,
            default=str,
        )
    )
    quality = QualityResult(
        hour=hour,
        success=success,
        evaluated=evaluated,
        failed=failed,
        data_docs=data_docs,
        results_path=results_path,
        notes=notes,
        parameters=parameters,
    )
    if success:
        log.info("GE: hour %s passed: %d expectations evaluated; %s", tag, evaluated, "; ".join(notes) or "")
    else:
        log.error("GE: hour %s FAILED:\n%s", tag, quality.describe())
    return quality


def _batches(settings: Settings, to_run: list[tuple[str, DataFrame]], rows: int) -> tuple[str, list[Any]]:
    """The engine GE checks the hour on, and what it checks: the frames
    themselves (Spark), or collected (pandas, a small hour: ``rows`` raw
    events plus windows at most ``settings.gate_pandas_max_rows``)."""
    frames = [df for _name, df in to_run]
    if not frames or rows > settings.gate_pandas_max_rows:
        return SPARK, frames
    try:
        batches = [pandas_frame(df) for df in frames]
    except Exception as exc:  # an hour pandas cannot hold is still checked, in Spark
        log.warning("GE: checking in Spark, the hour's frames did not collect to pandas: %s", exc)
        return SPARK, frames
    for df in frames:
        df.unpersist()
    return PANDAS, batches


def validate_hour(
    settings: Settings, hour: datetime, spark: SparkSession | None = None, facts: KafkaFacts | None = None
) -> QualityResult:
    """Read the hour from the published tables and validate it, with
    ``facts``: what Kafka says of the hour (see :func:`validate_frames`).

    Without ``spark``, builds the session on the metastore (where the tables
    are) and stops it afterwards when this call started it."""
    hour = normalize_hour(hour)
    owned = False
    if spark is None:
        from adpipe.lakehouse.metastore import metastore_session

        owned = SparkSession.getActiveSession() is None
        spark = metastore_session(settings, "adpipe-quality")
    try:
        with hour_frames(spark, hour).for_gate() as frames:
            return validate_frames(settings, hour, frames, facts)
    finally:
        if owned:
            spark.stop()
