"""Bodies of the ``ad_union_and_load`` DAG's tasks: one UTC hour each run,
taken from the run's data interval (never from the clock), so a rerun, a
catchup run or a backfill run of an hour does the same thing.

1. ``wait_for_hour_closed`` - every region has closed the hour: its stream
   watermark (delay and allowed lateness included) is past the hour's end,
   or, for a quiet region, its stream has no lag and the clock is past the
   hour's end plus the lateness (``adpipe.lakehouse.load.hour_closed``).
2. ``load`` - Union & Load of the hour into the Delta tables (idempotent:
   insert-only MERGE on each table's key).
3. ``validate`` - the Great Expectations suites on the hour; a failed
   expectation raises ``QualityError`` naming it, which fails the run and
   fires the failure notifier.
4. ``publish_data_docs`` - copies the hour's Data Docs site to a stable
   place (``$ADPIPE_HOME/data_docs/<hour>``) and points ``latest`` at it."""

from __future__ import annotations

import logging
import shutil
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from adpipe.settings import Settings

log = logging.getLogger(__name__)

ONE_HOUR = timedelta(hours=1)


class IntervalError(ValueError):
    """The run's data interval is not one whole UTC hour."""


def hour_of_interval(start: datetime | None, end: datetime | None) -> datetime:
    """The UTC hour a run covers: its data interval must be exactly one
    whole hour (the DAG's timetable gives that; a manual run without one
    is refused rather than guessed)."""
    if start is None or end is None:
        raise IntervalError("the run has no data interval")
    start_utc = datetime.fromtimestamp(start.timestamp(), UTC)
    end_utc = datetime.fromtimestamp(end.timestamp(), UTC)
    if end_utc - start_utc != ONE_HOUR or start_utc != start_utc.replace(minute=0, second=0, microsecond=0):
        raise IntervalError(f"data interval {start_utc.isoformat()} .. {end_utc.isoformat()} is not one whole hour")
    return start_utc


def _plain(value: Any) -> Any:
    """A JSON-friendly copy for XCom."""
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path | datetime):
        return str(value)
    return value


def hour_is_closed(settings: Settings, hour: datetime) -> bool:
    from adpipe.lakehouse.load import hour_closed

    closed = hour_closed(settings, hour)
    log.info("hour %s closed: %s", hour.isoformat(), closed)
    return closed


def load(settings: Settings, hour: datetime) -> dict[str, Any]:
    from adpipe.lakehouse.load import load_hour

    result = load_hour(settings, hour)
    log.info("%s", result.describe())
    return _plain(result)


def validate(settings: Settings, hour: datetime) -> dict[str, Any]:
    """Raises ``QualityError`` (naming every failed expectation) on failure."""
    from adpipe.lakehouse.load import hour_label
    from adpipe.lakehouse.metastore import metastore_session
    from adpipe.lakehouse.quality import validate_hour

    # The tables are found through the Hive metastore: in a task process of
    # its own (Airflow's executors) there is no session yet to reuse.
    spark = metastore_session(settings, f"adpipe-validate-{hour_label(hour)}")
    result = validate_hour(settings, hour, spark)
    log.info("%s", result.describe())
    summary = {
        "hour": hour.isoformat(),
        "success": result.success,
        "failed": list(result.failed),
        "data_docs": str(result.data_docs) if result.data_docs else None,
    }
    result.raise_for_failure()
    return summary


def publish_data_docs(settings: Settings, hour: datetime, data_docs: str | None) -> str | None:
    """Copy the Data Docs site the validation built to
    ``$ADPIPE_HOME/data_docs/<hour>`` and point ``latest`` at it. Returns
    the published index page (a file: URI), or None when there were none."""
    if not data_docs:
        log.warning("validation of %s built no Data Docs; nothing to publish", hour.isoformat())
        return None
    source = Path(data_docs)
    site = source if source.is_dir() else source.parent
    target_root = settings.home / "data_docs"
    target = target_root / hour.strftime("%Y-%m-%dT%H")
    if target.resolve() != site.resolve():
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(site, target)
    latest = target_root / "latest"
    tmp = target_root / ".latest.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target.name)
    tmp.replace(latest)
    index = target / (source.name if source.is_file() else "index.html")
    uri = index.resolve().as_uri()
    log.info("Data Docs of %s published: %s", hour.isoformat(), uri)
    return uri
