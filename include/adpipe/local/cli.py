"""``adpipe kafka``, ``adpipe pg`` and ``adpipe jars``: the embedded
default's servers and JVM jars."""

from __future__ import annotations

import argparse

from adpipe.settings import Settings


def cmd_kafka(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import kafka_io
    from adpipe.local import kafka_broker

    if args.action == "up":
        st = kafka_broker.up(settings)
        created = kafka_io.ensure_topics(settings.kafka_bootstrap, settings.topics.all(), settings.topic_partitions)
        print(st.describe())
        if created:
            print(f"created topics: {', '.join(created)}")
        return 0
    if args.action == "down":
        print("kafka stopped" if kafka_broker.down(settings) else "kafka was not running (nothing of ours to stop)")
        return 0
    st = kafka_broker.status(settings)
    print(st.describe())
    return 0 if st.running and st.answering else 3


def cmd_pg(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.local import postgres

    if args.action == "up":
        print(postgres.up(settings).describe())
        print(f"databases: {', '.join(postgres.DATABASES)}; e.g. {settings.pg_url('adpipe_budget')}")
        return 0
    if args.action == "down":
        print("postgres stopped" if postgres.down(settings) else "postgres was not running (nothing of ours to stop)")
        return 0
    st = postgres.status(settings)
    print(st.describe())
    return 0 if st.running and st.answering else 3


def cmd_jars(_args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.jars import ensure_classpath

    for name in ("kafka", "spark"):
        jars = ensure_classpath(settings.jar_cache, name)
        print(f"{name}: {len(jars)} jars in {settings.jar_cache / name}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "kafka",
        help="the local Kafka broker of the embedded default",
        description="Start, stop or inspect the local KRaft broker (data under $ADPIPE_HOME/kafka).",
    )
    p.add_argument(
        "action",
        choices=["up", "down", "status"],
        help="up: start (idempotent) and create the topics; down: stop the broker we started; "
        "status: exit 0 when it runs and answers",
    )
    p.set_defaults(func=cmd_kafka)

    p = sub.add_parser(
        "pg",
        help="the local PostgreSQL (Hive metastore, budget database, Airflow metadata)",
        description="Start, stop or inspect the local PostgreSQL cluster (data under $ADPIPE_HOME/postgres, "
        "port $ADPIPE_PG_PORT on loopback).",
    )
    p.add_argument("action", choices=["up", "down", "status"], help="up is idempotent and creates the databases")
    p.set_defaults(func=cmd_pg)

    p = sub.add_parser("jars", help="fetch the JVM jars into the project cache (done on first use anyway)")
    p.set_defaults(func=cmd_jars)
