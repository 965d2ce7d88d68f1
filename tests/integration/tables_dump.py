"""Print the ``ads`` tables as JSON (run as a subprocess by the tests, so the
test process never holds a SparkSession of its own with other settings).

    python tests/integration/tables_dump.py [HOUR]

Output: {"versions": {table: latest version}, "rows": {table: [row, ...]}}
with the rows sorted by their unique key and without ``loaded_at``."""

from __future__ import annotations

import json
import sys

from adpipe.lakehouse import tables as T
from adpipe.lakehouse.load import parse_hour
from adpipe.lakehouse.metastore import metastore_session
from adpipe.settings import load_settings
from delta.tables import DeltaTable
from pyspark.sql import functions as F


def main() -> None:
    spark = metastore_session(load_settings(), "adpipe-test-dump")
    hour = parse_hour(sys.argv[1]) if len(sys.argv) > 1 else None
    out: dict = {"versions": {}, "rows": {}}
    for name, (_schema, keys) in T.TABLES.items():
        out["versions"][name] = DeltaTable.forName(spark, name).history(1).first()["version"]
        df = spark.table(name).drop("loaded_at")
        if hour is not None:
            df = df.where(F.col("event_hour") == F.lit(hour))
        if "raw_value" in df.columns:
            df = df.withColumn("raw_value", F.base64("raw_value"))
        rows = [r.asDict() for r in df.orderBy(*keys).collect()]
        out["rows"][name] = [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.items()} for r in rows]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
