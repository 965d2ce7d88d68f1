"""Training the Spark drivers' class archives (named and mapped by
adpipe.class_archive) for ``adpipe jars``: :func:`train` runs this module as
``python -m adpipe.tools.class_archive_training`` in a process of its own,
with ``-XX:ArchiveClassesAtExit``, and renames the archive into
``.cache/jvm/cds`` once that JVM has written it whole. The child runs the
workload of a layout; the JVM writes the archive as it exits, so the child
ends that JVM before it returns."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

from adpipe.class_archive import LAYOUTS, QUIET, archive_path, layout_class_path
from adpipe.settings import Settings, load_settings

log = logging.getLogger(__name__)


def train(settings: Settings, layout: str) -> Path | None:
    """Write the archive of ``layout`` (``plain`` or ``metastore``) unless it
    exists: a child process runs the workload with the dump option, and the
    file is renamed into place after that JVM ended. None when no archive
    can be made here (the reason is logged)."""
    path = archive_path(settings, layout_class_path(settings, layout))
    if path is None:
        log.warning("class archive: no JVM library found (JAVA_HOME, java on PATH); Spark starts without one")
        return None
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="adpipe-cds-") as tmp:
        partial = Path(tmp) / "archive.jsa"
        env = {
            **os.environ,
            "ADPIPE_HOME": str(Path(tmp) / "home"),
            "ADPIPE_JVM_OPTIONS": " ".join([f"-XX:ArchiveClassesAtExit={partial}", *QUIET]),
            "ADPIPE_METASTORE": "derby",  # the classpath matters, not the catalog
            "ADPIPE_SPARK_MASTER": "local[2]",  # the driver's own JVM, wherever jobs run
        }
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        cmd = [sys.executable, "-m", "adpipe.tools.class_archive_training", "--layout", layout, "--work", tmp]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)  # noqa: S603
        if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            log.warning(
                "class archive %s: not made (exit %d); Spark starts without one:\n%s",
                layout, done.returncode, (done.stdout + done.stderr)[-2000:],
            )
            return None
        shutil.move(partial, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
    return path


def _workload(settings: Settings, layout: str, work: Path) -> None:
    """What drivers do early: a session (on the Hive metastore, Derby here,
    for the metastore layout), Delta writes, reads, a MERGE and a DELETE,
    JSON, regular expressions and variants; for the plain layout (the
    stream job's) also a Python worker over Arrow, a streaming query with
    state and ``foreachBatch``, and the stream job's own query on a rate
    source. No broker is needed."""
    from pyspark.sql import functions as F

    from adpipe.spark import build_spark

    if layout == "metastore":
        from adpipe.lakehouse import tables as T
        from adpipe.lakehouse.metastore import metastore_session

        spark = metastore_session(settings, "adpipe-class-archive-metastore")
        spark.table(T.RAW).where(F.col("event_hour") == F.lit("2026-01-01 00:00:00").cast("timestamp")).count()
    else:
        spark = build_spark(settings, "adpipe-class-archive-plain")
    try:
        _delta_work(spark, work)
        if layout == "plain":
            spark.range(1000).mapInArrow(lambda batches: batches, "id long").count()
            _stream_work(spark, work)
            # The stream job's own query (its parse, transformWithStateInPandas
            # on RocksDB, foreachBatch) on a rate source: its classes, loaded
            # at a cold start's first batch, are in the archive too.
            from adpipe.stream.driver import warm_up_on_rate_source

            warm_up_on_rate_source(spark, load_settings(os.environ))
    finally:
        spark.stop()


def _delta_work(spark: SparkSession, work: Path) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    table = str(work / "delta")
    rows = spark.range(5000).select(
        F.col("id"),
        F.format_string('{"event_id":"e%d","event_time":%d}', "id", "id").alias("value"),
        F.current_timestamp().alias("ts"),
    )
    rows = rows.select(
        "*",
        F.from_json("value", "event_id string, event_time long").alias("j"),
        F.try_parse_json("value").alias("v"),
        F.col("value").rlike(r'^\{"event_id":"e[0-9]+"').alias("canonical"),
        F.date_trunc("hour", "ts").alias("hour"),
    ).select(
        "id", "value", "ts", "hour", "canonical", F.col("j.event_id").alias("event_id"),
        F.try_variant_get("v", "$.event_time", "long").alias("event_time"),
    )
    rows.write.format("delta").partitionBy("hour").save(table)
    spark.read.format("delta").load(table).groupBy("canonical").count().collect()
    merge = DeltaTable.forPath(spark, table).alias("t").merge(rows.alias("s"), "t.id = s.id")
    merge.whenNotMatchedInsertAll().execute()
    DeltaTable.forPath(spark, table).delete("id < 10")


def _stream_work(spark: SparkSession, work: Path) -> None:
    from pyspark.sql import functions as F

    source = work / "stream-in"
    source.mkdir()
    (source / "part.json").write_text('{"k": "a", "n": 1}\n{"k": "b", "n": 2}\n')
    query = (
        spark.readStream.schema("k string, n long").json(str(source))
        .groupBy("k").agg(F.sum("n").alias("n"))
        .writeStream.outputMode("update")
        .option("checkpointLocation", str(work / "stream-checkpoint"))
        .foreachBatch(lambda df, _batch_id: df.collect())
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def _child(layout: str, work: Path) -> None:
    """In the child: the workload, then the JVM's end (the dump happens as
    it exits) before this process returns."""
    from pyspark import SparkContext

    settings = load_settings(os.environ)
    _workload(settings, layout, work)
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        gateway.shutdown()
        if proc.stdin is not None:
            proc.stdin.close()  # the gateway JVM exits at the end of its stdin
        proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="train a class-data-sharing archive (adpipe jars runs this)")
    parser.add_argument("--layout", choices=LAYOUTS, required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args(argv)
    _child(args.layout, args.work)


if __name__ == "__main__":
    main()
