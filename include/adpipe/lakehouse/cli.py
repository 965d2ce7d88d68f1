"""``adpipe load`` and ``adpipe validate``: Union & Load of an hour into the
``ads`` tables, and the Great Expectations gate on it (``load`` is also
``jobs/union_and_load.py`` under spark-submit)."""

from __future__ import annotations

import argparse
import logging

from adpipe.settings import Settings

log = logging.getLogger("adpipe.lakehouse")

EXIT_HOUR_OPEN = 2


def cmd_load(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.lakehouse import load
    from adpipe.lakehouse.metastore import metastore_session

    hours = load.hours_between(load.parse_hour(args.hour), load.parse_hour(args.to_hour) if args.to_hour else None)
    spark = None
    for hour in hours:
        if not args.allow_open and not load.hour_closed(settings, hour):
            log.error(
                "hour %s is not closed yet: a region's stream watermark has not passed %s. Wait, or pass "
                "--allow-open to load what is there (its windows may be incomplete).",
                load.hour_label(hour), load.hour_label(hour + load.ONE_HOUR),
            )
            return EXIT_HOUR_OPEN
        spark = spark or metastore_session(settings, "adpipe-load")
        result = load.load_hour(settings, hour, spark)
        print(result.describe())
    return 0


def cmd_validate(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.lakehouse import load, quality

    result = quality.validate_hour(settings, load.parse_hour(args.hour))
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


def add_parsers(sub: argparse._SubParsersAction) -> None:
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
    p.set_defaults(func=cmd_load, needs_metastore=True)

    p = sub.add_parser(
        "validate",
        help="Great Expectations checks of one loaded hour (the exactly-once proof); exit 1 on a failed one",
        description="Runs the GE checkpoints on the hour's rows of the ads tables: unique record_uuid and "
        "(region, ad_id, window_start), aligned windows, non-negative counts, and the reconciliation of aggregates "
        "with the distinct raw events minus the late ones. Results and Data Docs under $ADPIPE_HOME/gx.",
    )
    p.add_argument("--hour", required=True, help="UTC hour YYYY-MM-DDTHH")
    p.set_defaults(func=cmd_validate, needs_metastore=True)

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
        help="[database.]table names (default: ads.ad_events_raw ads.ad_minute_aggregates ads.ad_events_quarantine)",
    )
    p.set_defaults(func=cmd_maintain, needs_metastore=True)
