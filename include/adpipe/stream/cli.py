"""``adpipe stream``: the aggregation stream job (also
``jobs/aggregation_stream.py`` under spark-submit)."""

from __future__ import annotations

import argparse
import logging

from adpipe.settings import Settings

# EXIT_FENCED: a fenced job (a successor took over its transactional.id or
# its leadership), a ledger that does not fit the checkpoint, a job another
# driver leads, a checkpoint another query wrote: stopping is right, restarting blindly is not.
from adpipe.stream.leadership import EXIT_FENCED

log = logging.getLogger("adpipe.stream")


def cmd_stream(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.faults import FaultPlan
    from adpipe.stream import driver
    from adpipe.stream.leadership import CheckpointInUseError
    from adpipe.stream.offset_log import CheckpointVersionError
    from adpipe.stream.sink import LedgerMismatchError, ProducerFencedError, TransactionTimedOutError

    if args.standby and args.available_now:
        log.error("--standby waits to take over a running job: it cannot be --available-now")
        return 2
    if args.upgrade_checkpoint:
        return _upgrade(settings)
    if args.max_offsets_per_trigger is not None:
        settings = settings.with_overrides(max_offsets_per_trigger=args.max_offsets_per_trigger)
    try:
        driver.run(
            settings,
            available_now=args.available_now,
            fault=FaultPlan.from_env(),
            accept_empty_ledger=args.accept_empty_ledger,
            standby=args.standby,
        )
    except (ProducerFencedError, LedgerMismatchError, CheckpointInUseError, CheckpointVersionError) as exc:
        log.error("%s", exc)
        return EXIT_FENCED
    except TransactionTimedOutError as exc:  # a restart replays the batch: the supervisor's to do
        log.error("%s", exc)
        return 1
    return 0


def _upgrade(settings: Settings) -> int:
    from adpipe.spark import build_spark, stream_job_conf
    from adpipe.stream import driver, upgrade
    from adpipe.stream.leadership import CheckpointInUseError

    spark = build_spark(settings, f"adpipe-stream-upgrade-{settings.job_id}", stream_job_conf(settings))
    try:
        windows = upgrade.upgrade(settings, spark, lambda files: driver.sink_for(settings, None, files)[0])
    except (upgrade.UpgradeError, CheckpointInUseError) as exc:
        log.error("%s", exc)
        return EXIT_FENCED
    finally:
        spark.stop()
    print(f"upgraded the checkpoint {settings.checkpoint_uri}: {windows} open windows carried over; start the job")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stream",
        help="the aggregation stream job",
        description="Spark Structured Streaming from the raw topic to one-minute aggregates, "
        "written to Kafka transactionally. Stops cleanly on SIGTERM; exit 4 when it must not go on: "
        "fenced by a successor, a ledger that does not "
        "fit the checkpoint, a job another driver leads, a checkpoint an older query wrote.",
    )
    p.add_argument("--available-now", action="store_true", help="process what is in the topic now, then stop")
    p.add_argument(
        "--standby",
        action="store_true",
        help="a warm standby driver of the same job, on this host or any other: start the JVM and the session now, "
        "wait in the job's leadership group, and take over when the leading driver stops, or has not reached the "
        "brokers for ADPIPE_STREAM_LEASE_S (dead, frozen, cut off); with no driver running, it is the active one",
    )
    p.add_argument("--max-offsets-per-trigger", type=int, default=None, help="cap on records per micro-batch")
    p.add_argument(
        "--accept-empty-ledger",
        action="store_true",
        help="start although the checkpoint has committed batches and the ledger group holds nothing (its offsets "
        "expired, or another cluster); only when no batch can be in doubt",
    )
    p.add_argument(
        "--upgrade-checkpoint",
        action="store_true",
        help="once, with the job stopped: carry a checkpoint the earlier version of the job wrote (one stateful "
        "operator, Spark's watermark) over to this version's: its event ids, open windows and input offsets "
        "(the old checkpoint is kept beside it); then start the job as usual",
    )
    p.set_defaults(func=cmd_stream)
