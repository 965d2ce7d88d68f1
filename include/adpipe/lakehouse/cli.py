"""``adpipe load``, ``adpipe validate`` and ``adpipe maintain``: Union &
Load into the ``ads`` tables, the Great Expectations gate on an hour, and
the tables' daily OPTIMIZE and VACUUM (``load`` is also
``jobs/union_and_load.py`` under spark-submit)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from adpipe.settings import Settings

log = logging.getLogger("adpipe.lakehouse")

EXIT_HOUR_OPEN = 2
EXIT_OUTPUT_NOT_STABLE = 3  # retriable: the stream's last batch's markers are not written yet
EXIT_NOT_HELD = 4  # --held-only: no failed gate holds the hour
# ``validate --hour`` and ``verify --hour``: the hour is past Kafka's
# retention and nothing of it was ever loaded (adpipe.lakehouse.retention):
# it neither passes nor fails; nobody can check it any more.
EXIT_PAST_RETENTION = 5


def cmd_load(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.lakehouse import load, repair
    from adpipe.lakehouse.errors import HourNotHeld
    from adpipe.lakehouse.ledger import load_lock
    from adpipe.lakehouse.metastore import metastore_session

    if not args.hour:
        log.error("adpipe load: the argument --hour is required (but with --serve)")
        return 2
    hour = load.parse_hour(args.hour)
    last = load.parse_hour(args.to_hour) if args.to_hour else None
    if (args.repair or args.discard_staged) and last is not None:
        log.error("--repair and --discard-staged act on one hour: give --hour without --to-hour")
        return 2
    if args.held_only and not (args.repair or args.discard_staged):
        log.error("--held-only goes with --repair or --discard-staged")
        return 2
    if args.discard_staged:
        try:
            print(repair.hour_action(settings, hour, "discard_staged", metastore_session(settings, "adpipe-load"),
                                     held_only=args.held_only))
        except HourNotHeld as exc:
            log.error("%s", exc)
            return EXIT_NOT_HELD
        return 0
    if not args.allow_open and not all(load.hour_closed(settings, h) for h in load.hours_between(hour, last)):
        # Refused before a Spark session is started for it.
        log.error(
            "an hour asked for is not closed yet: a region's stream watermark has not passed its end plus the "
            "allowed lateness (ADPIPE_ALLOWED_LATENESS_S). Wait, or pass --allow-open to load what is there (its "
            "windows may be incomplete, or revised later: a later load brings their revisions as late corrections)."
        )
        return EXIT_HOUR_OPEN
    if args.step != "all" and (args.repair or last is not None or not args.run_file):
        log.error("--step %s runs one step of one hour's load: give --run-file, without --repair or --to-hour",
                  args.step)
        return 2
    from adpipe import metrics

    metrics.serve(metrics.LOAD, settings)  # while it runs; each step also writes its textfile
    try:
        # The lock before the Spark session: a load waiting for it holds no
        # executors the running one may need (ledger.load_lock).
        with load_lock(settings):
            spark = metastore_session(settings, "adpipe-load")
            if args.repair:
                said = repair.hour_action(settings, hour, "repair", spark, held_only=args.held_only)
            elif args.step != "all":
                return _one_step(args.step, settings, spark, hour, Path(args.run_file))
            else:
                said = load.load_hour(settings, hour, spark, last, allow_open=True).describe()
    except load.GateFailed as exc:
        log.error("%s", exc)
        return 1
    except load.OutputNotStable as exc:
        log.error("%s", exc)
        return EXIT_OUTPUT_NOT_STABLE
    except HourNotHeld as exc:
        log.error("%s", exc)
        return EXIT_NOT_HELD
    print(said)
    return 0


def _one_step(step: str, settings: Settings, spark: object, hour: object, run_file: Path) -> int:
    """One step of a load (what the DAG's tasks run in the warm load driver
    or under spark-submit): ``stage`` writes the staged run to ``run_file``;
    ``audit`` and ``publish`` read it and write their results beside it
    (:func:`adpipe.lakehouse.load.step_file`). A DAG task's ``run_file`` is
    a temporary file of its own, the run written there from the stage task's
    XCom: no step reads another task's file."""
    from adpipe.lakehouse import load

    if step == "stage":
        run = load.stage(settings, spark, hour, allow_open=True)  # type: ignore[arg-type]
        load.write_json(run_file, run.to_dict())
        print(f"run {run.run_id} staged {run.staged}; hours to audit: {', '.join(run.hours) or 'none'}")
        return 0
    run = load.StagedRun.from_dict(json.loads(run_file.read_text()))
    if step == "audit":
        audited = load.audit(settings, spark, run)  # type: ignore[arg-type]
        summary = audited.summary(run.asked_hours())
        load.write_json(load.step_file(run_file, "audit"), summary)
        print(summary["describe"])
        return 0 if summary["success"] else 1
    done = load.publish(settings, spark, run)  # type: ignore[arg-type]
    load.write_json(load.step_file(run_file, "publish"), done)
    print(f"run {run.run_id} published {done['inserted']}; late corrections {done['corrections'] or 'none'}")
    return 0


def cmd_validate(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.lakehouse import load, quality
    from adpipe.lakehouse.metastore import metastore_session

    hour = load.parse_hour(args.hour)
    spark = metastore_session(settings, "adpipe-validate")
    facts = load.kafka_facts(settings, spark, hour)
    if facts.retention_gaps:
        from adpipe.lakehouse import retention

        loaded = retention.hour_loaded(spark, hour, None)
        gone = retention.past_retention(hour, facts.retention_gaps, loaded, facts.regions_with_input)
        if gone is not None:
            log.warning("%s", gone.describe())
            return EXIT_PAST_RETENTION
    result = quality.validate_hour(settings, hour, spark, facts)
    print(result.describe())
    return 0 if result.success else 1


def cmd_maintain(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.lakehouse import maintenance
    from adpipe.lakehouse.metastore import metastore_session

    # Names are checked before a Spark session is started for them.
    tables = [maintenance.check_table_name(t) for t in args.tables] if args.tables else maintenance.DEFAULT_TABLES
    spark = metastore_session(settings, "adpipe-maintain")
    for result in maintenance.optimize_and_vacuum(settings, spark, tables):
        print(result.describe())
    return 0


def cmd_connect(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.lakehouse import connect_server
    from adpipe.spark import answering_server, connect_urls

    if args.action == "serve":
        return connect_server.serve(settings)
    url = answering_server(settings)
    if url is not None:
        print(f"Spark Connect server: {url} answers")
        return 0
    print(f"Spark Connect server: none of {', '.join(connect_urls(settings))} answers")
    return 3


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "load",
        help="Union & Load: new records of every region into the ads Delta tables, audited before publication",
        description="Reads what arrived in every region's raw, aggregates, late and DLQ topics since the last load "
        "(read_committed; raw records up to the stream job's committed offsets), unions the regions, dedupes by "
        "record_uuid / event_id / (source, event_key) (a raw record the DLQ lists, such as a re-stamped retry's "
        "conflicting copy, is no raw row), and files each row in the partition of its own event_hour "
        "(a late record lands in its hour). Write-audit-publish: the rows are staged in ads_staging, the Great "
        "Expectations gate checks each closed hour's candidate (published plus staged rows) and what Kafka says "
        "of it, and only then are they published into ads.ad_events_raw, ads.ad_minute_aggregates (each window's "
        "highest revision: a lower one never replaces it), ads.ad_minute_aggregate_revisions (every revision) and "
        "ads.ad_events_quarantine (insert-if-absent: a rerun changes nothing). Write-audit-publish is per hour: an "
        "hour that fails its gate keeps its staged rows and is held (the ledger says failed; later runs leave it for "
        "an operator: load it again, --repair or --discard-staged); every hour that passes is published. Exit 1 "
        "when an hour asked for fails, naming the expectations; a held hour not asked for is alerted once. An "
        "hour past Kafka's retention of which nothing was ever loaded (its records deleted before any load read "
        "them) is not checked nor held: one WARNING line and a past_retention ledger row report it (exit 0). "
        "The ledger is ads.load_runs; rows published "
        "into an hour after its first publication are in the view ads.late_corrections. Regions: ADPIPE_REGIONS "
        "(default: this job's own topics). Exit 2: an hour asked for is not closed; exit 3 (retry): the stream's "
        "last batch's output is not readable yet (its transaction markers, ADPIPE_LOAD_OUTPUT_WAIT_S); exit 4: "
        "--held-only, and no failed gate holds the hour.",
    )
    p.add_argument("--hour", help="UTC hour YYYY-MM-DDTHH (the first hour with --to-hour); required but with --serve")
    p.add_argument("--to-hour", help="audit and publish every hour from --hour to this one, inclusive (a backfill)")
    p.add_argument(
        "--allow-open",
        action="store_true",
        help="publish the hour even if the stream's watermark has not closed it (its end plus the allowed lateness)",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="rebuild the hour from Kafka (read from the hour's start, audited, written beside the hour's rows and "
        "shown in their place in one step: a reader of the ads.*_whole views sees the old hour or the rebuilt one, "
        "never a mix); idempotent. For an hour published wrongly, or held by its gate.",
    )
    p.add_argument(
        "--discard-staged",
        action="store_true",
        help="delete the hour's staged rows (after a failed gate, once inspected and judged unpublishable); "
        "the ledger records it. The Kafka records stay loaded: --repair rebuilds the hour from Kafka",
    )
    p.add_argument(
        "--held-only",
        action="store_true",
        help="with --repair or --discard-staged: act only on an hour a failed gate holds; on any other, change "
        "nothing and exit 4 naming the hour's last step (what the Airflow form ad_hour_repair runs)",
    )
    p.add_argument(
        "--step",
        choices=("all", "stage", "audit", "publish"),
        default="all",
        help="run one step of the load (the Airflow DAG runs each as its own task): stage writes the staged run to "
        "--run-file, audit (exit 1 on a failed expectation) and publish read it",
    )
    p.add_argument(
        "--run-file",
        help="with --step: the staged run's JSON file (stage writes it; audit and publish read it and write their "
        "result beside it). The DAG's tasks hand the run over in XCom, each step's file its own temporary one",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="be this home's warm load driver: hold a Spark session on the metastore and run the load, validate, "
        "maintain and verify --hour commands of clients on this host in it (no Spark start per command; "
        "ADPIPE_LOAD_WARM: auto uses a running one, on starts one, off never). Exits after "
        "ADPIPE_LOAD_WARM_IDLE_S without a request, or on SIGTERM once the command it runs is done",
    )
    p.set_defaults(func=cmd_load, needs_metastore=True, warm=True)

    p = sub.add_parser(
        "validate",
        help="Great Expectations checks of one loaded hour (the exactly-once proof); exit 1 on a failed one",
        description="Runs the GE checkpoints on the hour's rows of the ads tables: unique record_uuid and "
        "(region, ad_id, window_start), aligned windows, non-negative counts, and the reconciliation of aggregates "
        "with the distinct raw events minus the late ones. Results and Data Docs under $ADPIPE_HOME/gx. Exit 1 on "
        "a failed expectation; 5 (one WARNING line naming what Kafka keeps) when the hour is past Kafka's retention "
        "and nothing of it was ever loaded: nothing to check, nothing failed.",
    )
    p.add_argument("--hour", required=True, help="UTC hour YYYY-MM-DDTHH")
    p.set_defaults(func=cmd_validate, needs_metastore=True, warm=True)

    p = sub.add_parser(
        "maintain",
        help="OPTIMIZE then VACUUM the ads Delta tables (the daily table maintenance)",
        description="For each table: sets its delta.deletedFileRetentionDuration to n hours, n = "
        "ADPIPE_VACUUM_RETENTION_H (168, never less: Delta's retention check stays on, and time travel keeps that "
        "far back; Delta 4's VACUUM applies this property, not its RETAIN clause); OPTIMIZE compacts each "
        "partition's small files into few large ones (the same rows; one Delta commit); then VACUUM ... RETAIN n "
        "HOURS deletes the files that no table version of the last n hours references. A table that does not "
        "exist yet is skipped. Prints one line per table: files compacted, files deleted, seconds. Safe to rerun.",
    )
    p.add_argument(
        "--tables",
        nargs="+",
        metavar="TABLE",
        help="[database.]table names (default: the published ads tables, the aggregates' revisions included, their "
        "ads_staging twins and "
        "ads.load_runs)",
    )
    p.set_defaults(func=cmd_maintain, needs_metastore=True, warm=True)

    p = sub.add_parser(
        "connect",
        help="the load's Spark Connect server: one warm Spark session on the metastore for the load's verbs of "
        "every host",
        description="serve: build the session a load builds (the Hive metastore, Delta, the ads tables in place) and "
        "serve it over Spark Connect until SIGTERM, at the first of ADPIPE_SPARK_CONNECT's servers (sc://host:port, "
        "comma-separated; default sc://127.0.0.1:15002) whose address is this host's; run it under a service "
        "manager, on two hosts or more for a spare. A process with ADPIPE_SPARK_CONNECT set (load, validate, "
        "maintain, verify --hour, the load DAG's steps on any worker) sends its plans to the first server that "
        "answers: no Spark start of its own. status: exit 0 when one answers, 3 otherwise.",
    )
    p.add_argument("action", choices=("serve", "status"))
    # The embedded default's PostgreSQL for a server; a status asks a port only.
    p.set_defaults(func=cmd_connect, needs_metastore=lambda args: args.action == "serve")
