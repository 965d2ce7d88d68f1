"""The one SparkSession builder, used by jobs and by the tests' fixture."""

from __future__ import annotations

import os
import shlex

from pyspark.sql import SparkSession

from adpipe.jars import ensure_classpath
from adpipe.metastore import connection_options
from adpipe.settings import Settings


def metastore_conf(settings: Settings, jars: list) -> dict[str, str]:
    """Hive catalog options (see adpipe.metastore for the why)."""
    postgres_jar = next(str(j) for j in jars if j.name.startswith("postgresql-"))
    conf = {f"spark.hadoop.{k}": v for k, v in connection_options(settings).items()}
    conf.update(
        {
            "spark.sql.catalogImplementation": "hive",
            # Small hourly tables on a few cores: Delta's default of 50
            # partitions for rebuilding a table snapshot is pure overhead.
            "spark.databricks.delta.snapshotPartitions": "2",
            # adpipe.metastore.ensure_schema creates the schema up front.
            "spark.hadoop.datanucleus.schema.autoCreateAll": "false",
            "spark.hadoop.hive.metastore.schema.verification": "false",
            # The metastore client loads the JDBC driver from the JVM's own
            # classpath, not from spark.jars.
            "spark.driver.extraClassPath": postgres_jar,
        }
    )
    return conf


def spark_conf(settings: Settings, app_name: str, with_metastore: bool = False) -> dict[str, str]:
    """Every Spark setting adpipe relies on, in one place."""
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
        # Delta retries its own commits; ours retry whole MERGEs (adpipe.load).
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
    }
    if with_metastore:
        conf.update(metastore_conf(settings, jars))
    return conf


def build_spark(settings: Settings, app_name: str = "adpipe", with_metastore: bool = False) -> SparkSession:
    """The session of a job; ``with_metastore`` for jobs that use the ``ads``
    tables (the stream job does not, so it never waits on the metastore)."""
    settings.home.mkdir(parents=True, exist_ok=True)
    builder = SparkSession.builder
    for key, value in spark_conf(settings, app_name, with_metastore).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("ADPIPE_SPARK_LOG_LEVEL", "WARN"))
    return spark
