"""The lakehouse: the hourly Union & Load into Delta tables registered in
the Hive metastore, and the Great Expectations gate on them.

* :mod:`~adpipe.lakehouse.load` - Union & Load, every region: stage, audit,
  publish.
* :mod:`~adpipe.lakehouse.repair` - an hour rebuilt from Kafka, shown in
  one step; a held hour's staged rows discarded.
* :mod:`~adpipe.lakehouse.revisions` - each window's latest revision.
* :mod:`~adpipe.lakehouse.ranges` - which Kafka offsets a load reads, when an
  hour is closed, what Kafka can still prove of an hour.
* :mod:`~adpipe.lakehouse.tables` - the ``ads`` tables' names, schemas, keys.
* :mod:`~adpipe.lakehouse.metastore` - the Hive metastore and the Spark
  session on it.
* :mod:`~adpipe.lakehouse.quality` - the Great Expectations checks of an hour.
* :mod:`~adpipe.lakehouse.maintenance` - OPTIMIZE and VACUUM of the tables.
* :mod:`~adpipe.lakehouse.cli` - ``adpipe load``, ``adpipe validate`` and
  ``adpipe maintain``.

Union & Load is hourly by design (Uber's is a streaming job): the aggregates
are already exactly-once in Kafka, and an idempotent hourly load is simple to
rerun and backfill.

May import: the shared modules of ``adpipe`` (settings, schemas, raw_events,
kafka_io, spark, jars, pg); no other part."""
