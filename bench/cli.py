"""``python -m bench`` (``make bench``, ``make bench-stages``): the
benchmark's command line. Run from the project root (the harness is not
installed); it runs through adpipe's own command runner, so settings, ``-v``
and errors behave as for any ``adpipe`` verb."""

from __future__ import annotations

import argparse
import json

from adpipe.cli import run_command
from adpipe.settings import Settings


def cmd_peers(args: argparse.Namespace, settings: Settings) -> int:
    from bench import comparison, engines, install, results

    try:
        rows = engines.parse_only(args.only)
    except ValueError as exc:
        raise SystemExit(f"python -m bench --only: {exc}") from exc
    if args.install_only:
        for name, path in install.ensure_peers(settings, rows).items():
            print(f"{name}: {path}")
        return 0
    result = comparison.run(
        settings,
        events=args.events or 1_000_000,
        ads=args.ads or 50,
        engines=rows,
        seed=args.seed,
        latency=args.latency,
        rate=args.rate,
        latency_duration_s=args.latency_duration,
    )
    print()
    print(results.render_table(result))
    print(f"\nJSON: {result['files']}/peers.json")
    failed = [r["engine"] for r in result["rows"] if r["counts"] in ("WRONG", "FAILED")]
    return 1 if failed else 0


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    from bench import stages

    if args.peers:
        return cmd_peers(args, settings)
    if args.failover:
        if args.part == "budget":
            from bench import budget_failover

            result = budget_failover.run(settings, faults=args.faults, seed=args.seed,
                                         rate=args.rate if args.rate is not None else 50.0,
                                         protocol=settings.budget_group_protocol)
            print(json.dumps(result, indent=2))
            return 0 if result["exact"] and result["faults"] == args.faults else 1
        if args.part == "broker":
            from bench import broker_failover

            result = broker_failover.run(settings, faults=args.faults, seed=args.seed,
                                         rate=args.rate if args.rate is not None else 50.0)
            print(json.dumps(result, indent=2))
            stuck = sum(part["stuck"] for part in result["parts"].values())
            return 0 if result["verify_ok"] and result["budget_exact"] and not stuck else 1
        if args.hosts is not None:
            from bench import host_failover

            result = host_failover.run(settings, faults=args.faults, rate=args.rate if args.rate is not None else 5.0,
                                       host_count=args.hosts, kinds=tuple(args.host_faults.split(",")),
                                       seed=args.seed)
            print(json.dumps(result, indent=2))
            sound = (result["double_commits"] == 0 and result["zombies_fenced"] == result["zombies"]
                     and result["faults"] == args.faults)
            return 0 if result["verify_ok"] and sound else 1
        from bench import failover

        result = failover.run(settings, faults=args.faults, rate=args.rate if args.rate is not None else 5.0,
                              signal_name=args.signal, seed=args.seed)
        print(json.dumps(result, indent=2))
        return 0 if result["verify_ok"] and result["faults"] == args.faults else 1
    if args.hour_close:
        from bench import hour_close

        result = hour_close.run(settings, hours=args.hours, events=args.events or 4_000, seed=args.seed)
        print(json.dumps(result, indent=2))
        return 0 if result["verify_ok"] and len(result["hours"]) == args.hours else 1
    if args.load_sessions:
        from bench import load_sessions

        result = load_sessions.run(settings, events=args.events or 20_000, seed=args.seed, ads=args.ads or 50,
                                   minutes=args.minutes)
        print(json.dumps(result, indent=2))
        return 0
    if args.stream_caps:
        caps = [int(c) for c in args.stream_caps.split(",")]
        print(json.dumps(stages.stream_caps(settings, caps, events=args.events or 200_000), indent=2))
        return 0
    if args.budget_batch_sizes:
        try:
            sizes = [int(c) for c in args.budget_batch_sizes.split(",")]
        except ValueError:
            sizes = []
        if not sizes or any(size < 1 for size in sizes):
            raise SystemExit(f"--budget-batch-sizes: integers >= 1 separated by commas, got {args.budget_batch_sizes}")
        result = stages.budget_batch_sizes(
            settings, sizes, aggregates=args.events or 50_000, ads=args.ads or 500, instances=args.instances
        )
        print(json.dumps(result, indent=2))
        return 0 if all(r["exact"] for r in result["runs"]) else 1
    events, ads = args.events or 20_000, args.ads or 50
    result = stages.run(settings, events=events, seed=args.seed, ads=ads, minutes=args.minutes)
    print(json.dumps(result, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Without a mode: runs every stage (produce, stream, budget, load, rerun, validate) as the real "
        "command on fresh topics and prints the seconds each took. --peers (what `make bench` runs): on one topic "
        "(1,000,000 events over 50 ads and 30 minutes, 2 % retries, 1 % malformed), the I/O floor "
        "(confluent-kafka read + json.loads), Spark's batch ceiling (adpipe's transforms as a batch query), "
        "Spark's at-least-once Kafka sink (the same streaming query), adpipe's exactly-once job, quixstreams "
        "(exactly-once) and PyFlink SQL (exactly-once sink), each a process of its own; prints steady-state "
        "events/s, start-up, CPU s per million, peak memory and the ratio to Spark's batch ceiling, with every "
        "output checked against the producer's summary (a row that counts wrong is reported, not ranked; exit 1). "
        "The peers are installed on first use into .cache/bench/<peer> (and the Flink Kafka connector jar from "
        "Maven Central). Results are kept under $ADPIPE_HOME/bench/. Speed targets live here, not in the tests.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument(
        "--events",
        type=int,
        default=None,
        help="events to send (20,000; 200,000 with --stream-caps; 1,000,000 with --peers); with "
        "--budget-batch-sizes: aggregates (50,000)",
    )
    sweep = p.add_mutually_exclusive_group()
    sweep.add_argument(
        "--peers",
        action="store_true",
        help="instead: the side-by-side comparison above (make bench)",
    )
    p.add_argument(
        "--minutes",
        type=int,
        default=30,
        help="per-stage timing: minutes of event time the events span (default 30); with --ads 10000 --minutes 60 "
        "--events 1000000, Union & Load of one hour of 600,000 aggregates and the budget service over them",
    )
    peers = p.add_argument_group("with --peers (--ads and --seed also for the per-stage timing)")
    peers.add_argument(
        "--ads", type=int, help="distinct ads (default 50; 10000 for the wide variant); with --budget-batch-sizes: 500"
    )
    peers.add_argument(
        "--only",
        metavar="ROW,ROW",
        help="these rows only: io_floor, spark_batch, spark_alo, adpipe, quixstreams, pyflink (default: all)",
    )
    peers.add_argument("--seed", type=int, default=7, help="the producer's seed (default 7)")
    peers.add_argument(
        "--latency",
        action="store_true",
        help="then, for adpipe, spark_alo, quixstreams and pyflink in turn: each running continuously while a "
        "producer sends at --rate for --latency-duration; p50/p99 seconds from a window's close (end + watermark "
        "delay) to its aggregate being visible to a read_committed consumer",
    )
    peers.add_argument(
        "--rate", type=float, default=None,
        help="messages/s for --latency (default: half of adpipe's measured rate) and --failover (default 5; 50 with "
        "--part budget or broker)"
    )
    peers.add_argument(
        "--latency-duration", type=float, default=300.0, help="seconds of production per --latency row (default 300)"
    )
    peers.add_argument(
        "--install-only", action="store_true", help="install the peers' environments and jar, then stop"
    )
    sweep.add_argument(
        "--failover",
        action="store_true",
        help="instead: the stream driver's failover to a warm standby (adpipe stream --standby): --faults times "
        "SIGKILL (or --signal STOP) the active driver while a producer sends --rate events/s (default 5: an "
        "idle pipeline); p50/p99/worst seconds from the fault to the standby's first batch, then adpipe verify",
    )
    p.add_argument(
        "--part", choices=("stream", "budget", "broker"), default="stream",
        help="with --failover: the stream driver (default); or a budget service instance: two instances, one "
        "SIGKILLed, timed until each partition it held is charged again (its group on "
        "ADPIPE_BUDGET_GROUP_PROTOCOL's protocol; --rate aggregates/s, default 50), then the ledger is checked; "
        "or a broker: a three-node cluster of the bench's own (ports +50), one broker SIGKILLed, timed until "
        "the partitions have live leaders, the producer's records, a transaction, the stream job's ledger and "
        "the budget service's offsets move again (--rate events/s, default 50); then verify and the ledger",
    )
    p.add_argument("--faults", type=int, default=10, help="with --failover: faults to inject (default 10)")
    p.add_argument(
        "--hosts", type=int, metavar="N",
        help="with --failover (the stream driver): across N hosts made on this machine (needs root; "
        "adpipe.tools.hosts) and a services host with three brokers: the active driver's whole host cut off "
        "(from everything, or from the brokers only) or killed, --faults times, the kinds in turn (--host-faults); "
        "p50/p99/worst seconds from the fault to the standby's first batch on another host; a cut-off driver must "
        "exit fenced and never commit the standby's batches",
    )
    p.add_argument(
        "--host-faults", default="cut,cut_brokers,kill", metavar="KIND,KIND",
        help="with --failover --hosts: the fault kinds, in turn (default cut,cut_brokers,kill)",
    )
    p.add_argument("--signal", choices=("KILL", "STOP"), default="KILL", help="with --failover: SIGKILL or SIGSTOP")
    sweep.add_argument(
        "--hour-close",
        action="store_true",
        help="instead: how soon an hour is in the Delta tables after it closes, along the load DAG's path "
        "(without Airflow's scheduler): the stream job running, --hours hours of --events events (default 4,000) "
        "each closed by the next hour's events; per hour, seconds from the close to the load's end (the DAG's "
        "trigger asks every 10 s, then `adpipe load` in the warm load driver), then verify --hour",
    )
    p.add_argument("--hours", type=int, default=4, help="with --hour-close: hours to close and load (default 4)")
    sweep.add_argument(
        "--load-sessions",
        action="store_true",
        help="instead: where the load's verbs get their Spark session: one of their own per command, the home's warm "
        "load driver, or the load's Spark Connect server (adpipe connect serve); the same hour of --events events "
        "(default 20,000) loaded, reloaded and validated each way, tables in place; prints seconds per command "
        "and each server's start",
    )
    sweep.add_argument(
        "--stream-caps",
        metavar="N,N,...",
        help="instead: the stream job alone, once per cap on records per micro-batch (0: none), e.g. "
        "25000,50000,100000,200000,0; prints events/s and the slowest batch and transaction of each",
    )
    sweep.add_argument(
        "--budget-batch-sizes",
        metavar="N,N,...",
        help="instead: the budget service alone on PostgreSQL over one topic of synthetic aggregates, once per "
        "ADPIPE_BUDGET_BATCH_SIZE, e.g. 25,100,250,500,1000,2000; prints aggregates/s, batch times and whether "
        "each run's ledger and spend are exact (exit 1 if one is not)",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=1,
        help="with --budget-batch-sizes: instances of the budget service's group run side by side (default 1)",
    )
    p.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)
