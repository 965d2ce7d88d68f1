"""``adpipe produce``, ``verify``, ``demo``, ``chaos`` and ``status``: the
tools around the pipeline; and ``adpipe jars``, the install step that
fetches the JVM jars and trains the drivers' class archives."""

from __future__ import annotations

import argparse
import functools
import json
import logging
from pathlib import Path

from adpipe.lakehouse.cli import EXIT_PAST_RETENTION
from adpipe.settings import Settings

log = logging.getLogger("adpipe.tools")


def cmd_produce(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import kafka_io
    from adpipe.tools import produce

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
        revise_rate=args.revise_rate,
        malformed_rate=args.malformed_rate,
        events_per_second=args.rate,
    )
    kafka_io.ensure_pipeline_topics(settings)
    the_plan = produce.plan(spec)
    sent = produce.send(settings.kafka, settings.topics.events, the_plan, spec.events_per_second)
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


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import kafka_io
    from adpipe.tools import verify

    if (args.tables_only or args.candidate_of_run is not None) and not args.hour:
        log.error("--tables-only and --candidate-of-run check the tables of one hour: give --hour")
        return 2
    report: dict = (
        {"ok": True} if args.tables_only else verify.reconcile(settings, kafka_io.ledger_group(settings.job_id))
    )
    kafka_ok = report["ok"]
    tables: dict = {}
    if args.hour:
        from adpipe.lakehouse import load
        from adpipe.local import postgres
        from adpipe.tools import table_verify

        postgres.serve_metastore(settings)
        tables = table_verify.check_hour(settings, load.parse_hour(args.hour), staged_through=args.candidate_of_run)
        report["tables"] = tables
        report["ok"] = kafka_ok and tables["ok"]
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.report:
        Path(args.report).write_text(text + "\n")
    if report["ok"]:
        return 0
    if kafka_ok and tables.get("verdict") == PAST_RETENTION:
        # Neither holds nor broken: nothing of the hour was loaded, and Kafka deleted its records.
        log.warning("verify --hour %s: %s", tables["hour"], tables["past_retention_report"])
        return EXIT_PAST_RETENTION
    return 1


# ``adpipe verify --hour H``: the hour is past Kafka's retention and nothing
# of it was ever loaded (adpipe.lakehouse.retention): exactly-once neither
# holds (exit 0) nor is broken (exit 1); it exits EXIT_PAST_RETENTION:
# nobody can check the hour any more.
PAST_RETENTION = "past_retention"


def cmd_jars(_args: argparse.Namespace, settings: Settings) -> int:
    from adpipe import class_archive
    from adpipe.jars import adpipe_spark_jar, ensure_classpath
    from adpipe.spark import in_threads
    from adpipe.tools import class_archive_training

    for name in ("kafka", "spark", "hdfs"):
        jars = ensure_classpath(settings.jar_cache, name)
        print(f"{name}: {len(jars)} jars in {settings.jar_cache / name}")
    print(f"adpipe's own Spark functions: {adpipe_spark_jar(settings.jar_cache)}")
    if class_archive.missing(settings):
        print("training the Spark drivers' class archives (once; a minute or two)", flush=True)
    trained = in_threads({layout: functools.partial(class_archive_training.train, settings, layout)
                          for layout in class_archive.LAYOUTS})
    for layout, archive in trained.items():
        print(f"class archive ({layout} Spark driver): "
              f"{archive if archive is not None else 'none (see the warning above); Spark starts without one'}")
    for stale in class_archive.prune(settings):
        print(f"removed the class archive of another JVM or classpath: {stale}")
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.tools import demo

    return demo.run(settings, events=args.events, seed=args.seed, verbose=args.verbose)


def cmd_chaos(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.tools import chaos

    try:
        spec = chaos.ChaosSpec(
            events=args.events,
            rate=args.rate,
            duration_s=args.duration,
            seed=args.seed,
            fault_interval_s=args.fault_interval,
            ads=args.ads,
            load_interval_s=args.load_interval,
            hosts=args.hosts,
        )
    except ValueError as exc:
        raise SystemExit(f"adpipe chaos: {exc}") from exc
    return chaos.run(settings, spec)


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.tools import status

    components = status.collect(settings)
    if args.json:
        print(json.dumps(status.report(settings, components), indent=2))
    else:
        print(status.home_line(settings))
        print(status.format_table(components))
    return 0


def add_jars_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jars", help="fetch the JVM jars into the project cache (done on first use anyway)")
    p.set_defaults(func=cmd_jars)


def add_status_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="what of the local set-up is up, with addresses and log files",
        description="One row per part of the local set-up: the Kafka broker, PostgreSQL, the stream job (its last "
        "committed batch from the checkpoint, its lag: raw records not yet committed by its transactions), the "
        "budget service (its consumer group's members on this cluster, its lag), the Spark standalone cluster and "
        "Airflow; each up, degraded (runs, but does not answer or is stalled), down, or unknown (cannot be told), "
        "with its address and log files. Only reads: starts, creates and locks nothing, works before ADPIPE_HOME "
        "exists, and every probe has a timeout of a few seconds. Exit 0 whenever it could report, whatever the "
        "states (read them from --json to act on them).",
    )
    p.add_argument("--json", action="store_true", help="JSON instead of a table (every log file, and the numbers)")
    p.set_defaults(func=cmd_status)


def add_chaos_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chaos",
        help="the whole pipeline under random faults, then an independent check (exit 0: nothing lost or doubled)",
        description="Runs the stream job, two budget service instances and hourly loads on the local set-up "
        "(adpipe kafka up [--brokers 3], adpipe pg up, and with ADPIPE_SPARK_MASTER=spark://... adpipe spark up) "
        "while a producer writes at a steady rate, and for --duration seconds injects faults from a seeded "
        "schedule: SIGKILL of the stream driver, a Spark worker, a budget instance, a load; SIGSTOP/SIGCONT of the "
        "driver; SIGTERM/SIGKILL of one broker at a time and of the stream's transaction coordinator. With "
        "ADPIPE_STREAM_STANDBY=on (make chaos sets it) a warm standby driver runs beside the active one and takes "
        "over when it dies or is stopped; the dead one comes back as the standby. Then it "
        "drains and checks, from the producer's own record: every window once with the right counts, late and "
        "DLQ records once per event, the Delta tables equal to Kafka, spend exact to the micro-unit. Prints a "
        "table, keeps the JSON under $ADPIPE_HOME/chaos/<run id>/report.json.",
    )
    p.add_argument("--events", type=int, default=200_000, help="distinct events to produce (default 200,000)")
    p.add_argument("--rate", type=float, default=0.0, help="events per second (default: spread over --duration)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of faults (default 600)")
    p.add_argument("--seed", type=int, default=None, help="replays a run's fault schedule (default: random, printed)")
    p.add_argument("--fault-interval", type=float, default=12.0, help="mean seconds between faults (default 12)")
    p.add_argument("--ads", type=int, default=50, help="distinct ads (default 50)")
    p.add_argument("--load-interval", type=float, default=60.0, help="seconds between hourly loads (default 60)")
    p.add_argument(
        "--hosts",
        type=int,
        default=0,
        help="spread the drivers, budget instances and Airflow's Celery workers over N hosts made on this machine "
        "(Linux namespaces, needs root), beside a services host that runs three brokers, PostgreSQL and Airflow's "
        "scheduler; the loads are runs of the load DAG; adds host cut-offs and host kills to the faults (default 0: "
        "every part on this machine's own network)",
    )
    p.set_defaults(func=cmd_chaos)


def add_produce_parser(sub: argparse._SubParsersAction) -> None:
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
        help="fraction of extra events timed 7 to 7+--late-by-minutes minutes before --start, sent last "
        "(late, past the allowed lateness, for a stream that has already processed events up to --start)",
    )
    p.add_argument("--late-by-minutes", type=int, default=5)
    p.add_argument(
        "--revise-rate",
        type=float,
        default=0.0,
        help="fraction of extra events timed 90 s to 4 min before the event they are sent beside "
        "(counted, in a revision of their window when it had closed)",
    )
    p.add_argument("--malformed-rate", type=float, default=0.0)
    p.add_argument("--rate", type=float, default=0.0, help="messages per second (0: as fast as possible)")
    p.add_argument("--summary", help="where to write the summary JSON")
    p.set_defaults(func=cmd_produce)


def add_check_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="reconcile raw events and aggregates; exit 0 only when exactly-once holds",
        description="Recomputes expected aggregates from the raw topic independently and compares "
        "them with the read_committed output, the late topic and the DLQ. Prints a JSON report. Exit 0 when "
        "exactly-once holds, 1 when it is broken, 5 when the only thing off is that the --hour asked for is past "
        "Kafka's retention and nothing of it was ever loaded (tables.verdict past_retention: nobody can check it "
        "any more).",
    )
    p.add_argument(
        "--hour",
        help="also check the ads Delta tables for this UTC hour (YYYY-MM-DDTHH) against Kafka, for every "
        "region in ADPIPE_REGIONS",
    )
    p.add_argument("--tables-only", action="store_true", help="with --hour: only the tables of the hour against Kafka")
    p.add_argument(
        "--candidate-of-run",
        type=int,
        metavar="RUN",
        help="with --hour: check what load run RUN would publish (published plus staged rows), not only the "
        "published tables (the load DAG's verify task)",
    )
    p.add_argument("--report", help="also write the JSON report to this file")
    # With --hour it reads the tables: in the warm load driver when one runs (adpipe.lakehouse.warm).
    p.set_defaults(func=cmd_verify, warm=lambda args: bool(args.hour))

    p = sub.add_parser(
        "demo",
        help="the whole pipeline end to end with a crash injected",
        description="Starts the broker, produces events, runs the stream job, SIGKILLs it "
        "mid-transaction, restarts it, loads the hour, checks it, and ends in a table of what happened "
        "and the verify verdict. Log lines go to ADPIPE_HOME/logs; -v shows them instead.",
    )
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--seed", type=int, default=42)
    # Its log lines go to ADPIPE_HOME/logs/demo.log: the console tells the story.
    p.set_defaults(func=cmd_demo, story_log="demo.log")
