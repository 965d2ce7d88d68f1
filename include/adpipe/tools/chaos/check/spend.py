"""The budgets: each ad's spend the sum of its aggregates' charges, to the
micro-unit."""

from __future__ import annotations

import json
from collections import Counter
from decimal import ROUND_HALF_EVEN, Decimal


def charge_micros(impressions: int, clicks: int, cpm_micros: int, cpc_micros: int) -> int:
    """One aggregate's charge: impressions at the CPM (per thousand, rounded
    half to even to the micro-unit) plus clicks at the CPC, in Decimal."""
    per_impressions = (Decimal(impressions) * Decimal(cpm_micros) / Decimal(1000)).quantize(
        Decimal(1), rounding=ROUND_HALF_EVEN
    )
    return int(per_impressions) + clicks * cpc_micros


def check_spend(aggregates: list[bytes], spend_rows: list[tuple[str, str, int, int]], prices: tuple[int, int]) -> dict:
    """``spend_rows``: (ad_id, period, spend_micros, records) from the budget
    database; the period is the aggregate's UTC day. One charge per
    record_uuid (the first copy, as the consumer is idempotent by it) and
    per window (ad_id, window_start) its revisions in the order read, each
    above the one taken before (no revision: 0): the window costs its last
    revision's charge (each revision is charged its difference from the one
    before), and each revision taken is a record."""
    cpm, cpc = prices
    taken: dict[tuple[str, str], tuple[int, int, int]] = {}
    records: Counter[tuple[str, str]] = Counter()
    seen: set[str] = set()
    for value in aggregates:
        body = json.loads(value)
        if body["record_uuid"] in seen:
            continue
        seen.add(body["record_uuid"])
        window = (body["ad_id"], body["window_start"])
        revision = body.get("revision") or 0
        before = taken.get(window)
        if before is not None and revision <= before[0]:
            continue
        taken[window] = (revision, body["impressions"], body["clicks"])
        records[(body["ad_id"], body["window_start"][:10])] += 1
    expected: Counter[tuple[str, str]] = Counter()
    for (ad, window_start), (_revision, impressions, clicks) in taken.items():
        expected[(ad, window_start[:10])] += charge_micros(impressions, clicks, cpm, cpc)
    actual = {(ad, period): (micros, n) for ad, period, micros, n in spend_rows}
    wrong = [
        f"{ad} {period}: spend {actual.get((ad, period), (0, 0))[0]} micro-units over "
        f"{actual.get((ad, period), (0, 0))[1]} aggregates, expected {expected[(ad, period)]} over "
        f"{records[(ad, period)]}"
        for ad, period in sorted(set(expected) | set(actual))
        if actual.get((ad, period), (0, 0)) != (expected[(ad, period)], records[(ad, period)])
    ]
    return {
        "ok": not wrong,
        "ads": len({ad for ad, _ in expected}),
        "expected_micros": sum(expected.values()),
        "actual_micros": sum(m for m, _ in actual.values()),
        "wrong": wrong[:50],
    }
