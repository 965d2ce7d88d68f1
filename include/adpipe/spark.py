"""The one SparkSession builder, used by jobs and by the tests' fixture."""

from __future__ import annotations

import os
import shlex
import sys

from pyspark.sql import SparkSession

from adpipe.jars import ensure_classpath
from adpipe.settings import Settings


def spark_conf(settings: Settings, app_name: str, extra_conf: dict[str, str] | None = None) -> dict[str, str]:
    """Every Spark setting adpipe relies on, in one place; ``extra_conf`` is a
    part's own (the lakehouse's Hive catalog, adpipe.lakehouse.metastore)."""
    jars = ensure_classpath(settings.jar_cache, "spark")
    conf = {
        "spark.app.name": app_name,
        "spark.master": settings.spark_master,
        "spark.jars": ",".join(str(j) for j in jars),
        # Fixed for the life of a checkpoint (Spark refuses a change).
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": os.environ.get("ADPIPE_SPARK_DRIVER_MEMORY", "2g"),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.warehouse.dir": str(settings.warehouse_dir),
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.adaptive.enabled": "false",
        # Only where pyspark launches the JVM (not under spark-submit).
        "spark.driver.extraJavaOptions": shlex.join(
            [f"-Dderby.system.home={settings.home / 'derby'}", *settings.jvm_options]
        ),
        # Delta retries its own commits; ours retry whole MERGEs (adpipe.lakehouse.load).
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
    }
    conf.update(extra_conf or {})
    return conf


def build_spark(settings: Settings, app_name: str = "adpipe", extra_conf: dict[str, str] | None = None) -> SparkSession:
    """The session of a job, with a part's ``extra_conf`` on top (see
    :func:`spark_conf`)."""
    settings.home.mkdir(parents=True, exist_ok=True)
    # Python workers (the stream job's stateful operator) run this
    # environment's interpreter, which has adpipe, pandas and pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in spark_conf(settings, app_name, extra_conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("ADPIPE_SPARK_LOG_LEVEL", "WARN"))
    return spark
