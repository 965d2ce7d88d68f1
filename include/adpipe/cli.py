"""The ``adpipe`` command line (also ``python -m adpipe``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from adpipe.settings import Settings, SettingsError, load_settings

log = logging.getLogger("adpipe")


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("py4j", "py4j.clientserver", "py4j.java_gateway", "great_expectations"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def cmd_kafka(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import kafka_broker, kafka_io

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
    from adpipe import postgres

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


def cmd_produce(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import kafka_io, produce

    spec = produce.ProduceSpec(
        events=args.events,
        seed=args.seed,
        ads=args.ads,
        ad_offset=args.ad_offset,
        campaigns=args.campaigns,
        minutes=args.minutes,
        start=produce.parse_start(args.start),
        click_rate=args.click_rate,
        duplicate_rate=args.duplicate_rate,
        late_rate=args.late_rate,
        late_by_minutes=args.late_by_minutes,
        malformed_rate=args.malformed_rate,
        events_per_second=args.rate,
    )
    kafka_io.ensure_topics(settings.kafka_bootstrap, settings.topics.all(), settings.topic_partitions)
    the_plan = produce.plan(spec)
    sent = produce.send(settings.kafka_bootstrap, settings.topics.events, the_plan, spec.events_per_second)
    summary_path = (
        Path(args.summary)
        if args.summary
        else (settings.home / "produce" / f"summary-seed{spec.seed}-{spec.start:%Y%m%dT%H%M}.json")
    )
    produce.write_summary(the_plan.summary, summary_path)
    s = the_plan.summary
    print(
        f"sent {sent} messages to {settings.topics.events}: {s['distinct_on_time']} distinct on-time events, "
        f"{s['duplicates']} duplicates, {s['late']} late, {s['malformed']} malformed; summary: {summary_path}"
    )
    return 0


def cmd_stream(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import stream
    from adpipe.faults import FaultPlan
    from adpipe.tx_sink import LedgerMismatchError, ProducerFencedError

    if args.max_offsets_per_trigger is not None:
        settings = settings.with_overrides(max_offsets_per_trigger=args.max_offsets_per_trigger)
    try:
        stream.run(settings, available_now=args.available_now, fault=FaultPlan.from_env())
    except (ProducerFencedError, LedgerMismatchError) as exc:
        log.error("%s", exc)
        return 4
    return 0


def cmd_load(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import load
    from adpipe.metastore import metastore_session

    hours = load.hours_between(load.parse_hour(args.hour), load.parse_hour(args.to_hour) if args.to_hour else None)
    _ensure_local_metastore(settings)
    spark = None
    for hour in hours:
        if not args.allow_open and not load.hour_closed(settings, hour):
            log.error(
                "hour %s is not closed yet: a region's stream watermark has not passed %s. Wait, or pass "
                "--allow-open to load what is there (its windows may be incomplete).",
                load.hour_label(hour), load.hour_label(hour + load.ONE_HOUR),
            )
            return 2
        spark = spark or metastore_session(settings, "adpipe-load")
        result = load.load_hour(settings, hour, spark)
        print(result.describe())
    return 0


def cmd_validate(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import load, quality

    _ensure_local_metastore(settings)
    result = quality.validate_hour(settings, load.parse_hour(args.hour))
    print(result.describe())
    return 0 if result.success else 1


def _ensure_local_metastore(settings: Settings) -> None:
    """The embedded default: start the local PostgreSQL the metastore lives in."""
    from adpipe import postgres

    if settings.metastore == "postgres" and postgres.is_local(settings):
        if not postgres.answering(settings, 1):
            postgres.up(settings)


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import stream, verify

    report = verify.reconcile(settings, stream.ledger_group(settings))
    if args.hour:
        from adpipe import load, table_verify

        _ensure_local_metastore(settings)
        tables = table_verify.check_hour(settings, load.parse_hour(args.hour))
        report["tables"] = tables
        report["ok"] = report["ok"] and tables["ok"]
    text = json.dumps(report, indent=2)
    print(text)
    if args.report:
        Path(args.report).write_text(text + "\n")
    return 0 if report["ok"] else 1


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import bench

    print(json.dumps(bench.run(settings, events=args.events), indent=2))
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import demo

    return demo.run(settings, events=args.events, seed=args.seed)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adpipe",
        description="Exactly-once ad event counting on Kafka and Spark. Configuration comes from ADPIPE_* "
        "environment variables (ADPIPE_KAFKA_BOOTSTRAP, ADPIPE_SPARK_MASTER, ADPIPE_HOME, ADPIPE_BUDGET_DB, ...).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

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

    p = sub.add_parser(
        "produce",
        help="send synthetic raw ad events",
        description="Seeded, reproducible raw events through an idempotent producer; writes a "
        "JSON summary of what was sent (distinct events per ad, minute and type; late and malformed).",
    )
    p.add_argument("--events", type=int, required=True, help="distinct on-time events")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ads", type=int, default=20)
    p.add_argument("--ad-offset", type=int, default=0, help="first ad number (disjoint ads per region)")
    p.add_argument("--campaigns", type=int, default=5)
    p.add_argument("--minutes", type=int, default=5, help="minutes of event time the events span")
    p.add_argument(
        "--start", default="2026-11-22T12:00:00Z", help="event time of the first minute (ISO-8601 with zone)"
    )
    p.add_argument("--click-rate", type=float, default=0.1)
    p.add_argument("--duplicate-rate", type=float, default=0.0, help="fraction re-sent with the same event_id")
    p.add_argument(
        "--late-rate",
        type=float,
        default=0.0,
        help="fraction of extra events timed 2 to 2+--late-by-minutes minutes before --start, sent last "
        "(late for a stream that has already processed events up to --start)",
    )
    p.add_argument("--late-by-minutes", type=int, default=5)
    p.add_argument("--malformed-rate", type=float, default=0.0)
    p.add_argument("--rate", type=float, default=0.0, help="messages per second (0: as fast as possible)")
    p.add_argument("--summary", help="where to write the summary JSON")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser(
        "stream",
        help="the aggregation stream job",
        description="Spark Structured Streaming from the raw topic to one-minute aggregates, "
        "written to Kafka transactionally. Stops cleanly on SIGTERM.",
    )
    p.add_argument("--available-now", action="store_true", help="process what is in the topic now, then stop")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None, help="cap on records per micro-batch")
    p.set_defaults(func=cmd_stream)

    p = sub.add_parser(
        "load",
        help="Union & Load of one hour (or a range) into the ads Delta tables",
        description="Reads every region's aggregates (read_committed), raw events, late and DLQ records, "
        "unions them, dedupes by record_uuid / event_id, and MERGEs (insert-if-absent) into "
        "ads.ad_minute_aggregates, ads.ad_events_raw and ads.ad_events_quarantine. Idempotent: a rerun "
        "changes nothing. Regions: ADPIPE_REGIONS (default: this job's own topics).",
    )
    p.add_argument("--hour", required=True, help="UTC hour YYYY-MM-DDTHH (the first hour with --to-hour)")
    p.add_argument("--to-hour", help="load every hour from --hour to this one, inclusive (a backfill)")
    p.add_argument(
        "--allow-open", action="store_true", help="load even if the stream's watermark has not closed the hour"
    )
    p.set_defaults(func=cmd_load)

    from adpipe.budget_cli import add_budget_parser

    add_budget_parser(sub)

    p = sub.add_parser(
        "validate",
        help="Great Expectations checks of one loaded hour (the exactly-once proof); exit 1 on a failed one",
        description="Runs the GE checkpoints on the hour's rows of the ads tables: unique record_uuid and "
        "(ad_id, window_start), aligned windows, non-negative counts, and the reconciliation of aggregates "
        "with the distinct raw events minus the late ones. Results and Data Docs under $ADPIPE_HOME/gx.",
    )
    p.add_argument("--hour", required=True, help="UTC hour YYYY-MM-DDTHH")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "verify",
        help="reconcile raw events and aggregates; exit 0 only when exactly-once holds",
        description="Recomputes expected aggregates from the raw topic independently and compares "
        "them with the read_committed output, the late topic and the DLQ. Prints a JSON report.",
    )
    p.add_argument(
        "--hour",
        help="also check the ads Delta tables for this UTC hour (YYYY-MM-DDTHH) against Kafka, for every "
        "region in ADPIPE_REGIONS",
    )
    p.add_argument("--report", help="also write the JSON report to this file")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser(
        "bench",
        help="time each stage (produce, stream, budget, load, rerun, validate) for N events",
        description="Runs every stage as the real command on fresh topics and prints the seconds each took "
        "(also kept under $ADPIPE_HOME/bench/). Speed targets live here, not in the tests.",
    )
    p.add_argument("--events", type=int, default=20_000)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "demo",
        help="the whole pipeline end to end with a crash injected",
        description="Starts the broker, produces events, runs the stream job, SIGKILLs it "
        "mid-transaction, restarts it, and prints the verify report.",
    )
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--seed", type=int, default=42)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        settings = load_settings()
    except SettingsError as exc:
        parser.error(str(exc))
    try:
        return args.func(args, settings)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - one clear line, details at debug level
        log.debug("failure", exc_info=True)
        log.error("%s: %s", type(exc).__name__, exc)
        return 1
