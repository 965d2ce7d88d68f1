"""Print the ``ads`` tables as JSON (run as a subprocess by the tests, so the
test process never holds a SparkSession of its own with other settings).

    python tests/integration/tables_dump.py [HOUR]

Output: {"versions": {table: latest version}, "rows": {table: [row, ...]},
"staged": {table: [row, ...]}, "whole": {table: [row of its whole-hour
view, ...]}, "load_runs": [row, ...], "late_corrections": [row, ...]} with
the rows sorted by their unique key and without ``loaded_at``."""

from __future__ import annotations

import json
import sys

from adpipe.lakehouse import tables as T
from adpipe.lakehouse.load import parse_hour
from adpipe.lakehouse.metastore import metastore_session
from adpipe.settings import load_settings
from delta.tables import DeltaTable
from pyspark.sql import functions as F


def _rows(df, keys) -> list[dict]:  # noqa: ANN001
    if "raw_value" in df.columns:
        df = df.withColumn("raw_value", F.base64("raw_value"))
    rows = [r.asDict() for r in df.orderBy(*keys).collect()]
    return [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.items()} for r in rows]


def main() -> None:
    spark = metastore_session(load_settings(), "adpipe-test-dump")
    hour = parse_hour(sys.argv[1]) if len(sys.argv) > 1 else None
    out: dict = {"versions": {}, "rows": {}, "staged": {}, "whole": {}}
    for name, (_schema, keys) in T.TABLES.items():
        out["versions"][name] = DeltaTable.forName(spark, name).history(1).first()["version"]
        for section, table in (("rows", name), ("staged", T.staged(name)), ("whole", T.whole_view(name))):
            df = spark.table(table).drop("loaded_at")
            if hour is not None:
                df = df.where(F.col("event_hour") == F.lit(hour))
            out[section][name] = _rows(df, keys)
    out["load_runs"] = _rows(spark.table(T.LOAD_RUNS).drop("read", "coverage"), ["run_id", "at"])
    out["late_corrections"] = _rows(spark.table(T.LATE_CORRECTIONS), ["event_hour", "table_name", "load_run"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
