"""A reader of the whole-hour views, as a process of its own beside a
running ``adpipe load --repair`` (tests/integration/test_revisions_load.py).

    python tests/integration/whole_hour_reader.py HOUR OUT STOP

Polls the hour's rows of the ``ads.*_whole`` views with one Spark session
on the metastore, one query for all of them per poll, until the file STOP
exists, and appends one JSON line per poll to OUT: {"at": seconds since
start, "views": {table: {"rows": n, "impressions": sum, "clicks": sum,
"load_runs": sorted distinct load_run}}}. The first line, {"ready": true},
is written once the session is up and a first poll is done."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from adpipe.lakehouse import tables as T
from adpipe.lakehouse.metastore import metastore_session
from adpipe.settings import load_settings


def main() -> None:
    hour, out, stop = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    spark = metastore_session(load_settings(), "adpipe-test-whole-reader")
    started = time.monotonic()
    at = f"TIMESTAMP'{hour[:10]} {hour[11:13]}:00:00'"
    counted = (T.AGGREGATES, T.REVISIONS)
    query = " UNION ALL ".join(
        f"SELECT '{table}' AS t, count(*) AS n, "  # noqa: S608 - our own table names
        f"{'sum(impressions)' if table in counted else '0'} AS i, {'sum(clicks)' if table in counted else '0'} AS c, "
        f"sort_array(collect_set(load_run)) AS runs FROM {T.whole_view(table)} WHERE event_hour = {at}"
        for table in T.PUBLISHED
    )

    def poll() -> dict:
        views = {r["t"]: {"rows": r["n"], "impressions": r["i"] or 0, "clicks": r["c"] or 0, "load_runs": r["runs"]}
                 for r in spark.sql(query).collect()}
        return {"at": round(time.monotonic() - started, 2), "views": views}

    with out.open("a") as lines:
        first = poll()
        lines.write(json.dumps({"ready": True}) + "\n" + json.dumps(first) + "\n")
        lines.flush()
        while not stop.exists():
            lines.write(json.dumps(poll()) + "\n")
            lines.flush()
    spark.stop()


if __name__ == "__main__":
    main()
