"""Budget service units: exact money, parsing, pricing resolution and one
batch's SQL on SQLite (the embedded fallback). Expected values are written
out by hand, not recomputed with the code under test."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from adpipe.budget import db, outage, pricing, writes
from adpipe.budget.aggregate import BadAggregate, parse_aggregate
from adpipe.budget.batch import apply_batch
from adpipe.budget.money import Price, period_of, spend_micros
from adpipe.budget.report import format_report, report
from adpipe.budget.status import event_id
from adpipe.money import MoneyError, format_micros, parse_micros
from adpipe.settings import SettingsError, load_settings

from tests.unit.budget.conftest import FakeMessage

# ------------------------------------------------------------------ money


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("0", 0),
        ("2", 2_000_000),
        ("2.5", 2_500_000),
        ("0.000001", 1),
        ("1234.567891", 1_234_567_891),
        (" 3.10 ", 3_100_000),
    ],
)
def test_parse_micros_exact(text: str, micros: int) -> None:
    assert parse_micros(text) == micros


@pytest.mark.parametrize("text", ["-1", "0.0000001", "1e3", "abc", "", "1,5", "NaN", "inf", ".5"])
def test_parse_micros_rejects(text: str) -> None:
    with pytest.raises(MoneyError):
        parse_micros(text)


def test_format_micros() -> None:
    assert format_micros(0) == "0.000000"
    assert format_micros(1) == "0.000001"
    assert format_micros(1_234_567_891) == "1234.567891"
    assert format_micros(-5) == "-0.000005"
    assert format_micros(None) == "-"


@pytest.mark.parametrize(
    ("impressions", "clicks", "cpm", "cpc", "expected"),
    [
        (0, 0, 2_000_000, 500_000, 0),
        (1000, 0, 2_000_000, 0, 2_000_000),  # 1000 x 2.00 / 1000 = 2.00
        (100, 7, 2_000_000, 500_000, 200_000 + 3_500_000),
        (1, 0, 2_345_678, 0, 2_346),  # 2345.678 micros -> 2346
        (1, 0, 2_500, 0, 2),  # 2.5 -> 2 (half to even)
        (3, 0, 2_500, 0, 8),  # 7.5 -> 8 (half to even)
        (1, 0, 1_500, 0, 2),  # 1.5 -> 2
        (1, 0, 499, 0, 0),  # 0.499 -> 0
        (1, 0, 501, 0, 1),  # 0.501 -> 1
        (0, 3, 0, 333_333, 999_999),
        (10**12, 10**9, 9_999_999_999, 9_999_999_999, 10**12 * 9_999_999_999 // 1000 + 10**9 * 9_999_999_999),
    ],
)
def test_spend_micros_by_hand(impressions: int, clicks: int, cpm: int, cpc: int, expected: int) -> None:
    assert spend_micros(impressions, clicks, Price(cpm, cpc)) == expected


def test_spend_micros_never_floats() -> None:
    # 0.1 + 0.2 style drift cannot happen: 3 records of 1 click at 0.1 sum to exactly 0.3
    price = Price(0, parse_micros("0.1"))
    assert sum(spend_micros(0, 1, price) for _ in range(3)) == parse_micros("0.3")
    with pytest.raises(ValueError, match="negative"):
        spend_micros(-1, 0, price)


def test_period_of_uses_event_time_in_utc() -> None:
    assert period_of("2026-11-22T23:59:00Z", "day") == "2026-11-22"
    assert period_of("2026-11-23T01:30:00+02:00", "day") == "2026-11-22"
    assert period_of("2026-11-22T12:34:00Z", "hour") == "2026-11-22T12"
    assert period_of("2026-11-22T12:34:00Z", "month") == "2026-11"
    assert period_of("2026-11-22T12:34:00Z", "total") == "total"
    with pytest.raises(ValueError):
        period_of("2026-11-22T12:34:00", "day")  # no zone
    with pytest.raises(ValueError):
        period_of("2026-11-22T12:34:00Z", "week")


def _agg(**over: object) -> bytes:
    body = {
        "record_uuid": "u-1",
        "ad_id": "ad-1",
        "window_start": "2026-11-22T12:34:00Z",
        "window_end": "2026-11-22T12:35:00Z",
        "impressions": 100,
        "clicks": 7,
    }
    body.update(over)
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


def test_parse_aggregate() -> None:
    agg = parse_aggregate(_agg())
    assert (agg.record_uuid, agg.ad_id, agg.window_start, agg.impressions, agg.clicks) == (
        "u-1",
        "ad-1",
        "2026-11-22T12:34:00Z",
        100,
        7,
    )


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        _agg(record_uuid=...),
        _agg(record_uuid=""),
        _agg(ad_id=5),
        _agg(window_start="yesterday"),
        _agg(impressions=-1),
        _agg(clicks=1.5),
        _agg(clicks=True),
        _agg(impressions="100"),
    ],
)
def test_parse_aggregate_rejects(value: bytes | None) -> None:
    with pytest.raises(BadAggregate):
        parse_aggregate(value)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        # What PostgreSQL would refuse on every retry, caught before any transaction.
        (_agg(window_start="2026-11-22T12:34:00.000000000000000000000Z"), "more than the database's 40"),
        (_agg(ad_id="a" * 201), "more than the database's 200"),
        (_agg(record_uuid="u" * 65), "more than the database's 64"),
        (_agg(impressions=2**63), "beyond the database's BIGINT"),
        (_agg(clicks=10**30), "beyond the database's BIGINT"),
        (
            b'{"record_uuid": "u", "ad_id": "ad\\u0000x", "window_start": "2026-11-22T12:34:00Z", '
            b'"impressions": 1, "clicks": 0}',
            "ad_id contains a NUL character",
        ),
        (
            b'{"record_uuid": "u", "ad_id": "ad\\ud800", "window_start": "2026-11-22T12:34:00Z", '
            b'"impressions": 1, "clicks": 0}',
            "ad_id contains an unpaired surrogate",
        ),
        (_agg(window_start="0001-01-01T00:00:00+14:00"), "not an ISO-8601 time"),
        (b"[" * 100_000, "not JSON"),
    ],
)
def test_parse_aggregate_rejects_what_the_database_cannot_hold(value: bytes, why: str) -> None:
    with pytest.raises(BadAggregate, match=why):
        parse_aggregate(value)


def test_parse_aggregate_accepts_the_limits() -> None:
    agg = parse_aggregate(_agg(ad_id="a" * 200, record_uuid="u" * 64, impressions=2**63 - 1))
    assert (len(agg.ad_id), agg.impressions) == (200, 2**63 - 1)


def test_charge_beyond_bigint_is_refused() -> None:
    from adpipe.budget.money import charge_micros

    agg = parse_aggregate(_agg(impressions=2**62, clicks=0))
    assert charge_micros(agg, Price(1000, 0)) == 2**62  # 2**62 x 1000 / 1000
    with pytest.raises(BadAggregate, match="BIGINT"):
        charge_micros(agg, Price(4000, 0))


class _Orig(Exception):
    def __init__(self, pgcode: str | None) -> None:
        super().__init__("server says no")
        self.pgcode = pgcode


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (sa.exc.OperationalError("x", {}, _Orig("40001")), "transient"),  # serialization_failure
        (sa.exc.OperationalError("x", {}, _Orig("40P01")), "transient"),  # deadlock_detected
        (sa.exc.OperationalError("x", {}, _Orig("57P01")), "transient"),  # admin_shutdown
        (sa.exc.OperationalError("x", {}, _Orig("57014")), "transient"),  # statement timeout
        (sa.exc.OperationalError("x", {}, _Orig("08006")), "transient"),  # connection_failure
        (sa.exc.OperationalError("x", {}, _Orig(None)), "transient"),  # connection refused: no code
        (sa.exc.InterfaceError("x", {}, _Orig(None)), "transient"),  # connection already closed
        (sa.exc.DataError("x", {}, _Orig("22001")), "data"),  # string_data_right_truncation
        (sa.exc.DataError("x", {}, _Orig("22003")), "data"),  # numeric_value_out_of_range
        (sa.exc.IntegrityError("x", {}, _Orig("23514")), "data"),  # check_violation
        (sa.exc.ProgrammingError("x", {}, _Orig("42P01")), "fatal"),  # undefined_table
        (sa.exc.ProgrammingError("x", {}, _Orig("42501")), "fatal"),  # insufficient_privilege
        (ValueError("A string literal cannot contain NUL (0x00) characters."), "data"),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), "data"),
        (sa.exc.TimeoutError("pool"), "transient"),
        (KeyError("bug"), "fatal"),
    ],
)
def test_database_faults_by_kind(exc: BaseException, kind: str) -> None:
    assert db.fault_kind(exc) == kind


class _Assignment:
    """What OutageGuard uses of an Assignment: pause, resume, the consumer."""

    def __init__(self) -> None:
        self.consumer = None
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


@pytest.mark.parametrize(
    ("after_the_outage", "raised"),
    [
        (None, None),
        (sa.exc.DataError("x", {}, _Orig("22001")), sa.exc.DataError),
        (sa.exc.ProgrammingError("x", {}, _Orig("42P01")), sa.exc.ProgrammingError),
    ],
)
def test_an_outage_ends_with_consumption_resumed_whatever_the_database_answers(
    after_the_outage: BaseException | None, raised: type[BaseException] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two connection failures, then a success or a refusal: consumption was
    # paused once and is resumed once either way (a refusal once left the
    # service polling and charging nothing).
    monkeypatch.setattr(outage, "MAX_BACKOFF_S", 0.01)
    answers: list[BaseException | None] = [sa.exc.OperationalError("x", {}, _Orig("08006"))] * 2 + [after_the_outage]

    def action() -> str:
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        return "committed"

    assignment = _Assignment()
    guard = outage.OutageGuard(load_settings({"ADPIPE_BUDGET_DB_OUTAGE_S": "60"}), threading.Event(), assignment)  # type: ignore[arg-type]
    if raised is None:
        assert guard.with_db("batch 1", action) == "committed"
    else:
        with pytest.raises(raised):
            guard.with_db("batch 1", action)
    assert assignment.calls == ["pause", "resume"] and answers == []


def test_storable_text_never_refused() -> None:
    assert writes.storable("a\x00b\ud800c") == "a\\x00b\\ud800c"
    assert writes.storable("x" * 10, 4) == "xxxx"
    assert writes.storable(None) is None


def test_event_ids_per_transition() -> None:
    from adpipe.budget.status import event_id as status_event_id

    first = status_event_id("ad-1", "2026-11-22")
    assert first == status_event_id("ad-1", "2026-11-22", 1) == event_id("ad-1", "2026-11-22")
    assert len({first, status_event_id("ad-1", "2026-11-22", 2), status_event_id("ad-1", "2026-11-22", 3)}) == 3


def test_budget_settings() -> None:
    s = load_settings({"ADPIPE_HOME": "/tmp/x"})
    assert (s.budget_group, s.budget_period, s.budget_batch_size) == ("adpipe-budget", "day", 2000)
    assert (s.budget_default_cpm_micros, s.budget_default_cpc_micros, s.budget_default_budget_micros) == (
        2_000_000,
        500_000,
        100_000_000,
    )
    # KIP-848's protocol, a 6 s session and a heartbeat every 1.2 s, unless told otherwise.
    assert (s.budget_group_protocol, s.budget_session_timeout_ms, s.budget_heartbeat_interval_ms) == (
        "consumer", 6000, 1200)
    s = load_settings({"ADPIPE_BUDGET_GROUP_PROTOCOL": "classic", "ADPIPE_BUDGET_SESSION_TIMEOUT_MS": "30000"})
    assert (s.budget_group_protocol, s.budget_heartbeat_interval_ms) == ("classic", 6000)
    s = load_settings({"ADPIPE_BUDGET_DEFAULT_BUDGET": "unlimited", "ADPIPE_BUDGET_DEFAULT_CPM": "0.000001"})
    assert s.budget_default_budget_micros is None and s.budget_default_cpm_micros == 1
    for env in (
        {"ADPIPE_BUDGET_PERIOD": "week"},
        {"ADPIPE_BUDGET_DEFAULT_CPC": "0.1234567"},
        {"ADPIPE_BUDGET_SESSION_TIMEOUT_MS": "100"},
        {"ADPIPE_BUDGET_GROUP_PROTOCOL": "eager"},
        {"ADPIPE_BUDGET_BATCH_SIZE": "0"},
    ):
        with pytest.raises(SettingsError):
            load_settings(env)


# ------------------------------------------------------------- SQL on SQLite


def test_pricing_file_and_resolution(sqlite_budget, tmp_path: Path) -> None:
    _settings, engine = sqlite_budget
    csv_path = tmp_path / "prices.csv"
    csv_path.write_text(
        "scope,key,campaign_id,cpm,cpc,budget\n"
        "campaign,cmp-1,,3.000001,,50\n"
        "ad,ad-1,cmp-1,,0.25,\n"
        "ad,ad-2,,1.5,,\n"
        "default,ignored,,2.00,0.50,10.00\n"
    )
    rows = pricing.read_price_file(csv_path)
    assert [(r.scope, r.key) for r in rows] == [("campaign", "cmp-1"), ("ad", "ad-1"), ("ad", "ad-2"), ("default", "*")]
    with engine.begin() as conn:
        assert pricing.upsert_prices(conn, rows) == 4
        prices = pricing.resolve_prices(conn, ["ad-1", "ad-2", "ad-3"])
    assert prices["ad-1"] == Price(3_000_001, 250_000, 50_000_000)  # cpm and budget from its campaign
    assert prices["ad-2"] == Price(1_500_000, 500_000, 10_000_000)  # no campaign: default cpc and budget
    assert prices["ad-3"] == Price(2_000_000, 500_000, 10_000_000)  # default row


@pytest.mark.parametrize(
    "body",
    [
        "scope,key\nregion,x\n",
        "scope,key,cpm\nad,ad-1,-1\n",
        "scope,key,cpm,cpc\ndefault,*,2.00,\n",
        "key,cpm\nad-1,2\n",
    ],
)
def test_pricing_file_rejects(tmp_path: Path, body: str) -> None:
    path = tmp_path / "p.csv"
    path.write_text(body)
    with pytest.raises(pricing.PricingError):
        pricing.read_price_file(path)


def _rows(engine: sa.Engine, table: sa.Table) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(table)).mappings()]


def test_apply_batch_ledger_spend_offsets_pauses(sqlite_budget) -> None:
    settings, engine = sqlite_budget
    msgs = [
        FakeMessage(0, 0, _agg(record_uuid="u-1", impressions=1000, clicks=2)),  # 2.00 + 1.00
        FakeMessage(0, 1, _agg(record_uuid="u-1", impressions=1000, clicks=2)),  # same uuid: no-op
        FakeMessage(0, 2, b"{broken"),  # quarantined
        FakeMessage(1, 5, _agg(record_uuid="u-2", window_start="2026-11-22T12:35:00Z", impressions=1, clicks=14)),
        # 0.002 + 7.00 -> reaches 10.00
        FakeMessage(1, 6, _agg(record_uuid="u-3", ad_id="ad-2", window_start="2026-11-23T00:00:00Z", clicks=0)),
    ]
    with engine.begin() as conn:
        result = apply_batch(conn, settings, "aggs", msgs, {0: None, 1: None})
    assert (result.applied, result.duplicates, result.quarantined) == (3, 1, 1)
    assert result.next_offsets == {0: 3, 1: 7}
    assert result.paused == [("ad-1", "2026-11-22")]
    spend = {(r["ad_id"], r["period"]): r["spend_micros"] for r in _rows(engine, db.spend)}
    assert spend == {("ad-1", "2026-11-22"): 3_000_000 + 7_002_000, ("ad-2", "2026-11-23"): 200_000}
    events = _rows(engine, db.events)
    assert [(e["ad_id"], e["event_id"], e["event_type"], e["spend_micros"], e["sent_at"]) for e in events] == [
        ("ad-1", event_id("ad-1", "2026-11-22"), "ad_paused", 10_002_000, None)
    ]
    assert [(r["ad_id"], r["state"], r["generation"]) for r in _rows(engine, db.status)] == [("ad-1", "paused", 1)]
    assert len(_rows(engine, db.quarantine)) == 1

    # The same records again (a replay): nothing changes but the already-applied count.
    with engine.begin() as conn:
        again = apply_batch(conn, settings, "aggs", msgs, {0: 3, 1: 7})
    assert (again.applied, again.already_applied, again.paused) == (0, 5, [])
    # A replay under another group (no offsets): the ledger makes every record a no-op.
    other = settings.with_overrides(budget_group="other")
    with engine.begin() as conn:
        replay = apply_batch(conn, other, "aggs", msgs, {0: None, 1: None})
    assert (replay.applied, replay.duplicates, replay.quarantined, replay.paused) == (0, 4, 1, [])
    assert {(r["ad_id"], r["period"]): r["spend_micros"] for r in _rows(engine, db.spend)} == spend

    # An instance whose view of a partition is stale (another one moved it) applies nothing there.
    with engine.begin() as conn:
        stale = apply_batch(conn, settings, "aggs", [FakeMessage(0, 1, _agg(record_uuid="u-9"))], {0: 1})
    assert stale.stale_partitions == {0: 3} and stale.applied == 0 and stale.next_offsets == {}

    rows = report(settings)
    assert rows is not None
    assert [(r.ad_id, r.period, r.spend_micros, r.budget_micros, r.status) for r in rows] == [
        ("ad-1", "2026-11-22", 10_002_000, 10_000_000, "paused"),
        ("ad-2", "2026-11-23", 200_000, 10_000_000, "active"),
    ]
    assert "total spend 10.202000" in format_report(rows)


def test_report_is_read_only_without_database(tmp_path: Path) -> None:
    settings = load_settings({"ADPIPE_HOME": str(tmp_path)})
    assert report(settings) is None
    assert not (tmp_path / "budget.db").exists()


def test_verify_budget_check_skips_without_a_budget_database(tmp_path: Path) -> None:
    from adpipe.budget import verify as budget_verify

    settings = load_settings({"ADPIPE_HOME": str(tmp_path)})
    result = budget_verify.check(settings)
    assert (result["status"], result["ok"]) == ("skipped", True)
    assert not (tmp_path / "budget.db").exists()


def test_verify_budget_check_skips_when_the_group_consumed_nothing(sqlite_budget) -> None:
    from adpipe.budget import verify as budget_verify

    settings, _engine = sqlite_budget
    result = budget_verify.check(settings)
    assert result["status"] == "skipped" and "consumed nothing" in result["why"]


def test_conflicting_duplicates_are_quarantined(sqlite_budget) -> None:
    settings, engine = sqlite_budget
    with engine.begin() as conn:
        first = apply_batch(conn, settings, "aggs", [FakeMessage(0, 0, _agg(record_uuid="u-1", clicks=1))], {})
    assert first.applied == 1
    msgs = [
        FakeMessage(0, 1, _agg(record_uuid="u-1", clicks=1)),  # the same: a duplicate
        FakeMessage(0, 2, _agg(record_uuid="u-1", clicks=9)),  # other counts than the charged copy
        FakeMessage(0, 3, _agg(record_uuid="u-2", window_start="2026-11-22T12:35:00Z", clicks=2)),
        # other counts than a copy in this batch
        FakeMessage(0, 4, _agg(record_uuid="u-2", window_start="2026-11-22T12:35:00Z", clicks=3)),
    ]
    with engine.begin() as conn:
        result = apply_batch(conn, settings, "aggs", msgs, {0: 1})
    assert (result.applied, result.duplicates, result.conflicts) == (1, 1, 2)
    rows = {r["kafka_offset"]: r for r in _rows(engine, db.quarantine)}
    assert {o: (r["kind"], r["record_uuid"]) for o, r in rows.items()} == {
        2: ("conflict", "u-1"),
        4: ("conflict", "u-2"),
    }
    assert "clicks=9" in rows[2]["reason"] and "earlier copy (aggs/0/1)" in rows[2]["reason"]
    assert "earlier copy (aggs/0/3)" in rows[4]["reason"]
    # Only the charged copies count: 100 impressions x 2.00 / 1000 + clicks x 0.50.
    spend = {r["ad_id"]: r["spend_micros"] for r in _rows(engine, db.spend)}
    assert spend == {"ad-1": 200_000 + 500_000 + 200_000 + 1_000_000}


def test_budget_changes_pause_and_resume_once(sqlite_budget, tmp_path: Path) -> None:
    from adpipe.budget import status

    settings, engine = sqlite_budget  # default budget 10.00
    msgs = [FakeMessage(0, 0, _agg(record_uuid="u-1", impressions=0, clicks=16))]  # 8.00
    with engine.begin() as conn:
        assert apply_batch(conn, settings, "aggs", msgs, {}).paused == []

    def reprice(budget: str) -> list[tuple[str, int]]:
        with engine.begin() as conn:
            pricing.upsert_prices(conn, [pricing.PriceRow("ad", "ad-1", None, None, None, parse_micros(budget))])
            return [(t.event_type, t.generation) for t in status.settle_pricing(conn) or []]

    assert reprice("5.00") == [("ad_paused", 1)]  # lowered below the spend: paused now
    with engine.begin() as conn:
        assert status.settle_pricing(conn) is None  # the same pricing: nothing to settle
    assert reprice("5.00") == []
    assert reprice("20.00") == [("ad_resumed", 2)]  # raised above it: resumed, once
    assert reprice("30.00") == []
    assert reprice("8.00") == [("ad_paused", 3)]  # spend == budget: reached
    events = _rows(engine, db.events)
    assert [(e["event_type"], e["generation"], e["cause"]) for e in events] == [
        ("ad_paused", 1, "budget_change"),
        ("ad_resumed", 2, "budget_change"),
        ("ad_paused", 3, "budget_change"),
    ]
    assert len({e["event_id"] for e in events}) == 3
    assert [(r["state"], r["generation"]) for r in _rows(engine, db.status)] == [("paused", 3)]


def test_prune_keeps_spend_and_moves_sums(sqlite_budget, monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import UTC, datetime

    from adpipe.budget import retention

    settings, engine = sqlite_budget
    msgs = [
        FakeMessage(0, i, _agg(record_uuid=f"u-{i}", window_start=f"2026-11-22T12:3{i}:00Z", clicks=1))
        for i in range(3)
    ]
    with engine.begin() as conn:
        apply_batch(conn, settings, "aggs", msgs, {})
        conn.execute(
            sa.update(db.ledger)
            .where(db.ledger.c.record_uuid != "u-2")
            .values(applied_at=datetime(2026, 1, 1, tzinfo=UTC))
        )
        conn.execute(
            sa.update(db.windows)
            .where(db.windows.c.record_uuid != "u-2")
            .values(updated_at=datetime(2026, 1, 1, tzinfo=UTC))
        )
    monkeypatch.setattr(retention, "topic_retention_ms", lambda _s, _t: 7 * 24 * 3600 * 1000)
    now = datetime(2026, 11, 24, tzinfo=UTC)
    assert (retention.prune(settings, dry_run=True, now=now).rows, len(_rows(engine, db.windows))) == (2, 3)
    assert len(_rows(engine, db.ledger)) == 3
    result = retention.prune(settings, now=now)
    assert (result.rows, result.spend_micros) == (2, 2 * 700_000)  # 100 x 2.00 / 1000 + 1 x 0.50, twice
    assert [r["record_uuid"] for r in _rows(engine, db.ledger)] == ["u-2"]
    assert result.windows == 2 and [r["record_uuid"] for r in _rows(engine, db.windows)] == ["u-2"]
    assert [(r["ad_id"], r["spend_micros"], r["records"]) for r in _rows(engine, db.ledger_pruned)] == [
        ("ad-1", 1_400_000, 2)
    ]
    assert [r["spend_micros"] for r in _rows(engine, db.spend)] == [2_100_000]
    assert retention.prune(settings, now=now).rows == 0
    monkeypatch.setattr(retention, "topic_retention_ms", lambda _s, _t: -1)
    assert retention.prune(settings, now=now).cutoff is None


@pytest.mark.parametrize(
    ("values", "literal"),
    [
        (["ad-1", "2026-11-22T12:34:00Z"], '{"ad-1","2026-11-22T12:34:00Z"}'),
        (["NULL", "", "a,b{c}"], '{"NULL","","a,b{c}"}'),
        ([12, -3, 0], "{12,-3,0}"),
        ([], "{}"),
        (['say "hi"', "back\\slash"], '{"say \\"hi\\"","back\\\\slash"}'),
        (["x", None, 5], '{"x",NULL,5}'),
        ([None], "{NULL}"),
    ],
)
def test_pg_array_literal_quotes_what_must_be_quoted(values: list, literal: str) -> None:
    assert writes.pg_array_literal(iter(values)) == literal


def test_pg_array_literal_refuses_what_it_cannot_write() -> None:
    for value in (True, 1.5, b"x"):
        with pytest.raises(TypeError):
            writes.pg_array_literal(["a", value])
    with pytest.raises(TypeError):
        writes.pg_array_literal([1, True])


def test_the_stream_writes_the_one_declared_aggregate_record_and_the_budget_parses_it() -> None:
    from datetime import UTC, datetime

    from adpipe import schemas as S
    from adpipe.stream.job import aggregate_record

    settings = load_settings({"ADPIPE_HOME": "/tmp/adpipe-unused", "ADPIPE_JOB_ID": "j"})
    start = datetime(2026, 11, 22, 12, 5, tzinfo=UTC)
    row = {"ad_id": "ad-7", "window_start": start, "window_end": start.replace(minute=6), "impressions": 3, "clicks": 1}
    value = aggregate_record(settings, row, 4).value
    assert list(json.loads(value)) == S.AGGREGATE_RECORD.fieldNames()
    parsed = parse_aggregate(value)
    assert parsed.counts() == ("ad-7", "2026-11-22T12:05:00Z", 3, 1)
