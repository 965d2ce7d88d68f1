"""Running the quality gate on one hour: the checkpoints on the hour's
frames, with the numbers the aggregates must match computed from the raw
events, and what Kafka says of the hour (:class:`KafkaFacts`); the
verdict is logged, kept as JSON under ``gx/uncommitted/hourly_results`` and
returned as a :class:`~adpipe.lakehouse.quality.report.QualityResult`.

GE checks a small hour (``ADPIPE_GATE_PANDAS_MAX_ROWS`` raw events plus
aggregate rows) on its pandas engine: the hour's three tables are collected
(one Spark job each) and the frames GE checks, the reconciliation included,
computed from them in pandas (:mod:`~adpipe.lakehouse.quality.pandas_frames`).
GE's Spark engine runs a Spark job or more per expectation, seconds per hour
even for a handful of rows. A bigger hour stays in Spark, its frames built
there (:mod:`~adpipe.lakehouse.quality.frames`), and so does one that fails
to collect."""

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

from adpipe.lakehouse.quality import pandas_frames
from adpipe.lakehouse.quality.context import context_lock, docs_index, gx_root, set_up_checkpoints
from adpipe.lakehouse.quality.frames import (
    HourFrames,
    emitted_only,
    hour_frames,
    normalize_hour,
    reconciliation_frame,
    with_conflict_flag,
    with_hour_check,
    with_late_flag,
    with_window_checks,
)
from adpipe.lakehouse.quality.offline import localize, run_pages
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


def import_ge_in_background() -> None:
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

    threading.Thread(target=run, name="ge-import", daemon=True).start()


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
    checked = _pandas_input(settings, frames, facts) or _spark_input(frames, facts)
    stats = dict(checked.stats)
    recon_rows = stats.pop("recon_rows")
    parameters: dict[str, Any] = {
        **stats,
        P_MAX_LATE_SHARE: settings.max_late_share,
        P_MIN_RAW_ROWS: 1 if facts.regions_with_input else 0,
        P_EXPECTED_REGIONS: sorted(facts.regions_with_input),
    }

    notes: list[str] = []
    to_run: list[tuple[str, Any]] = []
    if checked.raw_rows or facts.regions_with_input:
        to_run.append((RAW_NAME, checked.raw))
    else:
        notes.append("no raw events in this hour and no raw input in Kafka: raw checks skipped")
    if recon_rows:
        to_run += [(AGGREGATES_NAME, checked.aggregates), (RECONCILIATION_NAME, checked.recon)]
    else:
        notes.append("no on-time raw events and no aggregates in this hour: nothing to reconcile")
    if not to_run:
        notes.append("empty hour: valid")
    for batch in (checked.raw, checked.recon):
        if all(batch is not run for _name, run in to_run):
            _release(batch)
    engine = checked.engine

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
        for name, batch in to_run:
            log.info("GE: validating %s for hour %s (%s)", name, tag, engine)
            try:
                result = checkpoints[name].run(
                    batch_parameters={"dataframe": batch},
                    expectation_parameters=dict(parameters),
                    run_id=run_id,
                )
            finally:
                _release(batch)  # GE's Spark engine persists the batch DataFrame
            all_succeeded = all_succeeded and bool(result.success)
            for suite_result in result.run_results.values():
                evaluated += int(suite_result.statistics.get("evaluated_expectations", 0))
                suite_results[name] = suite_result.to_json_dict()
                failed += [failure_line(name, evr, INDEX_COLUMNS[name]) for evr in suite_result.results
                           if not evr.success]
        data_docs = docs_index(context)
        if data_docs is not None:  # the pages just written, pointed at the site's own assets
            site = data_docs.parent
            localize(site, settings.data_docs_assets, run_pages(site, run_id.run_name))

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


@dataclass(frozen=True)
class _GateInput:
    """What GE checks (Spark DataFrames, or pandas frames) and the numbers
    computed from it."""

    engine: str
    raw: Any
    aggregates: Any
    recon: Any
    raw_rows: int
    stats: dict[str, int]  # the expected parameters and "recon_rows"


def _release(batch: Any) -> None:
    if isinstance(batch, DataFrame):
        batch.unpersist()


def _hour_rows(frames: HourFrames) -> int:
    """The hour's raw events plus aggregate rows, in one Spark job."""
    kinds = frames.raw_df.select(F.lit(1).alias("n")).unionByName(frames.aggregates_df.select(F.lit(1).alias("n")))
    return kinds.count()


def _pandas_input(settings: Settings, frames: HourFrames, facts: KafkaFacts) -> _GateInput | None:
    """The gate's frames computed in pandas from the hour collected, for an
    hour of at most ``settings.gate_pandas_max_rows`` raw events plus
    aggregate rows; None for a bigger one, or one that fails to collect."""
    if settings.gate_pandas_max_rows <= 0 or _hour_rows(frames) > settings.gate_pandas_max_rows:
        return None
    try:
        collected = pandas_frames.collect(frames)
    except Exception as exc:  # an hour pandas cannot hold is still checked, in Spark
        log.warning("GE: checking in Spark, the hour's frames did not collect to pandas: %s", exc)
        return None
    recon = pandas_frames.reconciliation(collected, facts.watermarks)
    raw = pandas_frames.raw_checked(collected)
    return _GateInput(PANDAS, raw, pandas_frames.aggregates_checked(collected), recon, len(raw),
                      pandas_frames.expected_parameters(recon))


def _spark_input(frames: HourFrames, facts: KafkaFacts) -> _GateInput:
    """The gate's frames as Spark DataFrames (a big hour), the raw rows and
    the reconciliation cached: GE's runs on them (which persist the same
    frames) read what the parameters and the row count computed, instead of
    joining again; each is released after its run, or before if none."""
    flagged = with_conflict_flag(with_late_flag(with_hour_check(frames.raw_df), frames.quarantine_df),
                                 frames.quarantine_df)
    raw_df = flagged.select(*RAW_CHECKED_COLUMNS)
    aggregates_df = with_window_checks(frames.aggregates_df).select(*AGGREGATES_CHECKED_COLUMNS)
    recon_df = reconciliation_frame(
        emitted_only(frames.raw_df, facts.watermarks), frames.quarantine_df, frames.aggregates_df,
        frames.revisions(),
    )
    for df in (raw_df, recon_df):
        df.persist()
    stats = _expected_parameters(recon_df)
    return _GateInput(SPARK, raw_df, aggregates_df, recon_df, raw_df.count(), stats)


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
