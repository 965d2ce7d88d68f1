"""The Spark side of tests/integration/test_maintenance.py, as one Spark
application that stays up while the test runs ``adpipe maintain`` (so the
test starts one application of its own, not one before and one after).

    python tests/integration/maintenance_probe.py PROBE_TABLE [TABLE ...]

1. Creates PROBE_TABLE (a Delta table partitioned by ``event_hour``, like the
   ``ads`` tables) and appends two rows to one partition three times: three
   small files. Prints one JSON line: {"location": the table's folder,
   "versions": {table: latest version} of PROBE_TABLE and each TABLE,
   "rows": PROBE_TABLE's rows}.
2. Waits for a line on stdin (the test runs the maintenance meanwhile).
3. Prints one JSON line: {"rows": PROBE_TABLE's rows now, "rows_then": its
   rows at the version of step 1 (time travel: the files OPTIMIZE replaced
   must still be there), "history": {table: [[version, operation,
   metrics], ...] oldest first}, "properties": {table: its table
   properties}}, then drops PROBE_TABLE."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

from adpipe.lakehouse.metastore import metastore_session
from adpipe.settings import load_settings
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

SCHEMA = StructType([StructField("id", StringType(), False), StructField("event_hour", TimestampType(), False)])
HOUR = datetime(2026, 1, 5, 7, tzinfo=UTC)


def _rows(df: DataFrame) -> list[list[str]]:
    return [[r["id"], r["event_hour"].isoformat()] for r in df.orderBy("id").collect()]


def _version(spark: SparkSession, table: str) -> int:
    return spark.sql(f"DESCRIBE HISTORY {table} LIMIT 1").first()["version"]


def main() -> None:
    probe, *others = sys.argv[1:]
    spark = metastore_session(load_settings(), "adpipe-test-maintenance-probe")
    # Step 1: three appends, one file each, into one partition.
    spark.sql(f"CREATE TABLE {probe} (id STRING NOT NULL, event_hour TIMESTAMP NOT NULL) USING delta "
              "PARTITIONED BY (event_hour)")
    for batch in range(3):
        rows = [(f"p{2 * batch + i}", HOUR) for i in range(2)]
        spark.createDataFrame(rows, SCHEMA).coalesce(1).write.format("delta").mode("append").saveAsTable(probe)
    versions = {t: _version(spark, t) for t in (probe, *others)}
    location = spark.sql(f"DESCRIBE DETAIL {probe}").first()["location"]
    print(json.dumps({"location": location, "versions": versions, "rows": _rows(spark.table(probe))}), flush=True)
    # Step 2: the test runs `adpipe maintain`.
    sys.stdin.readline()
    # Step 3: what the maintenance left.
    history, properties = {}, {}
    for table in (probe, *others):
        properties[table] = dict(spark.sql(f"DESCRIBE DETAIL {table}").first()["properties"] or {})
        entries = spark.sql(f"DESCRIBE HISTORY {table}").collect()
        history[table] = sorted(
            [r["version"], r["operation"], dict(r["operationMetrics"] or {})] for r in entries
        )
    then = spark.read.option("versionAsOf", versions[probe]).table(probe)
    out = {"rows": _rows(spark.table(probe)), "rows_then": _rows(then), "history": history, "properties": properties}
    print(json.dumps(out), flush=True)
    spark.sql(f"DROP TABLE {probe}")


if __name__ == "__main__":
    main()
