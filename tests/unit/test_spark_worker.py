"""Spark's Python workers fork from adpipe's daemon (adpipe.spark_worker):
pyspark from the installed package, the libraries and a job's modules
imported before the fork."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyspark
from adpipe.spark_worker import installed_pyspark_first, preload
from pyspark.sql import SparkSession

INSTALLED = Path(pyspark.__file__).parent
SITE = str(INSTALLED.parent)


def test_the_installed_pysparks_own_zips_go_last_another_sparks_stay_first() -> None:
    lib = INSTALLED / "python" / "lib"
    own = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    assert installed_pyspark_first([*own, "/work/include", SITE]) == ["/work/include", SITE, *own]
    other = ["/opt/spark/python/lib/pyspark.zip", "/opt/spark/python/lib/py4j-0.10.9.9-src.zip"]
    assert installed_pyspark_first([*other, SITE]) == [*other, SITE]
    # No pyspark outside the zips: the path as it was.
    assert installed_pyspark_first([*own, "/nowhere"]) == [*own, "/nowhere"]


def test_preload_names_what_it_could_not_import() -> None:
    assert preload("json, adpipe.no_such_module,") == ["adpipe.no_such_module"]
    assert "pyarrow.compute" in sys.modules


def _worker_facts(batches):  # noqa: ANN001, ANN202 - runs in a Spark Python worker
    import sys

    import pyarrow as pa
    import pyspark

    main = sys.modules["__main__"]
    facts = {
        "daemon": getattr(main.__spec__, "name", None),
        "pyspark": pyspark.__file__,
        "preloaded": "adpipe.stream.minute_state" in sys.modules,
    }
    for _ in batches:
        yield pa.RecordBatch.from_pydict({"facts": [json.dumps(facts)]})


def test_a_python_worker_forks_from_adpipes_daemon_with_the_jobs_modules_loaded(spark: SparkSession) -> None:
    # The unit tests' session preloads the stateful operator's module (conftest).
    rows = spark.range(2, numPartitions=2).mapInArrow(_worker_facts, "facts string").collect()
    facts = [json.loads(row.facts) for row in rows]
    assert facts and all(f["daemon"] == "adpipe.spark_worker" for f in facts)
    assert all(Path(f["pyspark"]).parent == INSTALLED for f in facts)  # not pyspark.zip/pyspark
    assert all(f["preloaded"] for f in facts)
