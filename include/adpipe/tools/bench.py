"""``make bench``: how long each stage takes on this machine, for N events.

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


def _timed(env: dict[str, str], log_path: Path, *args: str) -> float:
    started = time.monotonic()
    with log_path.open("w") as out:
        rc = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "adpipe", *args], env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode
    if rc != 0:
        raise RuntimeError(f"`adpipe {' '.join(args)}` failed (exit {rc}); see {log_path}")
    return time.monotonic() - started


_BATCH_LINE = re.compile(r"adpipe\.stream: batch \d+: input offsets (\d+),.* in (\d+) ms \(batch (\d+) ms\)")


def batch_stats(log_text: str) -> dict:
    """From a stream log: how many batches, the largest input, the slowest
    batch and the slowest transaction."""
    found = [tuple(map(int, m.groups())) for m in _BATCH_LINE.finditer(log_text)]
    with_input = [f for f in found if f[0] > 0]
    return {
        "batches": len(found),
        "batches_with_input": len(with_input),
        "max_batch_offsets": max((f[0] for f in found), default=0),
        "max_transaction_ms": max((f[1] for f in found), default=0),
        "max_batch_ms": max((f[2] for f in found), default=0),
    }


def stream_caps(settings: Settings, caps: list[int], events: int = 200_000, seed: int = 7) -> dict:
    """The stream job alone over one topic of ``events``, once per cap on
    records per micro-batch (``ADPIPE_MAX_OFFSETS_PER_TRIGGER``; 0: none),
    each from a fresh checkpoint: how the cap trades throughput for batch
    length (which bounds the transaction time and the driver's memory)."""
    run_id = "caps-" + time.strftime("%Y%m%d%H%M%S")
    env = demo.demo_env(settings, run_id)
    bench_settings = load_settings(env)
    work = settings.home / "bench" / run_id
    work.mkdir(parents=True, exist_ok=True)
    kafka_broker.up(settings)
    kafka_io.ensure_pipeline_topics(settings, bench_settings.topics)
    spec = produce.ProduceSpec(events=events, seed=seed, ads=50, minutes=30, duplicate_rate=0.02, malformed_rate=0.01)
    plan = produce.plan(spec)
    produce.send(settings.kafka, bench_settings.topics.events, plan)
    rows = []
    for cap in caps:
        cap_env = {**env, "ADPIPE_JOB_ID": f"{env['ADPIPE_JOB_ID']}-cap{cap}"}
        log_path = work / f"stream-cap{cap}.log"
        seconds = _timed(cap_env, log_path, "stream", "--available-now", "--max-offsets-per-trigger", str(cap))
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


# --- The budget service on PostgreSQL ---------------------------------------

_LOG_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[,.]\d+)?)")
_BUDGET_BATCH = re.compile(r"adpipe\.budget: batch (\d+): (.*)$")
_MS = re.compile(r"(\d+(?:\.\d+)?)\s*ms\b")


def log_time(line: str) -> datetime | None:
    """The time a log line starts with (``%(asctime)s``), or None."""
    m = _LOG_TIME.match(line)
    if not m:
        return None
    try:
        return datetime.fromisoformat(m.group(1).replace(",", "."))
    except ValueError:
        return None


def _int_in(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    return int(m.group(1)) if m else None


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 3)


def budget_log_stats(log_text: str) -> dict:
    """From a budget service log: its batches (``adpipe.budget: batch N: R
    records: A applied ...; X ms``), the time spent in them, the time it
    took to drain the topic (from the first batch's start to the last one's
    end: start-up and group join excluded, and so is the wait before the
    last batch, a drained topic's last poll waiting out its timeout), its
    budget-event publish rounds, the batch size it announced and the totals
    of its ``budget service stopped: ...`` line. Tolerant of a changing
    format: what is not found is None, never an error."""
    batches: list[tuple[int, int | None, float | None, datetime | None]] = []
    started_at = stopped_at = None
    batch_size = stopped_batches = None
    totals: dict[str, int] | None = None
    published = [0, 0]  # publish rounds, budget events in them
    for line in log_text.splitlines():
        events = _int_in(r"adpipe\.budget: published (\d+) budget events", line)
        if events is not None:
            published[0] += 1
            published[1] += events
            continue
        if "budget service stopped" in line:
            stopped_at = log_time(line)
            rest = line.split("budget service stopped", 1)[1]
            stopped_batches = _int_in(r"(\d+) batches", rest)
            found = re.findall(r"([a-z_]+) (\d+)\b", rest.split("batches", 1)[-1])
            totals = {k: int(v) for k, v in found} or None
            continue
        if "adpipe.budget: budget service" in line:
            started_at = log_time(line)
            batch_size = _int_in(r"batch size (\d+)", line)
            continue
        m = _BUDGET_BATCH.search(line)
        if not m:
            continue
        rest = m.group(2)
        records = _int_in(r"^(\d+) records", rest)
        if records is None:  # "batch N: database transaction failed ..." and the like
            continue
        durations = _MS.findall(rest)
        duration = float(durations[-1]) if durations else None
        batches.append((records, _int_in(r"(\d+) applied", rest), duration, log_time(line)))

    stats: dict = {
        "batches": len(batches) or None,
        "records": sum(b[0] for b in batches) if batches else None,
        "applied": None,
        "batch_s": None,
        "mean_batch_ms": None,
        "max_batch_ms": None,
        "mean_batch_records": round(sum(b[0] for b in batches) / len(batches), 1) if batches else None,
        "drain_s": None,
        "service_s": _seconds(started_at, stopped_at),
        "batch_size_logged": batch_size,
        "publish_rounds": published[0],
        "events_published": published[1],
        "stopped_batches": stopped_batches,
        "totals": totals,
    }
    applied = [b[1] for b in batches if b[1] is not None]
    if batches and len(applied) == len(batches):
        stats["applied"] = sum(applied)
    ms = [b[2] for b in batches if b[2] is not None]
    if batches and len(ms) == len(batches):
        stats["batch_s"] = round(sum(ms) / 1000, 3)
        stats["mean_batch_ms"] = round(sum(ms) / len(ms), 1)
        stats["max_batch_ms"] = max(ms)
        ends = [b[3] for b in batches if b[3] is not None]
        if len(ends) == len(batches):
            # From the first batch's start to the last one's end, less the
            # wait before the last batch: a drained topic's last poll waits
            # out the consumer's timeout (idle, not work).
            first_start = ends[0] - timedelta(milliseconds=ms[0])
            before_last = (ends[-2] - first_start).total_seconds() if len(ends) > 1 else 0.0
            stats["drain_s"] = round(before_last + ms[-1] / 1000, 3)
    return stats


def _rate(count: int, seconds: float | None) -> int | None:
    return round(count / seconds) if seconds else None


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


def _database_name(run_id: str, suffix: str = "") -> str:
    return re.sub(r"[^a-z0-9_]", "_", f"adpipe_{run_id}{suffix}".lower())[:63]


def _drop_database(settings: Settings, name: str) -> None:
    conn = pg.connect(settings, "postgres")
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
    finally:
        conn.close()


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
    settings: Settings, sizes: list[int], aggregates: int = 50_000, ads: int = 500, seed: int = 7
) -> dict:
    """The budget service alone (``adpipe budget --once``) over one topic of
    ``aggregates`` synthetic aggregates, once per batch size
    (``ADPIPE_BUDGET_BATCH_SIZE``: records per database transaction), each
    run with its own consumer group, budget-events topic and fresh
    PostgreSQL database: how the batch size trades throughput for the length
    of a transaction (which holds row locks and delays the spend a reader
    sees). Each run is checked on its own: its ledger has one row per
    distinct record_uuid and their spend equals a plain-Python sum at the
    default prices. A run's database is dropped when it checks out."""
    run_id = "budget-" + time.strftime("%Y%m%d%H%M%S")
    work = settings.home / "bench" / run_id
    work.mkdir(parents=True, exist_ok=True)
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
        database = _database_name(run_id, f"_b{size}")
        _drop_database(settings, database)
        pg.ensure_databases(settings, (database,))
        env = {
            **demo.demo_env(settings, run_id),
            "ADPIPE_TOPIC_AGGREGATES": topic,
            "ADPIPE_TOPIC_BUDGET_EVENTS": f"bench-{run_id}-b{size}-budget-events",
            "ADPIPE_BUDGET_DB": settings.pg_url(database),
            "ADPIPE_BUDGET_GROUP": f"bench-{run_id}-b{size}",
            "ADPIPE_BUDGET_BATCH_SIZE": str(size),
        }
        # The prices the expected spend assumes: the defaults, whatever this shell says.
        for name in ("ADPIPE_BUDGET_DEFAULT_CPM", "ADPIPE_BUDGET_DEFAULT_CPC"):
            env.pop(name, None)
        log_path = work / f"budget-b{size}.log"
        wall_s = _timed(env, log_path, "budget", "--once", "--timeout", "3600")
        stats = budget_log_stats(log_path.read_text())
        ledger_rows, ledger_spend = ledger_totals(settings, database)
        exact = ledger_rows == distinct and ledger_spend == spend
        row = {
            "batch_size": size,
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


def run(settings: Settings, events: int = 20_000, seed: int = 7, ads: int = 50, minutes: int = 30) -> dict:
    """Each stage as the real command over ``events`` events of ``ads`` ads
    spread over ``minutes`` minutes (2 % retries, 1 % malformed), timed from
    the outside: produce, stream, budget, load of the first hour, its rerun,
    validate."""
    run_id = "bench-" + time.strftime("%Y%m%d%H%M%S")
    env = demo.demo_env(settings, run_id)
    bench_settings = load_settings(env)
    work = settings.home / "bench" / run_id
    work.mkdir(parents=True, exist_ok=True)
    kafka_broker.up(settings)
    postgres.up(settings)
    # The budget service on PostgreSQL, as deployed: a fresh database per run.
    budget_database = _database_name(run_id)
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
        "stream_available_now_s": round(_timed(env, work / "stream.log", "stream", "--available-now"), 1),
        "budget_once_s": round(_timed(env, work / "budget.log", "budget", "--once"), 1),
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
            "budget_ledger_rows": ledger_totals(settings, budget_database)[0],
        }
    )
    _drop_database(settings, budget_database)
    result["load_hour_s"] = round(_timed(env, work / "load.log", "load", "--hour", hour), 1)
    result["load_rerun_s"] = round(_timed(env, work / "load-rerun.log", "load", "--hour", hour), 1)
    result["validate_s"] = round(_timed(env, work / "validate.log", "validate", "--hour", hour), 1)
    result["stream_events_per_s"] = round(result["messages"] / result["stream_available_now_s"])
    (work / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    result["files"] = str(work)
    return result
