"""adpipe chaos: the seeded fault schedule and the independent check, on
hand-made records (the check must catch a lost, a doubled and a wrong one)."""

from __future__ import annotations

import json

import pytest
from adpipe import kafka_io
from adpipe.tools import chaos
from adpipe.tools.chaos import check as chaos_check

from tests.unit.helpers import aggregate

SUMMARY = {
    "messages": 7,
    "malformed": 1,
    "counts": [
        {"ad_id": "ad-1", "window_start": "2026-11-22T12:00:00Z", "event_type": "impression", "events": 3},
        {"ad_id": "ad-1", "window_start": "2026-11-22T12:00:00Z", "event_type": "click", "events": 1},
        {"ad_id": "ad-2", "window_start": "2026-11-22T12:01:00Z", "event_type": "impression", "events": 1},
        # The closer's window: never closed, never judged.
        {"ad_id": "ad-9", "window_start": "2026-11-22T14:02:00Z", "event_type": "impression", "events": 1},
    ],
    "late_events": [
        {"event_id": "e-late", "ad_id": "ad-2", "event_type": "click", "window_start": "2026-11-22T11:58:00Z"}
    ],
}
CLOSER = "2026-11-22T14:02:00Z"


def _late(event_id: str, ad: str, event_type: str, event_time: object) -> bytes:
    return json.dumps({"event_id": event_id, "ad_id": ad, "event_type": event_type, "event_time": event_time}).encode()


GOOD_AGGREGATES = [aggregate("ad-1", "2026-11-22T12:00:00Z", 3, 1), aggregate("ad-2", "2026-11-22T12:01:00Z", 1, 0)]
# 11:58:30 in a zone one hour east, as the contract allows.
GOOD_LATE = [_late("e-late", "ad-2", "click", "2026-11-22T12:58:30.000+01:00")]


def truth() -> chaos_check.Truth:
    return chaos_check.Truth.from_summaries([SUMMARY], closed_before=CLOSER)


def test_exact_output_passes() -> None:
    result = chaos_check.check_events(truth(), GOOD_AGGREGATES, GOOD_LATE, ["t/0/5"])
    assert result["ok"] and (result["lost"], result["duplicated"]) == (0, 0)
    assert result["events_counted"] == 6 and truth().distinct_events == 6


def test_a_lost_event_a_doubled_window_and_a_doubled_late_event_are_caught() -> None:
    lost = chaos_check.check_events(
        truth(), [aggregate("ad-1", "2026-11-22T12:00:00Z", 2, 1), GOOD_AGGREGATES[1]], GOOD_LATE, ["t/0/5"]
    )
    assert (lost["ok"], lost["lost"], lost["duplicated"]) == (False, 1, 0)
    doubled = chaos_check.check_events(truth(), [*GOOD_AGGREGATES, GOOD_AGGREGATES[0]], GOOD_LATE, ["t/0/5"])
    assert not doubled["ok"] and doubled["duplicated"] == 1 + 4  # one extra copy, four extra events
    late_twice = chaos_check.check_events(truth(), GOOD_AGGREGATES, GOOD_LATE * 2, ["t/0/5"])
    assert not late_twice["ok"] and late_twice["duplicated"] == 1
    # A late listing of an event that was also counted: one too many.
    counted_and_late = chaos_check.check_events(
        truth(), GOOD_AGGREGATES, [*GOOD_LATE, _late("e-x", "ad-1", "impression", 1795348800000)], ["t/0/5"]
    )
    assert not counted_and_late["ok"] and counted_and_late["duplicated"] == 1


def test_the_dlq_must_hold_each_malformed_message_once() -> None:
    assert chaos_check.check_events(truth(), GOOD_AGGREGATES, GOOD_LATE, [])["lost"] == 1
    twice = chaos_check.check_events(truth(), GOOD_AGGREGATES, GOOD_LATE, ["t/0/5", "t/0/5"])
    assert (twice["ok"], twice["duplicated"]) == (False, 1)


def test_spend_is_checked_to_the_micro_unit_once_per_record_uuid() -> None:
    prices = (2_000_000, 500_000)  # CPM 2.00, CPC 0.50
    # 3 impressions at CPM 2: 6,000 micro-units; a click 500,000.
    expected = [("ad-1", "2026-11-22", 506_000, 1), ("ad-2", "2026-11-22", 2_000, 1)]
    assert chaos_check.check_spend(GOOD_AGGREGATES, expected, prices)["ok"]
    # A second copy of a record_uuid is charged once.
    assert chaos_check.check_spend([*GOOD_AGGREGATES, GOOD_AGGREGATES[0]], expected, prices)["ok"]
    off_by_one = [("ad-1", "2026-11-22", 506_001, 1), expected[1]]
    assert not chaos_check.check_spend(GOOD_AGGREGATES, off_by_one, prices)["ok"]
    assert not chaos_check.check_spend(GOOD_AGGREGATES, expected[:1], prices)["ok"]


def test_spend_of_a_window_is_its_latest_revision() -> None:
    prices = (2_000_000, 500_000)  # CPM 2.00, CPC 0.50

    def rev(uuid: str, revision: int, impressions: int, clicks: int) -> bytes:
        return json.dumps({"record_uuid": uuid, "ad_id": "ad-1", "window_start": "2026-11-22T10:00:00Z",
                           "impressions": impressions, "clicks": clicks, "revision": revision}).encode()

    # Revision 2 (10 impressions, 1 click: 520,000) costs the window; revision 1 read after it is not charged.
    aggregates = [rev("r0", 0, 3, 0), rev("r2", 2, 10, 1), rev("r1", 1, 5, 0), rev("r2", 2, 10, 1)]
    assert chaos_check.check_spend(aggregates, [("ad-1", "2026-11-22", 520_000, 2)], prices)["ok"]
    assert not chaos_check.check_spend(aggregates, [("ad-1", "2026-11-22", 526_000, 2)], prices)["ok"]


def test_charge_rounds_half_to_even() -> None:
    assert chaos_check.charge_micros(1, 0, 2_500, 0) == 2  # 2.5 -> 2
    assert chaos_check.charge_micros(3, 0, 2_500, 0) == 8  # 7.5 -> 8
    assert chaos_check.charge_micros(0, 2, 0, 7) == 14


def test_the_schedule_replays_from_its_seed() -> None:
    spec = chaos.ChaosSpec(events=1000, duration_s=600, fault_interval_s=10)
    kinds = (chaos.STREAM_KILL, chaos.BROKER_KILL, chaos.BUDGET_KILL)
    first = chaos.fault_schedule(7, spec, kinds)
    assert first == chaos.fault_schedule(7, spec, kinds)
    assert first != chaos.fault_schedule(8, spec, kinds)
    assert 40 <= len(first) <= 120 and {f.kind for f in first} == set(kinds)
    assert all(0 < f.at_s < 600 for f in first) and [f.at_s for f in first] == sorted(f.at_s for f in first)
    assert all(spec.down_s[0] <= f.down_s <= spec.down_s[1] for f in first)


def test_java_string_hash_matches_java() -> None:
    # Values from Java's "...".hashCode().
    assert kafka_io.java_string_hash("") == 0
    assert kafka_io.java_string_hash("a") == 97
    assert kafka_io.java_string_hash("hello") == 99162322
    assert kafka_io.java_string_hash("adpipe-agg-region-local-ad-aggregates") == _java_hash(
        "adpipe-agg-region-local-ad-aggregates"
    )


def test_the_coordinator_partition_is_javas_abs_of_the_hash_not_a_mask() -> None:
    # "sink-a" hashes negative: Math.abs and a 0x7fffffff mask give
    # different partitions of four (Kafka uses Math.abs).
    h = kafka_io.java_string_hash("sink-a")
    assert h < 0 and abs(h) % 4 != (h & 0x7FFFFFFF) % 4
    assert kafka_io.coordinator_partition("sink-a", 4) == abs(h) % 4 == 1
    assert kafka_io.coordinator_partition("hello", 4) == 99162322 % 4


def _java_hash(text: str) -> int:
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) % 2**32
    return h - 2**32 if h >= 2**31 else h


def test_percentiles_and_the_report_table() -> None:
    assert chaos_check.percentile([], 0.5) is None
    assert chaos_check.percentile([5.0, 1.0, 3.0], 0.5) == 3.0
    assert chaos_check.percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    faults = [
        {"kind": "stream_kill", "recovery_s": 30.0},
        {"kind": "stream_kill", "recovery_s": 40.0},
        {"kind": "broker_sigkill", "recovery_s": None},
    ]
    summary = chaos_check.summarize_faults(faults)
    assert summary["stream_kill"] == {
        "planned": 2,  # none given: as injected
        "injected": 2,
        "recovered": 2,
        "recovery_p50_s": 30.0,
        "recovery_p99_s": 40.0,
        "recovery_max_s": 40.0,
    }
    assert summary["broker_sigkill"]["recovered"] == 0


@pytest.mark.parametrize("bad", [{"events": 0}, {"duration_s": 0}, {"fault_interval_s": -1}])
def test_a_spec_out_of_range_is_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        chaos.ChaosSpec(**bad)


def test_the_report_table_shows_planned_and_injected_faults_and_parts_left_down() -> None:
    report = {
        "run_id": "r1",
        "seed": 7,
        "events": {"sent_messages": 10, "distinct_events": 8, "malformed": 1},
        "brokers": 3,
        "spark_master": "local[2]",
        "duration_s": 60.0,
        "faults": chaos_check.summarize_faults([{"kind": "load_kill", "recovery_s": 5.0}], {"load_kill": 5}),
        "fault_log": [{"kind": "load_kill", "phase": "drain"}],
        "restarts": {"stream": 1},
        "max_stream_lag": 0,
        "stream_stalls_killed": 0,
        "drain_s": 3.0,
        "check": {"lost": 0, "duplicated": 0, "aggregates": 4, "late_listed": 1, "late_justified": 1, "dlq": 1},
        "tables": {"ok": True, "hours": ["2026-11-22T12"]},
        "spend": {"ok": True, "actual_micros": 12},
        "parts_down": ["spark worker 1 (BindException)"],
        "verdict": "SHORT: load_kill: injected 1 of 5 planned",
    }
    table = chaos_check.render_table(report)
    assert "load_kill                    5        1         1" in table
    assert "total                        5        1" in table
    assert "(of which 1 load kill(s) in the drain" in table
    assert "left down: spark worker 1 (BindException)" in table
    assert "1 late (1 justified)" in table and table.endswith("verdict: SHORT: load_kill: injected 1 of 5 planned")
