"""Print the ``ads`` tables as JSON (run as a subprocess by the tests, so the
test process never holds a SparkSession of its own with other settings).

    python tests/integration/tables_dump.py [HOUR]
    python tests/integration/tables_dump.py --serve

Output: {"versions": {table: latest version}, "rows": {table: [row, ...]},
"staged": {table: [row, ...]}, "whole": {table: [row of its whole-hour
view, ...]}, "load_runs": [row, ...], "late_corrections": [row, ...]} with
the rows sorted by their unique key and without ``loaded_at``; the
aggregates' revisions table is in "versions", "rows" and "whole" (it has no
staging twin).

``--serve``: one session for many dumps (a Spark JVM start each was the
tests' costliest habit): each line read from stdin is an hour (or empty:
all), answered by one JSON line on stdout; it stops at the end of stdin.
Every table and view is refreshed before it is read, so a dump sees what
other processes wrote since the last one."""

from __future__ import annotations

import json
import sys

from adpipe.lakehouse import tables as T
from adpipe.lakehouse.load import parse_hour
from adpipe.lakehouse.metastore import metastore_session
from adpipe.settings import load_settings
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def _rows(df, keys) -> list[dict]:  # noqa: ANN001
    if "raw_value" in df.columns:
        df = df.withColumn("raw_value", F.base64("raw_value"))
    rows = [r.asDict() for r in df.orderBy(*keys).collect()]
    return [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.items()} for r in rows]


def _table(spark: SparkSession, name: str):  # noqa: ANN202
    spark.catalog.refreshTable(name)
    return spark.table(name)


def dump(spark: SparkSession, hour_label: str | None) -> dict:
    hour = parse_hour(hour_label) if hour_label else None
    out: dict = {"versions": {}, "rows": {}, "staged": {}, "whole": {}}
    keyed = {**{name: keys for name, (_schema, keys) in T.TABLES.items()}, T.REVISIONS: ("record_uuid",)}
    for name, keys in keyed.items():
        out["versions"][name] = DeltaTable.forName(spark, name).history(1).first()["version"]
        sections = [("rows", name), ("whole", T.whole_view(name))]
        if name in T.TABLES:
            sections.append(("staged", T.staged(name)))
        for section, table in sections:
            df = _table(spark, table).drop("loaded_at")
            if hour is not None:
                df = df.where(F.col("event_hour") == F.lit(hour))
            out[section][name] = _rows(df, keys)
    out["load_runs"] = _rows(_table(spark, T.LOAD_RUNS).drop("read", "coverage"), ["run_id", "at"])
    out["late_corrections"] = _rows(_table(spark, T.LATE_CORRECTIONS), ["event_hour", "table_name", "load_run"])
    return out


def main() -> None:
    spark = metastore_session(load_settings(), "adpipe-test-dump")
    if sys.argv[1:] == ["--serve"]:
        for line in sys.stdin:
            print(json.dumps(dump(spark, line.strip() or None)), flush=True)
    else:
        print(json.dumps(dump(spark, sys.argv[1] if len(sys.argv) > 1 else None)))


if __name__ == "__main__":
    main()
