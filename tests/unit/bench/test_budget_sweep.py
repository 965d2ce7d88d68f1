"""make bench's budget sweep, its pure parts (bench.logs, bench.stages): the
reading of the service's log, the synthetic aggregates and the spend they
must come to."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from adpipe.budget.aggregate import parse_aggregate

from bench.logs import budget_log_stats
from bench.stages import _side_by_side, expected_spend, synthetic_aggregates

LOG = """\
2026-11-24 08:30:00,100 INFO adpipe.budget: budget service: group g reading t (read_committed) into \
postgresql+psycopg2://adpipe:***@127.0.0.1:5433/x; budget period day; batch size 500
2026-11-24 08:30:00,200 INFO adpipe.budget: assigned partitions [0, 1, 2, 3] of t at database offsets {}
2026-11-24 08:30:03,250 INFO adpipe.budget: batch 1: 500 records: 498 applied (spend +12.500000), 2 duplicate \
record_uuids skipped, 0 already applied, 0 quarantined, 0 ads paused; offsets {0: 500}; 250 ms
2026-11-24 08:30:03,300 WARNING adpipe.budget: batch 2: database transaction failed (attempt 1): deadlock
2026-11-24 08:30:04,260 INFO adpipe.budget: batch 2: 300 records: 300 applied (spend +7.000000), 0 duplicate \
record_uuids skipped, 0 already applied, 0 quarantined, 2 ads paused (ad-000001@2026-11-22, ad-000002@2026-11-22); \
offsets {0: 650, 1: 150}; 150.25 ms
2026-11-24 08:30:04,290 INFO adpipe.budget: published 2 budget events (round 1) to e: ad-000001@2026-11-22, \
ad-000002@2026-11-22
2026-11-24 08:30:04,300 INFO adpipe.budget: --once: every assigned partition [0, 1, 2, 3] is drained
2026-11-24 08:30:04,600 INFO adpipe.budget: budget service stopped: 2 batches, already_applied 0, applied 798, \
duplicates 2, paused 2, quarantined 0, records 800
"""


def test_instances_side_by_side_are_timed_from_the_first_batch_to_the_last_end() -> None:
    # A second instance whose two batches start 1 s later: 1,000 records in 100 ms each.
    second = LOG.replace("08:30:03,250", "08:30:04,100").replace("250 ms", "100 ms")
    second = second.replace("08:30:04,260", "08:30:04,200").replace("150.25 ms", "100 ms")
    merged = _side_by_side([budget_log_stats(LOG), budget_log_stats(second)])
    assert merged["batches"] == 4
    assert merged["records"] == 1600 and merged["applied"] == 2 * 798
    assert merged["batch_s"] == 0.6
    assert merged["max_batch_ms"] == 250.0
    assert merged["mean_batch_records"] == 400.0
    # 03.000 (the first one's first start) to 04.100 - 100 ms + 0.2 s = 04.200
    assert merged["drain_s"] == 1.2
    assert merged["totals"]["applied"] == 2 * 798


def test_budget_log_stats_reads_batches_start_and_stop() -> None:
    stats = budget_log_stats(LOG)
    assert stats == {
        "batches": 2,
        "records": 800,
        "applied": 798,
        "batch_s": 0.4,
        "mean_batch_ms": 200.1,
        "max_batch_ms": 250.0,
        "mean_batch_records": 400.0,
        # from the first batch's start (03.250 - 250 ms) to the last one's end
        # (04.260), less the 0.86 s the last poll waited: 250 + 150.25 ms
        "drain_s": 0.4,
        "drain_window": (datetime(2026, 11, 24, 8, 30, 3), datetime(2026, 11, 24, 8, 30, 3, 400000)),
        "service_s": 4.5,
        "batch_size_logged": 500,
        "publish_rounds": 1,
        "events_published": 2,
        "stopped_batches": 2,
        "totals": {
            "already_applied": 0,
            "applied": 798,
            "duplicates": 2,
            "paused": 2,
            "quarantined": 0,
            "records": 800,
        },
    }


def test_budget_log_stats_is_none_where_a_line_is_missing_or_changed() -> None:
    assert budget_log_stats("") == {
        "drain_window": None,
        "batches": None,
        "records": None,
        "applied": None,
        "batch_s": None,
        "mean_batch_ms": None,
        "max_batch_ms": None,
        "mean_batch_records": None,
        "drain_s": None,
        "service_s": None,
        "batch_size_logged": None,
        "publish_rounds": 0,
        "events_published": 0,
        "stopped_batches": None,
        "totals": None,
    }
    # No timestamps, no "applied", no duration: what is there is still read.
    changed = "adpipe.budget: batch 1: 40 records, all new\nadpipe.budget: batch 2: 10 records; 5 ms\n"
    stats = budget_log_stats(changed)
    assert (stats["batches"], stats["records"], stats["mean_batch_records"]) == (2, 50, 25.0)
    assert (stats["applied"], stats["batch_s"], stats["drain_s"], stats["service_s"]) == (None, None, None, None)
    # One batch: the topic drained in that batch's own time.
    one = "2026-11-24 08:30:01,000 INFO adpipe.budget: batch 1: 7 records: 7 applied; 12 ms\n"
    assert budget_log_stats(one)["drain_s"] == 0.012


def test_expected_spend_counts_each_record_uuid_once_and_rounds_half_to_even() -> None:
    def agg(record_uuid: str, impressions: int, clicks: int) -> dict:
        return {"record_uuid": record_uuid, "impressions": impressions, "clicks": clicks}

    # cpm 2.500001: 1 impression costs 2500.001 micro-units -> 2500; 500 cost
    # 1_250_000.5 -> 1_250_000 (half to even); 1500 cost 3_750_001.5 -> 3_750_002.
    aggregates = [agg("a", 1, 0), agg("b", 500, 0), agg("c", 1500, 2), agg("a", 1, 0), agg("d", 0, 0)]
    assert expected_spend(aggregates, 2_500_001, 500_000) == (4, 2500 + 1_250_000 + 3_750_002 + 1_000_000)
    # The defaults: cpm 2.00, cpc 0.50.
    assert expected_spend([agg("x", 1000, 3)], 2_000_000, 500_000) == (1, 2_000_000 + 1_500_000)


def test_synthetic_aggregates_follow_the_contract_with_some_repeats() -> None:
    values = synthetic_aggregates(2000, ads=50, seed=3, duplicate_rate=0.05)
    assert values == synthetic_aggregates(2000, ads=50, seed=3, duplicate_rate=0.05)  # seeded
    distinct = {v["record_uuid"]: v for v in values}
    assert len(distinct) == 2000
    assert 2000 < len(values) < 2000 * 1.1
    for value in values:
        assert value == distinct[value["record_uuid"]]  # a repeat is the same record
        parsed = parse_aggregate(json.dumps(value).encode())
        assert parsed.ad_id.startswith("ad-") and len(parsed.ad_id) == 9
        start = datetime.fromisoformat(value["window_start"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(value["window_end"].replace("Z", "+00:00"))
        assert start.tzinfo == UTC and (end - start).total_seconds() == 60
        assert value["window_start"].endswith("Z") and 0 <= value["clicks"] <= value["impressions"]
    assert len({v["ad_id"] for v in values}) == 50
    # 50 ads a minute: 2000 distinct aggregates span 40 minutes.
    assert len({v["window_start"] for v in values}) == 40
