"""The Hive metastore the ``ads`` tables are registered in.

Default: a metastore database in the local PostgreSQL, shared by every Spark
application at once (each JVM runs its own metastore client against it).
Fallback (``ADPIPE_METASTORE=derby``): Spark's embedded Derby, one JVM at a
time.

The PostgreSQL schema is created once, up front, by DataNucleus' SchemaTool
from the metastore's own JDO mapping (``package.jdo`` in the hive-metastore
jar pyspark ships). Letting DataNucleus create tables lazily instead
deadlocks: the first CREATE TABLE holds row locks in one connection while
the lazily created privilege table's foreign keys wait for them in another."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from adpipe import class_archive
from adpipe.jars import postgres_jdbc_jar, pyspark_jars
from adpipe.lakehouse import tables as T
from adpipe.lakehouse.merge import insert_absent, merge_sql
from adpipe.pg import connect, ensure_databases
from adpipe.settings import Settings
from adpipe.spark import build_spark, connect_session

log = logging.getLogger(__name__)

_INIT_LOCK = "SELECT pg_advisory_lock(hashtext('adpipe-metastore-init'))"
_INIT_UNLOCK = "SELECT pg_advisory_unlock(hashtext('adpipe-metastore-init'))"


class MetastoreError(RuntimeError):
    """The metastore schema could not be created."""


def _schema_exists(cur) -> bool:  # noqa: ANN001 - psycopg2 cursor
    cur.execute("SELECT to_regclass('public.\"DBS\"') IS NOT NULL AND to_regclass('public.\"TBL_PRIVS\"') IS NOT NULL")
    return bool(cur.fetchone()[0])


def connection_options(settings: Settings) -> dict[str, str]:
    """JDO connection options of the configured metastore database."""
    if settings.metastore == "derby":
        return {
            "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={settings.home / 'metastore_db'};create=true",
            "javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
            "javax.jdo.option.ConnectionUserName": "APP",
            "javax.jdo.option.ConnectionPassword": "mine",
        }
    return {
        "javax.jdo.option.ConnectionURL": settings.jdbc_url(settings.metastore_database),
        "javax.jdo.option.ConnectionDriverName": "org.postgresql.Driver",
        "javax.jdo.option.ConnectionUserName": settings.pg_user,
        "javax.jdo.option.ConnectionPassword": settings.pg_password,
    }


def metastore_conf(settings: Settings) -> dict[str, str]:
    """Spark's Hive catalog on the configured metastore database."""
    conf = {f"spark.hadoop.{k}": v for k, v in connection_options(settings).items()}
    conf.update(
        {
            "spark.sql.catalogImplementation": "hive",
            # Small hourly tables on a few cores: Delta's default of 50
            # partitions for rebuilding a table snapshot is pure overhead.
            "spark.databricks.delta.snapshotPartitions": "2",
            # ensure_schema creates the schema up front.
            "spark.hadoop.datanucleus.schema.autoCreateAll": "false",
            "spark.hadoop.hive.metastore.schema.verification": "false",
            # The metastore client loads the JDBC driver from the JVM's own
            # classpath, not from spark.jars.
            "spark.driver.extraClassPath": driver_class_path(settings),
        }
    )
    return conf


def driver_class_path(settings: Settings) -> str:
    """What a metastore driver's classpath starts with: the PostgreSQL JDBC
    driver (one place names it, for the driver and for its class archive)."""
    return class_archive.layout_class_path(settings, "metastore")


def _create_schema(settings: Settings) -> None:
    jars = pyspark_jars()
    metastore_jar = next(jars.glob("hive-metastore-*.jar"), None)
    if metastore_jar is None:
        raise MetastoreError(f"no hive-metastore jar in {jars}: is this pyspark's own Spark?")
    postgres_jar = postgres_jdbc_jar(settings.jar_cache)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(metastore_jar) as jar:
            jar.extract("package.jdo", tmp)
        props = Path(tmp) / "datanucleus.properties"
        # The identifier and value strategies Hive's ObjectStore uses.
        props.write_text(
            "\n".join(
                [
                    *(f"{k}={v}" for k, v in connection_options(settings).items()),
                    "datanucleus.storeManagerType=rdbms",
                    "datanucleus.identifierFactory=datanucleus1",
                    "datanucleus.rdbms.useLegacyNativeValueStrategy=true",
                    "",
                ]
            )
        )
        cmd = [
            "java",
            *settings.jvm_options,
            "-cp",
            os.pathsep.join([str(jars / "*"), str(postgres_jar)]),
            "org.datanucleus.store.schema.SchemaTool",
            "-create",
            "-api",
            "JDO",
            "-props",
            str(props),
            str(Path(tmp) / "package.jdo"),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
    if proc.returncode != 0 or "completed successfully" not in proc.stdout:
        raise MetastoreError(f"creating the metastore schema failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


@contextmanager
def init_lock(settings: Settings) -> Iterator[Any]:
    """Serialise first-time set-up across processes: a PostgreSQL advisory
    lock (a no-op with Derby, which admits one JVM anyway). Yields a cursor
    on the metastore database, or None."""
    if settings.metastore == "derby":
        yield None
        return
    ensure_databases(settings, (settings.metastore_database,))
    conn = connect(settings, settings.metastore_database)
    try:
        with conn.cursor() as cur:
            cur.execute(_INIT_LOCK)
            try:
                yield cur
            finally:
                cur.execute(_INIT_UNLOCK)
    finally:
        conn.close()


def ensure_schema(settings: Settings) -> bool:
    """Create the metastore schema unless it is there; safe to call from
    several processes at once. Returns True when this call created it."""
    if settings.metastore == "derby":
        marker = settings.home / "metastore_db" / "adpipe-schema.created"
        if marker.exists():
            return False
        settings.home.mkdir(parents=True, exist_ok=True)
        _create_schema(settings)
        marker.write_text("created by adpipe.metastore\n")
        return True
    with init_lock(settings) as cur:
        if _schema_exists(cur):
            return False
        log.info("creating the Hive metastore schema in PostgreSQL database %s", settings.metastore_database)
        _create_schema(settings)
        return True


def ensure_tables(spark: SparkSession) -> None:
    """The ``ads`` and ``ads_staging`` databases, the Delta tables, the loads'
    ledger, the late-corrections, cross-region and whole-hour views, if missing; a column the code's
    schema has and an existing table lacks (a table of an older version) is
    added. Callers hold the init lock: two applications creating the same
    Delta table at once conflict (Delta's ProtocolChangedException on an
    empty directory).

    Aggregates of a version before revisions (no ``revision`` column) are
    migrated in place: their rows, each a window's revision 0, are copied
    into the revisions table (insert-if-absent), and only then is the column
    added and set to 0, so a migration cut short is done again at the next
    start."""
    present: set[str] = set()
    for database in (T.DATABASE, T.STAGING_DATABASE):
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
        # From the metastore alone: creating a table that exists still
        # plans a Delta command per table (seconds at every start).
        present |= {f"{database}.{r['tableName']}".lower() for r in spark.sql(f"SHOW TABLES IN {database}").collect()}
    wanted = [(name, schema, "event_hour", {}) for name, schema in T.PUBLISHED.items()]
    # The staging twins keep no column statistics: only the loads read them,
    # by hour (the partition), and collecting them cost a million staged raw
    # rows 1.2 s of CPU.
    wanted += [(T.staged(name), schema, "event_hour", {"delta.dataSkippingNumIndexedCols": "0"})
               for name, (schema, _keys) in T.TABLES.items()]
    wanted.append((T.LOAD_RUNS, T.LOAD_RUNS_SCHEMA, None, {}))
    unrevised = [
        name for name in (T.AGGREGATES, T.staged(T.AGGREGATES))
        if name.lower() in present and "revision" not in {c.lower() for c in spark.table(name).columns}
    ]
    for name, schema, partition, properties in wanted:
        if name.lower() not in present:
            create = create_table_sql(name, schema.toDDL(), partition, properties)
            try:
                spark.sql(create)
            except Exception as exc:
                if "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION" not in str(exc) or not _clear_unregistered(spark, name):
                    raise
                spark.sql(create)
        if name not in unrevised:
            _add_missing_columns(spark, name, schema)
    if T.AGGREGATES in unrevised:
        _copy_into_revisions(spark)
    for name in unrevised:
        _add_missing_columns(spark, name, T.AGGREGATES_SCHEMA)
        spark.sql(f"UPDATE {name} SET revision = 0 WHERE revision IS NULL")  # noqa: S608 - our table names
    spark.sql(T.LATE_CORRECTIONS_SQL)
    spark.sql(T.CROSS_REGION_SQL)
    for name in T.PUBLISHED:
        spark.sql(T.whole_view_sql(name))


def create_table_sql(name: str, columns: str, partition: str | None, properties: dict[str, str]) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of a Delta table: ``columns`` in DDL
    (a schema's ``toDDL()``), partitioned by ``partition``, with table
    ``properties``. SQL, not delta-spark's builder: a Spark Connect session
    runs it as a local one does."""
    sql = f"CREATE TABLE IF NOT EXISTS {name} ({columns}) USING delta"
    if partition:
        sql += f" PARTITIONED BY ({partition})"
    if properties:
        sql += " TBLPROPERTIES (" + ", ".join(f"'{k}' = '{v}'" for k, v in properties.items()) + ")"
    return sql


def _copy_into_revisions(spark: SparkSession) -> None:
    """The rows of an aggregates table of a version before revisions (each
    its window's revision 0) into the revisions table, if absent."""
    names = [f.name for f in T.REVISIONS_SCHEMA.fields if f.name != "revision"]
    rows = spark.table(T.AGGREGATES).select(*names, F.lit(0).cast("long").alias("revision"))
    log.info("%s: copying the rows of a version before revisions into %s", T.AGGREGATES, T.REVISIONS)
    condition = "t.record_uuid = s.record_uuid AND t.event_hour = s.event_hour"
    spark.sql(merge_sql(T.REVISIONS, condition, insert_absent(rows.columns)), source=rows)


def _clear_unregistered(spark: SparkSession, name: str) -> bool:
    """A process killed while it created table ``name`` can leave its
    folder with the create commit begun and no metastore entry; every later
    start then fails to create it. Such a folder holds no data (no file
    outside ``_delta_log``, no commit past the create): it is removed, and
    True returned. Anything else is left alone (False). A local warehouse is
    read from the disk; any other (``hdfs://``, ``s3a://``) through Spark's
    Hadoop FileSystem."""
    from urllib.parse import urlparse

    warehouse = spark.conf.get("spark.sql.warehouse.dir") or ""
    database, table = name.split(".", 1)
    if urlparse(warehouse).scheme in ("", "file"):
        folder = Path(urlparse(warehouse).path) / f"{database}.db" / table
        if not folder.is_dir() or not only_a_begun_create(
            [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
        ):
            return False
        import shutil

        shutil.rmtree(folder)
    else:
        jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j gateway
        remote = jvm.org.apache.hadoop.fs.Path(f"{warehouse.rstrip('/')}/{database}.db/{table}")
        fs = remote.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # noqa: SLF001
        if not fs.isDirectory(remote):
            return False
        root, files, found = fs.makeQualified(remote).toUri().getPath().rstrip("/"), fs.listFiles(remote, True), []
        while files.hasNext():
            found.append(files.next().getPath().toUri().getPath().removeprefix(root + "/"))
        if not only_a_begun_create(found):
            return False
        fs.delete(remote, True)
    log.warning("%s: its folder under %s holds a create that never finished (no data, no metastore entry): removed",
                name, warehouse)
    return True


def only_a_begun_create(files: list[str]) -> bool:
    """Whether a table folder's files (paths relative to it) are those of a
    Delta create that never finished: nothing outside ``_delta_log`` and no
    commit past version 0."""
    for relative in files:
        parts = relative.split("/")
        if "_delta_log" not in parts:
            return False
        stem, _, suffix = parts[-1].partition(".")
        if parts[:-1] == ["_delta_log"] and suffix == "json" and stem.isdigit() and int(stem) > 0:
            return False
    return True


def _add_missing_columns(spark: SparkSession, name: str, schema: StructType) -> None:
    have = {c.lower() for c in spark.table(name).columns}
    missing = [f for f in schema.fields if f.name.lower() not in have]
    if missing:
        columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in missing)
        log.info("%s: adding the columns this version writes: %s", name, columns)
        spark.sql(f"ALTER TABLE {name} ADD COLUMNS ({columns})")


def metastore_session(settings: Settings, app_name: str) -> SparkSession:
    """A Spark session on the metastore, with the ``ads`` tables in place:
    this process's own, or one of the load's Spark Connect servers
    (``ADPIPE_SPARK_CONNECT``, whose start put the tables in place; with
    ``ADPIPE_LOAD_WARM=on`` this host's is started when none answers)."""
    if settings.spark_connect:
        if settings.load_warm == "on":
            from adpipe.lakehouse.connect_client import ensure_server

            ensure_server(settings)
        return connect_session(settings)
    ensure_schema(settings)
    spark = build_spark(settings, app_name, metastore_conf(settings))
    with init_lock(settings):
        ensure_tables(spark)
    return spark
