"""``adpipe kafka``, ``adpipe pg`` and ``adpipe jars``: the embedded
default's servers and JVM jars."""

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

    rc = _serve(args, settings, "kafka", kafka_broker)
    if args.action == "up":
        created = kafka_io.ensure_topics(settings.kafka_bootstrap, settings.topics.all(), settings.topic_partitions)
        if created:
            print(f"created topics: {', '.join(created)}")
    return rc


def cmd_pg(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.local import postgres

    rc = _serve(args, settings, "postgres", postgres)
    if args.action == "up":
        print(
            f"databases: {', '.join(postgres.DATABASES)}; e.g. {settings.pg_url('adpipe_budget', redacted=True)} "
            "(password: ADPIPE_PG_PASSWORD)"
        )
    return rc


def cmd_jars(_args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.jars import ensure_classpath

    for name in ("kafka", "spark"):
        jars = ensure_classpath(settings.jar_cache, name)
        print(f"{name}: {len(jars)} jars in {settings.jar_cache / name}")
    return 0


def _add_server_parser(
    sub: argparse._SubParsersAction, name: str, help_text: str, description: str, up_help: str, func: Callable
) -> None:
    p = sub.add_parser(name, help=help_text, description=description)
    p.add_argument(
        "action",
        choices=["up", "down", "status"],
        help=f"up: start (idempotent) and {up_help}; down: stop the server we started (never another one); "
        "status: exit 0 when it runs and answers, 3 otherwise",
    )
    p.set_defaults(func=func)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    _add_server_parser(
        sub,
        "kafka",
        "the local Kafka broker of the embedded default",
        "Start, stop or inspect the local KRaft broker (data under $ADPIPE_HOME/kafka).",
        "create the topics",
        cmd_kafka,
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
    p = sub.add_parser("jars", help="fetch the JVM jars into the project cache (done on first use anyway)")
    p.set_defaults(func=cmd_jars)
