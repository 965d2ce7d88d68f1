"""Budget service units: exact money, parsing, pricing resolution and one
batch's SQL on SQLite (the embedded fallback). Expected values are written
out by hand, not recomputed with the code under test."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from adpipe.budget import db
from adpipe.budget.batch import apply_batch, event_id
from adpipe.budget.money import BadAggregate, Price, parse_aggregate, period_of, spend_micros
from adpipe.budget.report import format_report, report
from adpipe.money import MoneyError, format_micros, parse_micros
from adpipe.settings import SettingsError, load_settings

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


def test_budget_settings() -> None:
    s = load_settings({"ADPIPE_HOME": "/tmp/x"})
    assert (s.budget_group, s.budget_period, s.budget_batch_size) == ("adpipe-budget", "day", 500)
    assert (s.budget_default_cpm_micros, s.budget_default_cpc_micros, s.budget_default_budget_micros) == (
        2_000_000,
        500_000,
        100_000_000,
    )
    s = load_settings({"ADPIPE_BUDGET_DEFAULT_BUDGET": "unlimited", "ADPIPE_BUDGET_DEFAULT_CPM": "0.000001"})
    assert s.budget_default_budget_micros is None and s.budget_default_cpm_micros == 1
    for env in (
        {"ADPIPE_BUDGET_PERIOD": "week"},
        {"ADPIPE_BUDGET_DEFAULT_CPC": "0.1234567"},
        {"ADPIPE_BUDGET_SESSION_TIMEOUT_MS": "100"},
        {"ADPIPE_BUDGET_BATCH_SIZE": "0"},
    ):
        with pytest.raises(SettingsError):
            load_settings(env)


# ------------------------------------------------------------- SQL on SQLite


@dataclass
class FakeMessage:
    _partition: int
    _offset: int
    _value: bytes | None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value


@pytest.fixture
def sqlite_budget(tmp_path: Path):  # noqa: ANN201
    settings = load_settings(
        {
            "ADPIPE_HOME": str(tmp_path),
            "ADPIPE_BUDGET_DEFAULT_CPM": "2.00",
            "ADPIPE_BUDGET_DEFAULT_CPC": "0.50",
            "ADPIPE_BUDGET_DEFAULT_BUDGET": "10.00",
        }
    )
    engine = db.make_engine(settings.budget_db)
    db.ensure_schema(engine, settings)
    yield settings, engine
    engine.dispose()


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
    rows = db.read_price_file(csv_path)
    assert [(r.scope, r.key) for r in rows] == [("campaign", "cmp-1"), ("ad", "ad-1"), ("ad", "ad-2"), ("default", "*")]
    with engine.begin() as conn:
        assert db.upsert_prices(conn, rows) == 4
        prices = db.resolve_prices(conn, ["ad-1", "ad-2", "ad-3"])
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
    with pytest.raises(db.PricingError):
        db.read_price_file(path)


def _rows(engine: sa.Engine, table: sa.Table) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(table)).mappings()]


def test_apply_batch_ledger_spend_offsets_pauses(sqlite_budget) -> None:
    settings, engine = sqlite_budget
    msgs = [
        FakeMessage(0, 0, _agg(record_uuid="u-1", impressions=1000, clicks=2)),  # 2.00 + 1.00
        FakeMessage(0, 1, _agg(record_uuid="u-1", impressions=1000, clicks=2)),  # same uuid: no-op
        FakeMessage(0, 2, b"{broken"),  # quarantined
        FakeMessage(1, 5, _agg(record_uuid="u-2", impressions=1, clicks=14)),  # 0.002 + 7.00 -> reaches 10.00
        FakeMessage(1, 6, _agg(record_uuid="u-3", ad_id="ad-2", window_start="2026-11-23T00:00:00Z", clicks=0)),
    ]
    with engine.begin() as conn:
        result = apply_batch(conn, settings, "aggs", msgs, {0: None, 1: None})
    assert (result.applied, result.duplicates, result.quarantined) == (3, 1, 1)
    assert result.next_offsets == {0: 3, 1: 7}
    assert result.paused == [("ad-1", "2026-11-22")]
    spend = {(r["ad_id"], r["period"]): r["spend_micros"] for r in _rows(engine, db.spend)}
    assert spend == {("ad-1", "2026-11-22"): 3_000_000 + 7_002_000, ("ad-2", "2026-11-23"): 200_000}
    pauses = _rows(engine, db.pauses)
    assert [(p["ad_id"], p["event_id"], p["spend_micros"], p["sent_at"]) for p in pauses] == [
        ("ad-1", event_id("ad-1", "2026-11-22"), 10_002_000, None)
    ]
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
