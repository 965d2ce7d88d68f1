"""``adpipe kafka``, ``adpipe pg``, ``adpipe spark`` and ``adpipe hdfs``:
the embedded default's servers."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import ModuleType

from adpipe.settings import Settings


def _serve(args: argparse.Namespace, settings: Settings, name: str, server: ModuleType) -> int:
    """up / down / status of one local server module (kafka_broker, postgres)."""
    if args.action == "up":
        print(server.up(settings).describe())
        return 0
    if args.action == "down":
        print(f"{name} stopped" if server.down(settings) else f"{name} was not running (nothing of ours to stop)")
        return 0
    st = server.status(settings)
    print(st.describe())
    return 0 if st.running and st.answering else 3


def cmd_kafka(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import kafka_io
    from adpipe.local import kafka_broker

    if args.action != "up":
        return _serve(args, settings, "kafka", kafka_broker)
    cluster = kafka_broker.up(settings, brokers=args.brokers, secure=args.secure or None)
    print(cluster.describe())
    # Clients must know every node: any one of them may be down when they start.
    bootstrap = cluster.bootstrap
    # Topics are made by the admin user on a secure cluster (no other may).
    admin = kafka_broker.admin_access(settings, bootstrap)
    created = kafka_io.ensure_topics(
        admin, settings.topics.all(), settings.topic_partitions, broker_time=(settings.topics.events,)
    )
    # The stream drivers' leadership topic: one partition, whatever the others have.
    created += kafka_io.ensure_topics(admin, [kafka_io.leadership_group(settings.job_id)], 1)
    if created:
        print(f"created topics: {', '.join(created)}")
    if bootstrap != settings.kafka_bootstrap:
        print(f"clients: export ADPIPE_KAFKA_BOOTSTRAP={bootstrap}")
    if cluster.secure:
        _print_secure_clients(settings)
    return 0


def _print_secure_clients(settings: Settings) -> None:
    """Who may do what, and the environment each client needs (never a
    password: where its file is)."""
    from adpipe.local import kafka_security

    print(
        f"users (SCRAM-SHA-512; passwords in {kafka_security.secrets_dir(settings)}/<user>.password, mode 0600): "
        f"{', '.join(kafka_security.USERS)}; ACLs for topics {', '.join(settings.topics.all())}, "
        f"stream job {settings.job_id}, budget group {settings.budget_group}"
    )
    print(f"clients, e.g. the stream job: {kafka_security.client_exports(settings, 'stream')}")


def cmd_pg(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.local import postgres

    rc = _serve(args, settings, "postgres", postgres)
    if args.action == "up":
        print(
            f"databases: {', '.join(postgres.DATABASES)}; e.g. {settings.pg_url('adpipe_budget', redacted=True)} "
            "(password: ADPIPE_PG_PASSWORD)"
        )
    return rc


def cmd_spark(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.local import spark_cluster

    if args.action != "up":
        return _serve(args, settings, "spark cluster", spark_cluster)
    cluster = spark_cluster.up(settings, workers=args.workers)
    print(cluster.describe())
    if settings.spark_master != cluster.master_url:
        print(f"jobs run on it with: export ADPIPE_SPARK_MASTER={cluster.master_url}")
    return 0


def cmd_hdfs(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.local import hdfs

    rc = _serve(args, settings, "hdfs", hdfs)
    if args.action == "up":
        print("the jobs keep their checkpoints and tables on it with:")
        for line in hdfs.client_exports(settings, hdfs.ports(settings)):
            print(f"  {line}")
    return rc


def _add_server_parser(
    sub: argparse._SubParsersAction, name: str, help_text: str, description: str, up_help: str, func: Callable
) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=description)
    p.add_argument(
        "action",
        choices=["up", "down", "status"],
        help=f"up: start (idempotent) and {up_help}; down: stop the server we started (never another one); "
        "status: exit 0 when it runs and answers, 3 otherwise",
    )
    p.set_defaults(func=func)
    return p


def add_parsers(sub: argparse._SubParsersAction) -> None:
    kafka = _add_server_parser(
        sub,
        "kafka",
        "the local Kafka broker (or three-broker cluster) of the embedded default",
        "Start, stop or inspect the local KRaft broker (data under $ADPIPE_HOME/kafka). With --brokers 3: "
        "three nodes, each broker and controller (a quorum of three), topics and Kafka's transaction and "
        "offsets logs with replication factor 3 and min.insync.replicas=2; node k listens on the ports of "
        "ADPIPE_KAFKA_BOOTSTRAP and ADPIPE_KAFKA_CONTROLLER_PORT plus 100*(k-1).",
        "create the topics",
        cmd_kafka,
    )
    kafka.add_argument(
        "--brokers",
        type=int,
        choices=range(1, 6),
        default=None,
        help="nodes of the local cluster (up only; default: as made before under ADPIPE_HOME, else 1)",
    )
    kafka.add_argument(
        "--secure",
        action="store_true",
        help="up only: every listener SASL_SSL (TLS from a CA made here with keytool), SCRAM-SHA-512 users "
        "admin, producer, stream, budget, reader, airflow with generated passwords in 0600 files under "
        "$ADPIPE_HOME/kafka/secrets, and ACLs: each user may do only its part's work (default: as made before "
        "under ADPIPE_HOME, else as ADPIPE_KAFKA_SECURITY says); clients then set ADPIPE_KAFKA_SECURITY=sasl_ssl "
        "and ADPIPE_KAFKA_USERNAME",
    )
    _add_server_parser(
        sub,
        "pg",
        "the local PostgreSQL (Hive metastore, budget database, Airflow metadata)",
        "Start, stop or inspect the local PostgreSQL cluster (data under $ADPIPE_HOME/postgres, "
        "port $ADPIPE_PG_PORT on loopback).",
        "create the databases",
        cmd_pg,
    )
    spark = _add_server_parser(
        sub,
        "spark",
        "a local Spark standalone cluster (a master and N workers) for the jobs to run on",
        "Start, stop or inspect a Spark standalone cluster on this machine, from the installed Spark: a "
        "master on 127.0.0.1:$ADPIPE_SPARK_MASTER_PORT (7077; web UI on $ADPIPE_SPARK_MASTER_UI_PORT, 8091) "
        "and N workers (worker k's web UI on that port + k), each offering $ADPIPE_SPARK_WORKER_CORES cores "
        "and $ADPIPE_SPARK_WORKER_MEMORY; loopback only, logs and work folders under "
        "$ADPIPE_HOME/spark-cluster. The stream job and Union & Load run on it with "
        "ADPIPE_SPARK_MASTER=spark://127.0.0.1:7077 (executor heap $ADPIPE_SPARK_EXECUTOR_MEMORY, cores per "
        "application $ADPIPE_SPARK_CORES_MAX) and a checkpoint every worker reaches (any local path here).",
        "wait until the master holds every worker ALIVE",
        cmd_spark,
    )
    spark.add_argument(
        "--workers",
        type=int,
        choices=range(1, 9),
        default=None,
        metavar="N",
        help="workers of the cluster, 1 to 8 (up only; default: as started before under ADPIPE_HOME, else 2)",
    )
    _add_server_parser(
        sub,
        "hdfs",
        "a local HDFS (a NameNode and a DataNode) for checkpoints and Delta tables",
        "Start, stop or inspect a local HDFS: Apache Hadoop's own NameNode and DataNode, run from its jars "
        "(fetched from Maven Central by `adpipe jars`), on loopback only, metadata, blocks and logs under "
        "$ADPIPE_HOME/hdfs. The NameNode listens on hdfs://127.0.0.1:$ADPIPE_HDFS_PORT (9820; its web UI on "
        "that port + 1, the DataNode on + 2 to + 4); replication 1, permissions off, formatted on the first "
        "up. The stream job and Union & Load keep their checkpoints and tables there with "
        "ADPIPE_CHECKPOINT_URI=hdfs://127.0.0.1:9820/adpipe/checkpoints and "
        "ADPIPE_WAREHOUSE_URI=hdfs://127.0.0.1:9820/adpipe/warehouse, with HADOOP_CONF_DIR=$ADPIPE_HOME/hdfs/client "
        "for the clients' 16 MB blocks (up prints all three).",
        "wait until the NameNode is out of safe mode with the DataNode live",
        cmd_hdfs,
    )
