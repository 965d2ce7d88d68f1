"""Great Expectations 1.x: the exactly-once proof for one hour of the Delta tables.

For one UTC ``event_hour`` this module reads the three tables of
:mod:`adpipe.lakehouse.tables` and runs three GE checkpoints on the hour's
DataFrames (Spark's, or collected to pandas for a small hour):

* ``adpipe_ad_events_raw`` on the raw events: ``event_id`` unique, a known
  ``event_type``, ``event_hour`` = the hour of ``event_time``.
* ``adpipe_ad_minute_aggregates`` on the aggregates: ``record_uuid`` unique,
  (``region``, ``ad_id``, ``window_start``) unique, windows aligned (start on the minute,
  end = start + 1 minute, in the validated hour), counts non-null
  non-negative ``LongType``; row count and the hour's impression and click
  totals equal to what the raw table implies (numbers computed in Spark and
  passed to GE as ``$PARAMETER`` expectation parameters at run time).
* ``adpipe_minute_reconciliation`` on :func:`reconciliation_frame`: for every
  (ad, minute) the aggregates' counts equal the distinct raw events minus
  those quarantined as late; no side missing.

GE runs from a file-backed context under ``settings.home / "gx"``: data
source, assets, suites, validation definitions and checkpoints are created or
updated on every run (under a file lock, so two processes never race on
"already exists"), results are kept by GE's validation results store, and
each checkpoint's ``UpdateDataDocsAction`` rebuilds the HTML Data Docs under
``gx/uncommitted/data_docs/local_site``. A combined JSON of the hour's results
is written next to them (:attr:`QualityResult.results_path`).

GE and pyspark 4.1: GE 1.24's Spark engine first tries
``pyspark.sql.connect`` ``SparkSession.builder.getOrCreate()``; without a
``SPARK_REMOTE`` that raises a ``ValueError`` that GE catches, and it then
takes the classic ``SparkSession.builder.getOrCreate()``, which returns our
already-running classic session. We give the data source no ``spark_config``
so GE never tries to reconfigure (or stop and restart) that session. Do not
set ``SPARK_REMOTE`` for processes that run these checks.

One module per job: :mod:`~adpipe.lakehouse.quality.frames` (the hour's
DataFrames, Spark only), :mod:`~adpipe.lakehouse.quality.suites` (the
expectations), :mod:`~adpipe.lakehouse.quality.context` (the GE context,
its lock, the Data Docs), :mod:`~adpipe.lakehouse.quality.report` (the
result and its failure lines) and :mod:`~adpipe.lakehouse.quality.validate`
(running the checkpoints on an hour). The names callers use are here.
"""

from adpipe.lakehouse.quality.context import docs_site
from adpipe.lakehouse.quality.frames import (
    HourFrames,
    emitted_only,
    expected_minute_counts,
    hour_frames,
    normalize_hour,
    reconciliation_frame,
)
from adpipe.lakehouse.quality.report import QualityError, QualityResult, failure_line
from adpipe.lakehouse.quality.suites import AGGREGATES_NAME, RAW_NAME, RECONCILIATION_NAME
from adpipe.lakehouse.quality.validate import KafkaFacts, import_ge_in_background, validate_frames, validate_hour

__all__ = [
    "AGGREGATES_NAME",
    "RAW_NAME",
    "RECONCILIATION_NAME",
    "HourFrames",
    "KafkaFacts",
    "QualityError",
    "QualityResult",
    "docs_site",
    "emitted_only",
    "expected_minute_counts",
    "failure_line",
    "hour_frames",
    "import_ge_in_background",
    "normalize_hour",
    "reconciliation_frame",
    "validate_frames",
    "validate_hour",
]
