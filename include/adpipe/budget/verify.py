"""The budget part of ``adpipe verify``: spend per ad in the budget database
against spend recomputed independently from the aggregates topic.

Independent of the service's batch code path: the aggregates are read with
a plain read_committed consumer (``kafka_io.read_topic``), parsed and
deduped by record_uuid here, priced from a plain read of the pricing table
resolved here, and summed here. Shared with the service is only the price
definition, ``adpipe.budget.money.spend_micros`` (a pure function pinned by unit
tests to hand-computed values). Only how far the service has got (its
offsets per partition in the database) is taken from the service, as the
stream check takes the stream job's watermark; records beyond it are
reported as lag."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import sqlalchemy as sa
from confluent_kafka import KafkaException
from sqlalchemy.exc import OperationalError

from adpipe import kafka_io
from adpipe.budget.money import Price, period_of, spend_micros
from adpipe.settings import Settings

LIST_LIMIT = 50


def _skipped(why: str) -> dict:
    return {"status": "skipped", "ok": True, "why": why, "problems": 0}


def _error(exc: BaseException) -> dict:
    return {"status": "error", "ok": False, "why": f"{type(exc).__name__}: {str(exc).splitlines()[0]}", "problems": 1}


def _expected_prices(conn: sa.Connection) -> tuple[dict[str, dict], dict[str, dict], dict | None]:
    rows = conn.execute(
        sa.text("SELECT scope, key, campaign_id, cpm_micros, cpc_micros, budget_micros FROM budget_pricing")
    ).mappings()
    ads: dict[str, dict] = {}
    campaigns: dict[str, dict] = {}
    default = None
    for r in rows:
        if r["scope"] == "ad":
            ads[r["key"]] = dict(r)
        elif r["scope"] == "campaign":
            campaigns[r["key"]] = dict(r)
        else:
            default = dict(r)
    return ads, campaigns, default


def _price(ad: str, ads: dict, campaigns: dict, default: dict) -> Price:
    own = ads.get(ad) or {}
    campaign = campaigns.get(own.get("campaign_id") or "") or {}

    def pick(col: str) -> int | None:
        for row in (own, campaign, default):
            if row.get(col) is not None:
                return row[col]
        return None

    return Price(pick("cpm_micros") or 0, pick("cpc_micros") or 0, pick("budget_micros"))


def check(settings: Settings) -> dict:
    """The budget section of the verify report; ``ok`` is True when skipped
    (no budget database or no ledger for this run)."""
    url = settings.budget_db
    if url.startswith("sqlite"):
        path = sa.engine.make_url(url).database
        if not path or not Path(path).exists():
            return _skipped(f"no budget database ({url})")
    engine = sa.create_engine(url)
    try:
        try:
            with engine.connect() as conn:
                if not sa.inspect(conn).has_table("budget_ledger"):
                    return _skipped("the budget database has no ledger")
                return _check(settings, conn)
        except OperationalError as exc:
            if "does not exist" in str(exc):
                return _skipped("the budget database does not exist")
            return _error(exc)
        except Exception as exc:  # noqa: BLE001 - the report says why; verify must finish
            return _error(exc)
    finally:
        engine.dispose()


def _check(settings: Settings, conn: sa.Connection) -> dict:
    topic = settings.topics.aggregates
    group = settings.budget_group
    consumed = {
        p: o
        for p, o in conn.execute(
            sa.text("SELECT kafka_partition, next_offset FROM budget_offsets WHERE group_id = :g AND topic = :t"),
            {"g": group, "t": topic},
        )
    }
    if not consumed:
        return _skipped(f"consumer group {group} has consumed nothing of {topic}")

    # The aggregates the service has read, read again independently.
    first: dict[str, dict] = {}
    copies: Counter[str] = Counter()
    conflicting: list[str] = []
    malformed = 0
    lag = 0
    for rec in kafka_io.read_topic(settings.kafka_bootstrap, topic):
        if rec.offset >= consumed.get(rec.partition, 0):
            lag += 1
            continue
        try:
            body = json.loads(rec.value or b"")
            agg = (
                str(body["record_uuid"]),
                str(body["ad_id"]),
                period_of(body["window_start"], settings.budget_period),
                body["impressions"],
                body["clicks"],
            )
            if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in agg[3:]):
                raise ValueError("counts")
        except (ValueError, KeyError, TypeError, AttributeError):
            malformed += 1
            continue
        copies[agg[0]] += 1
        if agg[0] in first:
            if first[agg[0]]["agg"] != agg:
                conflicting.append(agg[0])
            continue
        first[agg[0]] = {"agg": agg}

    ads, campaigns, default = _expected_prices(conn)
    if default is None:
        return {"status": "error", "ok": False, "why": "no default pricing row", "problems": 1}
    expected: dict[tuple[str, str], int] = defaultdict(int)
    prices: dict[str, Price] = {}
    for entry in first.values():
        _uuid, ad, period, impressions, clicks = entry["agg"]
        price = prices.setdefault(ad, _price(ad, ads, campaigns, default))
        expected[(ad, period)] += spend_micros(impressions, clicks, price)

    actual = {(a, p): s for a, p, s in conn.execute(sa.text("SELECT ad_id, period, spend_micros FROM budget_spend"))}
    ledger_rows = conn.execute(sa.text("SELECT count(*) FROM budget_ledger")).scalar_one()
    quarantined = conn.execute(
        sa.text("SELECT count(*) FROM budget_quarantine WHERE group_id = :g AND kafka_topic = :t"),
        {"g": group, "t": topic},
    ).scalar_one()

    def per_ad(spend: dict[tuple[str, str], int]) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for (ad, _period), micros in spend.items():
            totals[ad] += micros
        return totals

    exp_ad, act_ad = per_ad(expected), per_ad(actual)
    wrong = [
        {"ad_id": ad, "expected_micros": exp_ad.get(ad, 0), "actual_micros": act_ad.get(ad, 0)}
        for ad in sorted(set(exp_ad) | set(act_ad))
        if exp_ad.get(ad, 0) != act_ad.get(ad, 0)
    ]
    wrong_periods = [
        {"ad_id": a, "period": p, "expected_micros": expected.get((a, p), 0), "actual_micros": actual.get((a, p), 0)}
        for a, p in sorted(set(expected) | set(actual))
        if expected.get((a, p), 0) != actual.get((a, p), 0)
    ]

    # Pauses: every (ad, period) at or over its budget, once; events once in the topic.
    expected_paused = {
        key for key, micros in expected.items() if (b := prices[key[0]].budget_micros) is not None and micros >= b
    }
    pause_rows = conn.execute(sa.text("SELECT ad_id, period, event_id, sent_at FROM budget_pauses")).all()
    paused = {(a, p) for a, p, _e, _s in pause_rows}
    pending = sum(1 for *_x, sent in pause_rows if sent is None)
    event_counts: Counter[tuple[str, str]] = Counter()
    try:
        for rec in kafka_io.read_topic(settings.kafka_bootstrap, settings.topics.budget_events):
            try:
                body = json.loads(rec.value or b"")
                event_counts[(body["ad_id"], body["period"])] += 1
            except (ValueError, KeyError, TypeError):
                event_counts[("?", "?")] += 1
    except KafkaException as exc:  # no budget-events topic: nothing was published
        if pause_rows:
            raise RuntimeError(f"cannot read {settings.topics.budget_events}: {exc}") from exc
    sent = {(a, p) for a, p, _e, s in pause_rows if s is not None}
    events_duplicated = sorted(k for k, n in event_counts.items() if n > 1)
    events_missing = sorted(sent - set(event_counts))
    events_unexpected = sorted(set(event_counts) - paused)

    problems = (
        len(wrong)
        + len(wrong_periods)
        + len(conflicting)
        + len(expected_paused ^ paused)
        + len(events_duplicated)
        + len(events_missing)
        + len(events_unexpected)
        + (ledger_rows != len(first))
        + (quarantined != malformed)
    )
    return {
        "status": "ok" if problems == 0 else "failed",
        "ok": problems == 0,
        "group": group,
        "consumed_through": dict(sorted(consumed.items())),
        "lag_records": lag,
        "records_read": sum(copies.values()) + malformed,
        "distinct_record_uuids": len(first),
        "duplicate_copies": sum(copies.values()) - len(copies),
        "malformed": malformed,
        "ledger_rows": ledger_rows,
        "quarantined": quarantined,
        "ads": len(exp_ad),
        "expected_spend_micros": sum(exp_ad.values()),
        "actual_spend_micros": sum(act_ad.values()),
        "wrong_spend": wrong[:LIST_LIMIT],
        "wrong_period_spend": wrong_periods[:LIST_LIMIT],
        "conflicting_copies": conflicting[:LIST_LIMIT],
        "paused": len(paused),
        "paused_missing": [list(k) for k in sorted(expected_paused - paused)][:LIST_LIMIT],
        "paused_unexpected": [list(k) for k in sorted(paused - expected_paused)][:LIST_LIMIT],
        "events": sum(event_counts.values()),
        "events_pending": pending,
        "events_duplicated": [list(k) for k in events_duplicated][:LIST_LIMIT],
        "events_missing": [list(k) for k in events_missing][:LIST_LIMIT],
        "events_unexpected": [list(k) for k in events_unexpected][:LIST_LIMIT],
        "problems": problems,
    }
