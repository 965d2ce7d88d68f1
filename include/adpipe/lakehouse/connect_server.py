"""The load's Spark Connect server: one warm Spark session on the metastore
for the load's verbs of every host.

``adpipe connect serve`` builds the session a load would build for itself
(adpipe.spark's settings, the Hive metastore, Delta), puts the ``ads``
tables in place and serves it over Spark Connect until SIGTERM, at this
host's address among ``ADPIPE_SPARK_CONNECT``'s servers. A process with
``ADPIPE_SPARK_CONNECT`` set (``adpipe load``, ``validate``, ``maintain``,
``verify --hour``, the load DAG's steps on any worker) sends its plans to
the first of those servers that answers instead of starting a JVM: no
Spark start per step, and no file or port of one host between the steps.
What coordinates two loads stays where it is, whichever servers run them:
the load lock and the ledger in PostgreSQL, and the Delta tables
(adpipe.lakehouse.ledger).

Each server is kept up by its host's service manager (a compose service,
a systemd unit), or by its clients: with ``ADPIPE_LOAD_WARM=on`` a client
that finds none answering starts its own host's
(:func:`adpipe.lakehouse.connect_client.ensure_server`), as it would start
a warm load driver. Two or more on different hosts keep
the loads going when one host dies: its clients' next session is the next
server's, or one they start on their own host. A server that dies leaves
nothing behind: the verbs it ran fail as a killed load does, and the next
one recovers."""

from __future__ import annotations

import logging
import signal
import threading
import time

from adpipe.settings import Settings

log = logging.getLogger(__name__)

APP_NAME = "adpipe-connect"
def serve(settings: Settings, stop: threading.Event | None = None) -> int:
    """Run the server until SIGTERM or SIGINT (or ``stop``); 1 when its
    Spark session ends under it."""
    from adpipe.lakehouse.metastore import ensure_schema, ensure_tables, init_lock, metastore_conf
    from adpipe.spark import answers, build_spark, connect_address, connect_server_conf, start_connect_service

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    host, port = connect_address(settings)
    if answers(host, port):
        log.error("something already listens on %s:%d: another Spark Connect server?", host, port)
        return 4
    ensure_schema(settings)
    started = time.monotonic()
    spark = build_spark(settings, APP_NAME, {**metastore_conf(settings), **connect_server_conf(settings)})
    with init_lock(settings):
        ensure_tables(spark)
    start_connect_service(spark)  # clients only once the tables are in place
    log.info("Spark Connect server on sc://%s:%d, ready in %.1f s (master %s, warehouse %s)",
             host, port, time.monotonic() - started, settings.spark_master, settings.warehouse_uri)
    jsc = spark.sparkContext._jsc  # noqa: SLF001 - the JVM's liveness
    try:
        while not stop.wait(1.0):
            if jsc.sc().isStopped():
                log.error("the server's Spark session has stopped: exiting")
                return 1
    finally:
        log.info("Spark Connect server on sc://%s:%d stopping", host, port)
        spark.stop()
    return 0
