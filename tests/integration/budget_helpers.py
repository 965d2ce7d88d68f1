"""The budget service's test helpers: its environment on the session's
PostgreSQL (:class:`BudgetEnv`), the prices the tests use, and the spend
computed independently from the raw aggregate records, never with the
service's own code. The pipeline's helpers are in helpers.py."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

from adpipe import kafka_io
from adpipe import pg as pg_client
from adpipe.budget import verify as budget_verify
from adpipe.settings import Settings, load_settings
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.helpers import BROKER_ENV, poll, start_adpipe

PRICES_CSV = (
    "scope,key,campaign_id,cpm,cpc,budget\n"
    "default,*,,2.345678,0.333333,1.50\n"
    "campaign,cmp-A,,1.111111,,\n"
    "ad,ad-000001,cmp-A,,0.123457,\n"
    "ad,ad-000002,,3.5,,1000\n"
    "ad,ad-000003,cmp-A,,,\n"
)
# The same prices, resolved by hand: (cpm, cpc, budget) in currency units.
DEFAULT = (Decimal("2.345678"), Decimal("0.333333"), Decimal("1.50"))
BY_AD = {
    "ad-000001": (Decimal("1.111111"), Decimal("0.123457"), Decimal("1.50")),
    "ad-000002": (Decimal("3.5"), Decimal("0.333333"), Decimal("1000")),
    "ad-000003": (Decimal("1.111111"), Decimal("0.333333"), Decimal("1.50")),
}
MICRO = Decimal("0.000001")


@dataclass(frozen=True)
class SourceRecord:
    partition: int
    key: bytes | None
    value: bytes


def _price(ad: str) -> tuple[Decimal, Decimal, Decimal]:
    return BY_AD.get(ad, DEFAULT)


def _taken_revisions(records: list[kafka_io.Record]) -> dict[tuple[str, str], tuple[int, int, int, str]]:
    """Per window (ad_id, window_start), the revision the budget must end
    with: records in read order, the first copy of each record_uuid only,
    malformed ones ignored (no revision: 0); a window takes a record whose
    revision is above the one it took and whose counts are not below it.
    Returns (revision, impressions, clicks, record_uuid) per window."""
    seen: set[str] = set()
    taken: dict[tuple[str, str], tuple[int, int, int, str]] = {}
    for rec in records:
        try:
            body = json.loads(rec.value)
            impressions, clicks = body["impressions"], body["clicks"]
            revision = body.get("revision") or 0
            for n in (impressions, clicks, revision):
                assert isinstance(n, int) and not isinstance(n, bool) and n >= 0
        except (ValueError, KeyError, TypeError, AssertionError):
            continue
        if body["record_uuid"] in seen:
            continue
        seen.add(body["record_uuid"])
        assert body["window_start"].endswith("Z")
        key = (body["ad_id"], body["window_start"])
        before = taken.get(key)
        if before is None or (revision > before[0] and impressions >= before[1] and clicks >= before[2]):
            taken[key] = (revision, impressions, clicks, body["record_uuid"])
    return taken


def price_of(ad: str, impressions: int, clicks: int) -> Decimal:
    """One aggregate's price: impressions x CPM / 1000 rounded half-to-even
    to the micro-unit, plus clicks x CPC."""
    cpm, cpc, _budget = _price(ad)
    return (impressions * cpm / 1000).quantize(MICRO, rounding=ROUND_HALF_EVEN) + clicks * cpc


def independent_spend(records: list[kafka_io.Record]) -> dict[tuple[str, str], Decimal]:
    """Spend per (ad, day) from read_committed records: per window, the
    price of the revision it ends with (:func:`_taken_revisions`), Decimal
    rounded once per window."""
    spend: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for (ad, window_start), (_revision, impressions, clicks, _uuid) in _taken_revisions(records).items():
        spend[(ad, window_start[:10])] += price_of(ad, impressions, clicks)
    return dict(spend)


# ------------------------------------------------------------------ revisions

REVISION_NAMESPACE = uuid.UUID("0b7d3a52-41f6-4c36-9d3c-5a2e71f0c8aa")
History = list[tuple[int, int, int]]  # a window's emissions: (revision, impressions, clicks), growing


def window_histories(
    seed: int, ads: int, minutes: int, max_revision: int, hour: str = "2026-11-22T10"
) -> dict[tuple[str, str], History]:
    """Windows of ``ads`` ads (ad-000001, ...) over ``minutes`` minutes, each
    with revision 0 (5-30 impressions, no click) and 0 to ``max_revision``
    later revisions, each adding 20-120 impressions and 0-2 clicks: the full
    counts of each emission, as the stream job writes them."""
    rng = random.Random(seed)
    histories: dict[tuple[str, str], History] = {}
    for a in range(1, ads + 1):
        for minute in range(minutes):
            impressions, clicks = rng.randint(5, 30), 0
            history = [(0, impressions, clicks)]
            for revision in range(1, rng.randint(0, max_revision) + 1):
                impressions += rng.randint(20, 120)
                clicks += rng.randint(0, 2)
                history.append((revision, impressions, clicks))
            histories[(f"ad-{a:06d}", f"{hour}:{minute:02d}:00Z")] = history
    return histories


def revision_uuid(ad: str, window_start: str, revision: int) -> str:
    name = f"{ad}|{window_start}"
    return str(uuid.uuid5(REVISION_NAMESPACE, name if revision == 0 else f"{name}|r{revision}"))


def revision_record(
    ad: str, window_start: str, revision: int, impressions: int, clicks: int, record_uuid: str | None = None
) -> SourceRecord:
    """One emission of a window, keyed and partitioned by its ad (4
    partitions); a revision 0 of an odd minute without the field, as
    records of earlier versions are."""
    start = datetime.fromisoformat(window_start.replace("Z", "+00:00"))
    body = {
        "record_uuid": record_uuid or revision_uuid(ad, window_start, revision),
        "ad_id": ad,
        "window_start": window_start,
        "window_end": (start + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "impressions": impressions,
        "clicks": clicks,
    }
    if revision or start.minute % 2 == 0:
        body["revision"] = revision
    return SourceRecord(int(ad[-6:]) % 4, ad.encode(), json.dumps(body).encode())


def revision_records(histories: dict[tuple[str, str], History], revisions: range) -> list[SourceRecord]:
    """The emissions of ``revisions``, revision by revision (so a window's
    revisions are in order in its partition), windows in key order."""
    return [
        revision_record(ad, window_start, revision, impressions, clicks)
        for wanted in revisions
        for (ad, window_start), history in sorted(histories.items())
        for revision, impressions, clicks in history
        if revision == wanted
    ]


def expected_ledger(
    histories: dict[tuple[str, str], History], charged: set[tuple[str, str, int]]
) -> dict[str, Decimal]:
    """The charge of each revision in ``charged`` ((ad, window_start,
    revision)), by record_uuid: its price less the price of the window's
    revision charged before it (none: 0)."""
    out = {}
    for (ad, window_start), history in histories.items():
        base = Decimal(0)
        for revision, impressions, clicks in history:
            if (ad, window_start, revision) in charged:
                price = price_of(ad, impressions, clicks)
                out[revision_uuid(ad, window_start, revision)] = price - base
                base = price
    return out


def expected_pauses(spend: dict[tuple[str, str], Decimal]) -> set[tuple[str, str]]:
    return {key for key, amount in spend.items() if amount >= _price(key[0])[2]}


def finish(proc: subprocess.Popen, timeout: float = 60, terminate: bool = True) -> None:
    """Wait for a process started in its own session (after a SIGTERM when
    ``terminate``); SIGKILL its whole group if it is still there then."""
    if terminate and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class BudgetRun:
    returncode: int
    log: str

    def totals(self) -> dict[str, int]:
        """The counters of the service's last line ("budget service stopped: ...")."""
        line = self.log.split("budget service stopped: ", 1)[1].split("\n", 1)[0]
        batches, rest = line.split(" batches, ", 1)
        return {"batches": int(batches)} | {k: int(v) for k, v in (p.rsplit(" ", 1) for p in rest.split(", "))}

    def batch(self, n: int) -> tuple[int, int]:
        """(records, applied) of batch n."""
        line = next(x for x in self.log.splitlines() if f"adpipe.budget: batch {n}: " in x)
        after = line.split(f"batch {n}: ", 1)[1]
        return int(after.split(" records", 1)[0]), int(after.split(": ", 1)[1].split(" applied", 1)[0])


class BudgetEnv:
    """One test's budget service: topic, database, group, processes."""

    def __init__(self, pg: Settings, workdir: Path, extra_env: dict[str, str] | None = None) -> None:
        self.name = f"b{uuid.uuid4().hex[:10]}"
        conn = pg_client.connect(pg, "postgres")
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{self.name}"')
        conn.close()
        self.pg = pg
        self.workdir = workdir
        self.env = {
            **os.environ,
            **BROKER_ENV,
            "ADPIPE_TOPIC_AGGREGATES": f"{self.name}-ad-aggregates",
            "ADPIPE_TOPIC_BUDGET_EVENTS": f"{self.name}-ad-budget-events",
            "ADPIPE_BUDGET_DB": pg.pg_url(self.name),
            "ADPIPE_BUDGET_GROUP": f"{self.name}-group",
            "ADPIPE_BUDGET_BATCH_SIZE": "25",
            "ADPIPE_BUDGET_SESSION_TIMEOUT_MS": "6000",
            **(extra_env or {}),
        }
        self.settings = load_settings(self.env)
        self.bootstrap = self.settings.kafka_bootstrap
        self.topic = self.settings.topics.aggregates
        kafka_io.ensure_topics(self.bootstrap, [self.topic, self.settings.topics.budget_events], 4)
        prices = workdir / "prices.csv"
        prices.write_text(PRICES_CSV)
        loaded = self.cli("prices", "--file", str(prices))
        assert loaded.returncode == 0 and "loaded 5 pricing rows" in loaded.log, loaded.log

    # -- Kafka
    def copy(self, records: list[SourceRecord], chunks: int = 4, abort: bool = False) -> None:
        """Produce records into this test's aggregates topic, in ``chunks``
        transactions (committed, or aborted), to the partitions given."""
        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "transactional.id": f"{self.name}-copy-{uuid.uuid4().hex[:6]}"}
        )
        producer.init_transactions(30)
        size = max(1, -(-len(records) // chunks))
        for i in range(0, len(records), size):
            producer.begin_transaction()
            for rec in records[i : i + size]:
                producer.produce(self.topic, rec.value, rec.key, partition=rec.partition)
            producer.flush(30)
            if abort:
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)

    def read(self, topic: str | None = None) -> list[kafka_io.Record]:
        return list(kafka_io.read_topic(self.bootstrap, topic or self.topic))

    def budget_events(self) -> Counter[tuple[str, str]]:
        return Counter(
            (json.loads(r.value)["ad_id"], json.loads(r.value)["period"])
            for r in self.read(self.settings.topics.budget_events)
        )

    def kafka_committed(self) -> dict[int, int]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.settings.budget_group})
        try:
            parts = [TopicPartition(self.topic, p) for p in range(4)]
            return {tp.partition: tp.offset for tp in kafka_io.committed_offsets(consumer, parts)}
        finally:
            consumer.close()

    # -- processes
    def _popen(self, args: tuple[str, ...], extra_env: dict[str, str] | None) -> tuple[subprocess.Popen, Path]:
        return start_adpipe(self.workdir, "budget", args, {**self.env, **(extra_env or {})})

    def cli(self, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 120) -> BudgetRun:
        proc, log_path = self._popen(args, extra_env)
        finish(proc, timeout, terminate=False)
        return BudgetRun(proc.returncode, log_path.read_text())

    def once(self, fault: dict[str, str] | None = None, **extra: str) -> BudgetRun:
        return self.cli("--once", extra_env={**(fault or {}), **extra})

    def start(self, extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        return self._popen((), extra_env)

    # -- PostgreSQL
    def query(self, sql: str) -> list[tuple]:
        conn = pg_client.connect(self.pg, self.name)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall()
        finally:
            conn.close()

    def spend(self) -> dict[tuple[str, str], Decimal]:
        return {
            (a, p): Decimal(micros).scaleb(-6)
            for a, p, micros in self.query("SELECT ad_id, period, spend_micros FROM budget_spend")
        }

    def ledger(self) -> dict[str, Decimal]:
        """Each ledger row's charge, by record_uuid."""
        return {u: Decimal(m).scaleb(-6) for u, m in self.query("SELECT record_uuid, spend_micros FROM budget_ledger")}

    def db_offsets(self) -> dict[int, int]:
        return dict(self.query("SELECT kafka_partition, next_offset FROM budget_offsets"))

    def snapshot(self) -> tuple:
        return (
            self.spend(),
            self.query("SELECT count(*), sum(spend_micros) FROM budget_ledger"),
            sorted(self.query("SELECT ad_id, period, event_id, sent_at IS NOT NULL FROM budget_events")),
            sorted(self.query("SELECT ad_id, period, state, generation FROM budget_status")),
            self.budget_events(),
        )

    def assert_exact(self) -> dict[tuple[str, str], Decimal]:
        """Spend per ad and period equals the independent computation to the
        micro-unit; each expected pause is in the database and published once."""
        expected = independent_spend(self.read())
        actual = self.spend()
        assert {k: v for k, v in actual.items() if v} == {k: v for k, v in expected.items() if v}
        per_ad_expected: dict[str, Decimal] = defaultdict(Decimal)
        per_ad_actual: dict[str, Decimal] = defaultdict(Decimal)
        for (ad, _p), v in expected.items():
            per_ad_expected[ad] += v
        for (ad, _p), v in actual.items():
            per_ad_actual[ad] += v
        assert per_ad_actual == per_ad_expected
        pauses = expected_pauses(expected)
        assert pauses and len(pauses) < len(expected), "the prices should pause some ads, not all"
        assert set(self.query("SELECT ad_id, period FROM budget_status WHERE state = 'paused'")) == pauses
        assert self.query("SELECT count(*) FROM budget_events WHERE sent_at IS NULL") == [(0,)]
        assert self.budget_events() == Counter(dict.fromkeys(pauses, 1))
        report = budget_verify.check(self.settings)
        assert report["ok"] and report["status"] == "ok", report
        assert report["expected_spend_micros"] == report["actual_spend_micros"] == int(sum(expected.values()) * 10**6)
        return expected


# ---- aggregates written by the tests (plain JSON of the contract)


def aggregate(
    ad: str = "ad-000009", minute: int = 0, impressions: int = 100, clicks: int = 3, hour: int = 10, **over: object
) -> dict:
    """A revision 0 (no ``revision`` field) of (ad, minute of the hour) of
    2026-11-22: one record per window, as the contract has it."""
    body = {
        "record_uuid": str(uuid.uuid4()),
        "ad_id": ad,
        "window_start": f"2026-11-22T{hour:02d}:{minute:02d}:00Z",
        "window_end": f"2026-11-22T{hour:02d}:{minute + 1:02d}:00Z",
        "impressions": impressions,
        "clicks": clicks,
    }
    body.update(over)
    return body


def record(body: dict | bytes, partition: int = 0) -> SourceRecord:
    value = body if isinstance(body, bytes) else json.dumps(body).encode()
    return SourceRecord(partition, b"k", value)


_HOURS = itertools.cycle(range(24))


def normal_records(n: int, ads: int = 12) -> list[SourceRecord]:
    """``n`` windows (n below 50 x ads), an hour of their own per call."""
    hour = next(_HOURS)
    return [record(aggregate(f"ad-{i % ads:06d}", i % 50, 50 + i % 17, i % 5, hour), i % 4) for i in range(n)]


def as_kafka(records: list[SourceRecord]) -> list[kafka_io.Record]:
    return [kafka_io.Record("", r.partition, 0, r.key, r.value, {}) for r in records]


def caught_up(budget: BudgetEnv) -> bool:
    """The budget's offsets in its database reach every partition's end."""
    ends = kafka_io.end_offsets(budget.bootstrap, budget.topic)
    try:
        offsets = budget.db_offsets()
    except Exception:  # noqa: BLE001 - the database may be restarting
        return False
    return all(offsets.get(p, 0) >= end - 1 for p, end in ends.items() if end)


def assignment(log_path: Path) -> list[int] | None:
    lines = [line for line in log_path.read_text().splitlines() if "assignment now" in line]
    return json.loads(lines[-1].rsplit("assignment now ", 1)[1]) if lines else None


def wait_until(what: str, predicate: Callable[[], object], timeout: float = 90.0) -> None:
    """:func:`poll` every 0.5 s."""
    poll(what, predicate, timeout)
