"""``make bench-stages`` (and the last step of ``make bench``): how long
each stage takes on this machine, for N events; and the two sweeps, the
stream job's cap on records per micro-batch and the budget service's batch
size.

Speed belongs here, never in timed tests. Each stage runs as the real
command on its own topics (like the demo) and is timed from the outside;
the result is printed and kept as JSON under ``$ADPIPE_HOME/bench/``.
The budget service runs on the local PostgreSQL, each run in a database
of its own."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

from adpipe import kafka_io, pg
from adpipe.lakehouse import load
from adpipe.local import kafka_broker, postgres
from adpipe.money import format_micros
from adpipe.settings import KafkaAccess, Settings, load_settings
from adpipe.tools import demo, produce

from bench.logs import batch_stats, budget_log_stats


def timed_command(env: dict[str, str], log_path: Path, *args: str) -> float:
    return timed_commands(env, [log_path], *args)


def timed_commands(env: dict[str, str], log_paths: list[Path], *args: str) -> float:
    """``adpipe args`` once per log path, side by side; seconds until the last ends."""
    started = time.monotonic()
    procs = []
    for log_path in log_paths:
        with log_path.open("w") as out:
            procs.append((log_path, subprocess.Popen(  # noqa: S603
                [sys.executable, "-m", "adpipe", *args], env=env, stdout=out, stderr=subprocess.STDOUT
            )))
    for log_path, proc in procs:
        rc = proc.wait()
        if rc != 0:
            raise RuntimeError(f"`adpipe {' '.join(args)}` failed (exit {rc}); see {log_path}")
    return time.monotonic() - started


def _side_by_side(per_instance: list[dict]) -> dict:
    """Budget log stats of instances run side by side, as one: batches and
    totals summed, the drain from the first batch's start to the last end."""
    merged = dict(per_instance[0])
    for name in ("batches", "records", "applied", "batch_s", "publish_rounds"):
        values = [s[name] for s in per_instance]
        merged[name] = None if None in values else round(sum(values), 3)
    batches = [(s["batches"], s["mean_batch_records"], s["mean_batch_ms"]) for s in per_instance]
    if all(None not in b for b in batches) and merged["batches"]:
        merged["mean_batch_records"] = round(sum(n * r for n, r, _ in batches) / merged["batches"], 1)
        merged["mean_batch_ms"] = round(sum(n * ms for n, _, ms in batches) / merged["batches"], 1)
    maxima = [s["max_batch_ms"] for s in per_instance]
    merged["max_batch_ms"] = None if None in maxima else max(maxima)
    windows = [s["drain_window"] for s in per_instance]
    merged["drain_s"] = (
        None if None in windows else round((max(w[1] for w in windows) - min(w[0] for w in windows)).total_seconds(), 3)
    )
    totals = [s["totals"] for s in per_instance]
    merged["totals"] = None if None in totals else {k: sum(t.get(k, 0) for t in totals) for k in totals[0]}
    return merged


def new_run(settings: Settings, kind: str) -> tuple[str, Path]:
    """A bench run's id (``<kind>-<timestamp>``) and its own folder."""
    run_id = f"{kind}-{time.strftime('%Y%m%d%H%M%S')}"
    work = settings.home / "bench" / run_id
    work.mkdir(parents=True, exist_ok=True)
    return run_id, work


def stream_caps(settings: Settings, caps: list[int], events: int = 200_000, seed: int = 7) -> dict:
    """The stream job alone over one topic of ``events``, once per cap on
    records per micro-batch (``ADPIPE_MAX_OFFSETS_PER_TRIGGER``; 0: none),
    each from a fresh checkpoint: how the cap trades throughput for batch
    length (which bounds the transaction time and the driver's memory)."""
    run_id, work = new_run(settings, "caps")
    env = demo.demo_env(settings, run_id)
    bench_settings = load_settings(env)
    kafka_broker.up(settings)
    kafka_io.ensure_pipeline_topics(settings, bench_settings.topics)
    spec = produce.ProduceSpec(events=events, seed=seed, ads=50, minutes=30, duplicate_rate=0.02, malformed_rate=0.01)
    plan = produce.plan(spec)
    produce.send(settings.kafka, bench_settings.topics.events, plan)
    rows = []
    for run, cap in enumerate(caps, start=1):
        # A job id (so a checkpoint) per run: a cap given twice is measured twice.
        name = f"run{run}-cap{cap}"
        cap_env = {**env, "ADPIPE_JOB_ID": f"{env['ADPIPE_JOB_ID']}-{name}"}
        log_path = work / f"stream-{name}.log"
        seconds = timed_command(cap_env, log_path, "stream", "--available-now", "--max-offsets-per-trigger", str(cap))
        row = {
            "max_offsets_per_trigger": cap,
            "seconds": round(seconds, 1),
            "events_per_s": round(plan.summary["messages"] / seconds),
            **batch_stats(log_path.read_text()),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = {"events": events, "messages": plan.summary["messages"], "runs": rows}
    (work / "caps.json").write_text(json.dumps(result, indent=2) + "\n")
    result["files"] = str(work)
    return result


def _rate(count: int, seconds: float | None) -> int | None:
    return round(count / seconds) if seconds else None


# --- The budget service on PostgreSQL ---------------------------------------


def synthetic_aggregates(
    count: int, ads: int = 500, seed: int = 7, start: datetime | None = None, duplicate_rate: float = 0.01
) -> list[dict]:
    """``count`` distinct minute aggregates of the contract (plain Python,
    seeded): ``ads`` ads a minute from ``start``, minute after minute, and
    about ``duplicate_rate`` of them sent again (same record_uuid and value)
    up to a few thousand records later, as a replay would."""
    rng = random.Random(seed)
    start = start or datetime(2026, 11, 22, tzinfo=UTC)
    keyed: list[tuple[float, dict]] = []
    for i in range(count):
        window_start = start + timedelta(minutes=i // ads)
        impressions = rng.randint(0, 400)
        aggregate = {
            "record_uuid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            "ad_id": "ad-%06d" % (i % ads),  # noqa: UP031 - the contract's spelling
            "window_start": window_start.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "window_end": (window_start + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "impressions": impressions,
            "clicks": rng.randint(0, impressions // 40),
        }
        keyed.append((i, aggregate))
        if rng.random() < duplicate_rate:
            keyed.append((i + rng.randint(1, 5000) + 0.5, dict(aggregate)))
    keyed.sort(key=lambda k: k[0])
    return [a for _, a in keyed]


def expected_spend(aggregates: list[dict], cpm_micros: int, cpc_micros: int) -> tuple[int, int]:
    """(distinct record_uuids, their total charge in micro-units), in plain
    Python, apart from the service's own code: per distinct record,
    impressions x CPM / 1000 rounded half-to-even to the micro-unit, plus
    clicks x CPC."""
    seen: set[str] = set()
    total = 0
    for a in aggregates:
        if a["record_uuid"] in seen:
            continue
        seen.add(a["record_uuid"])
        impressions = (Decimal(a["impressions"]) * cpm_micros).scaleb(-3)
        total += int(impressions.quantize(Decimal(1), rounding=ROUND_HALF_EVEN)) + a["clicks"] * cpc_micros
    return len(seen), total


def produce_transactionally(
    kafka: KafkaAccess | str, topic: str, aggregates: list[dict], transactional_id: str, per_transaction: int = 10_000
) -> None:
    """The aggregates into ``topic`` (key ad_id), in a few large Kafka
    transactions, as the stream job writes them."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **kafka_io.client_config(kafka),
            "transactional.id": transactional_id,
            "linger.ms": 20,
            "compression.type": "lz4",
        }
    )
    producer.init_transactions(30)
    for first in range(0, len(aggregates), per_transaction):
        producer.begin_transaction()
        for a in aggregates[first : first + per_transaction]:
            value = json.dumps(a).encode()
            while True:
                try:
                    producer.produce(topic, key=a["ad_id"].encode(), value=value)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        producer.commit_transaction(120)


def database_name(run_id: str, suffix: str = "") -> str:
    return re.sub(r"[^a-z0-9_]", "_", f"adpipe_{run_id}{suffix}".lower())[:63]


def _drop_database(settings: Settings, name: str) -> None:
    conn = pg.connect(settings, "postgres")
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
    finally:
        conn.close()


def budget_env(settings: Settings, run_id: str, suffix: str, topic: str, database: str, **extra: str) -> dict[str, str]:
    """The environment of a bench's budget service over ``topic``: a
    budget-events topic, group and database (created here) of its own, and
    the default prices, whatever this shell says (the expected spend
    assumes them)."""
    pg.ensure_databases(settings, (database,))
    env = {
        **demo.demo_env(settings, run_id),
        "ADPIPE_TOPIC_AGGREGATES": topic,
        "ADPIPE_TOPIC_BUDGET_EVENTS": f"bench-{run_id}{suffix}-budget-events",
        "ADPIPE_BUDGET_DB": settings.pg_url(database),
        "ADPIPE_BUDGET_GROUP": f"bench-{run_id}{suffix}",
        **extra,
    }
    for name in ("ADPIPE_BUDGET_DEFAULT_CPM", "ADPIPE_BUDGET_DEFAULT_CPC"):
        env.pop(name, None)
    return env


def ledger_totals(settings: Settings, database: str) -> tuple[int | None, int | None]:
    """(rows, spend in micro-units) of the ledger in ``database``; (None,
    None) when it cannot be read."""
    try:
        conn = pg.connect(settings, database)
    except Exception:  # noqa: BLE001 - a bench reports, never fails, on a changed schema
        return None, None
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*), coalesce(sum(spend_micros), 0) FROM budget_ledger")
            rows, spend = cur.fetchone()
        return int(rows), int(spend)
    except Exception:  # noqa: BLE001
        return None, None
    finally:
        conn.close()


def budget_batch_sizes(
    settings: Settings,
    sizes: list[int],
    aggregates: int = 50_000,
    ads: int = 500,
    seed: int = 7,
    instances: int = 1,
) -> dict:
    """The budget service alone (``adpipe budget --once``) over one topic of
    ``aggregates`` synthetic aggregates, once per batch size
    (``ADPIPE_BUDGET_BATCH_SIZE``: records per database transaction), each
    run with its own consumer group, budget-events topic and fresh
    PostgreSQL database: how the batch size trades throughput for the length
    of a transaction (which holds row locks and delays the spend a reader
    sees). ``instances`` > 1: that many instances of the group side by side
    (the service scales out by partitions), timed from the first one's first
    batch to the last one's end. Each run is checked on its own: its ledger has one row per
    distinct record_uuid and their spend equals a plain-Python sum at the
    default prices. A run's database is dropped when it checks out."""
    run_id, work = new_run(settings, "budget")
    kafka_broker.up(settings)
    postgres.up(settings)
    topic = f"bench-{run_id}-aggregates"
    kafka_io.ensure_topics(settings.kafka, [topic], 4)
    values = synthetic_aggregates(aggregates, ads=ads, seed=seed)
    distinct, spend = expected_spend(values, settings.budget_default_cpm_micros, settings.budget_default_cpc_micros)
    started = time.monotonic()
    produce_transactionally(settings.kafka, topic, values, f"adpipe-bench-{run_id}")
    produce_s = time.monotonic() - started
    print(json.dumps({"topic": topic, "messages": len(values), "distinct": distinct, "produce_s": round(produce_s, 1)}))

    rows = []
    for size in sizes:
        database = database_name(run_id, f"_b{size}")
        _drop_database(settings, database)
        env = budget_env(settings, run_id, f"-b{size}", topic, database, ADPIPE_BUDGET_BATCH_SIZE=str(size))
        log_paths = [work / f"budget-b{size}{f'-{i}' if instances > 1 else ''}.log" for i in range(instances)]
        wall_s = timed_commands(env, log_paths, "budget", "--once", "--timeout", "3600")
        per_instance = [budget_log_stats(p.read_text()) for p in log_paths]
        stats = per_instance[0] if instances == 1 else _side_by_side(per_instance)
        ledger_rows, ledger_spend = ledger_totals(settings, database)
        exact = ledger_rows == distinct and ledger_spend == spend
        row = {
            "batch_size": size,
            "instances": instances,
            "wall_s": round(wall_s, 1),
            "service_s": stats["service_s"],
            "drain_s": stats["drain_s"],
            "batch_s": stats["batch_s"],
            "aggregates_per_s": _rate(len(values), stats["drain_s"]),
            "aggregates_per_s_in_batches": _rate(len(values), stats["batch_s"]),
            "aggregates_per_s_wall": _rate(len(values), wall_s),
            "batches": stats["batches"],
            "mean_batch_records": stats["mean_batch_records"],
            "mean_batch_ms": stats["mean_batch_ms"],
            "max_batch_ms": stats["max_batch_ms"],
            "batch_size_logged": stats["batch_size_logged"],
            "publish_rounds": stats["publish_rounds"],
            "totals": stats["totals"],
            "ledger_rows": ledger_rows,
            "ledger_spend_micros": ledger_spend,
            "exact": exact,
            "database": database if not exact else None,
        }
        if exact:
            _drop_database(settings, database)
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = {
        "aggregates": aggregates,
        "messages": len(values),
        "distinct_record_uuids": distinct,
        "expected_spend_micros": spend,
        "ads": ads,
        "default_budget": format_micros(settings.budget_default_budget_micros),
        "budget_period": settings.budget_period,
        "topic": topic,
        "produce_s": round(produce_s, 1),
        "runs": rows,
    }
    (work / "budget.json").write_text(json.dumps(result, indent=2) + "\n")
    result["files"] = str(work)
    return result


def _budget_two_instances(settings: Settings, run_id: str, work: Path, topic: str) -> dict:
    """The budget service again over the same aggregates, as two instances
    of a group of its own side by side (a fresh database): how the service
    scales out on this host. Its ledger must hold what one instance's did."""
    database = database_name(run_id, "_x2")
    _drop_database(settings, database)
    env = budget_env(settings, run_id, "-x2", topic, database)
    logs = [work / f"budget-x2-{i}.log" for i in range(2)]
    timed_commands(env, logs, "budget", "--once")
    stats = _side_by_side([budget_log_stats(p.read_text()) for p in logs])
    rows, spend = ledger_totals(settings, database)
    _drop_database(settings, database)
    return {
        "budget_two_instances_aggregates_per_s": _rate(stats["records"] or 0, stats["drain_s"]),
        "budget_two_instances_ledger_rows": rows,
        "budget_two_instances_spend_micros": spend,
    }


def _load_with_tables_in_place(settings: Settings, env: dict[str, str], run_id: str, work: Path,
                                start: datetime) -> float:
    """The same hour's load as every hourly load after the first runs it: into
    a second warehouse and metastore whose schema and tables an earlier
    command (``validate`` of the hour before, which finds nothing) created."""
    env = {**env, "ADPIPE_WAREHOUSE_URI": (work / "warehouse-in-place").as_uri(),
           "ADPIPE_METASTORE_DATABASE": database_name(run_id, "_metastore_in_place")}
    timed_command(env, work / "prepare-in-place.log", "validate", "--hour", load.hour_label(start - timedelta(hours=1)))
    seconds = timed_command(env, work / "load-in-place.log", "load", "--hour", load.hour_label(start))
    _drop_database(settings, env["ADPIPE_METASTORE_DATABASE"])
    return round(seconds, 1)


def run(settings: Settings, events: int = 20_000, seed: int = 7, ads: int = 50, minutes: int = 30) -> dict:
    """Each stage as the real command over ``events`` events of ``ads`` ads
    spread over ``minutes`` minutes (2 % retries, 1 % malformed), timed from
    the outside: produce, stream, budget, load of the first hour (on a fresh
    metastore), its rerun, validate, and the first hour's load again with the
    metastore's tables in place."""
    run_id, work = new_run(settings, "bench")
    env = demo.demo_env(settings, run_id)
    # A warehouse and a metastore of the run's own: the load of "a fresh
    # metastore", and no earlier run's rows of the same hour (another
    # region's, to this run's gate).
    env["ADPIPE_WAREHOUSE_URI"] = (work / "warehouse").as_uri()
    env["ADPIPE_METASTORE_DATABASE"] = database_name(run_id, "_metastore")
    bench_settings = load_settings(env)
    kafka_broker.up(settings)
    postgres.up(settings)
    # The budget service on PostgreSQL, as deployed: a fresh database per run.
    budget_database = database_name(run_id)
    pg.ensure_databases(settings, (budget_database,))
    env["ADPIPE_BUDGET_DB"] = settings.pg_url(budget_database)
    kafka_io.ensure_pipeline_topics(settings, bench_settings.topics)

    spec = produce.ProduceSpec(
        events=events, seed=seed, ads=ads, minutes=minutes, duplicate_rate=0.02, malformed_rate=0.01
    )
    started = time.monotonic()
    plan = produce.plan(spec)
    produce.send(settings.kafka, bench_settings.topics.events, plan)
    produce_s = time.monotonic() - started
    # Close the hour: a few events of the next one.
    closing = produce.ProduceSpec(events=10, seed=seed + 1, minutes=1, start=spec.start + timedelta(hours=1, minutes=1))
    produce.send(settings.kafka, bench_settings.topics.events, produce.plan(closing))

    hour = load.hour_label(spec.start)
    result = {
        "events": events,
        "ads": ads,
        "minutes": minutes,
        "messages": plan.summary["messages"],
        "produce_s": round(produce_s, 1),
        "stream_available_now_s": round(timed_command(env, work / "stream.log", "stream", "--available-now"), 1),
        "budget_once_s": round(timed_command(env, work / "budget.log", "budget", "--once"), 1),
    }
    # The service's rate from its first batch's start to its last one's end
    # (start-up and group join excluded; the stage's whole time is budget_once_s).
    budget = budget_log_stats((work / "budget.log").read_text())
    result.update(
        {
            "budget_batch_size": bench_settings.budget_batch_size,
            "budget_aggregates": budget["records"],
            "budget_batches": budget["batches"],
            "budget_aggregates_per_s": _rate(budget["records"] or 0, budget["drain_s"]),
        }
    )
    result["budget_ledger_rows"], result["budget_spend_micros"] = ledger_totals(settings, budget_database)
    result.update(_budget_two_instances(settings, run_id, work, bench_settings.topics.aggregates))
    _drop_database(settings, budget_database)
    result["load_hour_s"] = round(timed_command(env, work / "load.log", "load", "--hour", hour), 1)
    result["load_rerun_s"] = round(timed_command(env, work / "load-rerun.log", "load", "--hour", hour), 1)
    result["validate_s"] = round(timed_command(env, work / "validate.log", "validate", "--hour", hour), 1)
    _drop_database(settings, env["ADPIPE_METASTORE_DATABASE"])  # the tables' files stay in the run's folder
    result["load_hour_tables_in_place_s"] = _load_with_tables_in_place(settings, env, run_id, work, spec.start)
    result["stream_events_per_s"] = round(result["messages"] / result["stream_available_now_s"])
    (work / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    result["files"] = str(work)
    return result
