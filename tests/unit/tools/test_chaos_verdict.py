"""The chaos verdict judges on-time and late output apart: hand-made raw
records, ledger boundaries, aggregates and late listings, each expectation
worked out by hand below (never with the code under test).

The run: lateness 10 s; one raw partition; the ledger showed batches 0-3.

    offset  event  ad    type        event time  batch  batch's watermark
    0       e1     ad-1  impression  12:00:10    0      0 (the epoch)
    1       e2     ad-1  impression  12:00:20    0
    2       e3     ad-1  impression  12:00:30    0
    3       f1     ad-2  impression  12:01:15    1      12:00:30 - 10 s = 12:00:20
    4       f2     ad-2  click       12:02:20    1
    5       l1     ad-1  click       12:00:40    2      12:02:20 - 10 s = 12:02:10
    6       e2     (a producer's retry of offset 1) 2
    7       g1     ad-2  impression  12:03:30    2      (the closer: not judged)
    8       not JSON                             3      12:03:30 - 10 s = 12:03:20

In batch 2 the 12:00 and 12:01 windows (ends 12:01:00, 12:02:00) have
closed: l1 is late, justified; e2's retry is a repeat, not listed. The
12:02 window closes in batch 3. So a correct output holds ad-1 12:00
(3 impressions), ad-2 12:01 (1 impression), ad-2 12:02 (1 click), one late
listing (l1 at batch 2, watermark 12:02:10) and the malformed record in the
DLQ."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from adpipe.tools.chaos import check as C

from tests.unit.helpers import aggregate

RULES = C.StreamRules(lateness_ms=10_000, max_future_skew_ms=300_000, late_dedupe_retention_ms=86_400_000)
CLOSED_BEFORE = "2026-11-22T12:03:00Z"
M12 = "2026-11-22T12:00:00Z"
M12_01 = "2026-11-22T12:01:00Z"
M12_02 = "2026-11-22T12:02:00Z"


def ms(hh_mm_ss: str) -> int:
    return int(datetime.fromisoformat(f"2026-11-22T{hh_mm_ss}+00:00").timestamp() * 1000)


BROKER_TIME = ms("12:10:00")
WATERMARK_2 = ms("12:02:10")


def _event(event_id: str, ad: str, event_type: str, at: str) -> bytes:
    return json.dumps(
        {"event_id": event_id, "ad_id": ad, "event_type": event_type, "event_time": f"2026-11-22T{at}.000Z"}
    ).encode()


RAW_VALUES = [
    _event("e1", "ad-1", "impression", "12:00:10"),
    _event("e2", "ad-1", "impression", "12:00:20"),
    _event("e3", "ad-1", "impression", "12:00:30"),
    _event("f1", "ad-2", "impression", "12:01:15"),
    _event("f2", "ad-2", "click", "12:02:20"),
    _event("l1", "ad-1", "click", "12:00:40"),
    _event("e2", "ad-1", "impression", "12:00:20"),
    _event("g1", "ad-2", "impression", "12:03:30"),
    b"{not json",
]
LEDGER = [
    C.LedgerBoundary(0, {0: 3}),
    C.LedgerBoundary(1, {0: 5}),
    C.LedgerBoundary(2, {0: 8}),
    C.LedgerBoundary(3, {0: 9}),
]
SUMMARY = {
    "messages": 9,
    "malformed": 1,
    "counts": [
        {"ad_id": "ad-1", "window_start": M12, "event_type": "impression", "events": 3},
        {"ad_id": "ad-2", "window_start": M12_01, "event_type": "impression", "events": 1},
        {"ad_id": "ad-2", "window_start": M12_02, "event_type": "click", "events": 1},
        {"ad_id": "ad-2", "window_start": "2026-11-22T12:03:00Z", "event_type": "impression", "events": 1},
    ],
    "late_events": [{"event_id": "l1", "ad_id": "ad-1", "event_type": "click", "window_start": M12}],
}


def _listing(event_id: str, offset: int, batch: int, watermark_ms: int) -> C.LateListing:
    return C.LateListing(event_id, (0, offset), watermark_ms, batch)


GOOD_AGGREGATES = [aggregate("ad-1", M12, 3, 0), aggregate("ad-2", M12_01, 1, 0), aggregate("ad-2", M12_02, 0, 1)]
GOOD_LATE = [_listing("l1", 5, 2, WATERMARK_2)]
DLQ = ["events/0/8"]


def verdict(
    aggregates: list[bytes], late: list[C.LateListing], rules: C.StreamRules = RULES, ledger: list | None = None
) -> dict:
    raw = C.RawTopic([C.RawRecord(0, offset, BROKER_TIME, value) for offset, value in enumerate(RAW_VALUES)], rules)
    bounds = C.WatermarkBounds(raw, LEDGER if ledger is None else ledger, rules.lateness_ms)
    truth = C.Truth.from_summaries([SUMMARY], closed_before=CLOSED_BEFORE)
    return C.check_stream_output(truth, raw, bounds, aggregates, late, DLQ, rules, CLOSED_BEFORE)


def test_a_correct_run_passes() -> None:
    result = verdict(GOOD_AGGREGATES, GOOD_LATE)
    assert result["problems"] == []
    assert (result["ok"], result["lost"], result["duplicated"]) == (True, 0, 0)
    assert (result["events_counted"], result["late_justified"], result["raw_valid_events"]) == (5, 1, 6)


def test_all_late_output_fails() -> None:
    # Every event listed late, each with the watermark its batch really had:
    # nothing counted, no spend, and yet each event is "somewhere".
    everything_late = [
        _listing("e1", 0, 0, 0),
        _listing("e2", 1, 0, 0),
        _listing("e3", 2, 0, 0),
        _listing("f1", 3, 1, ms("12:00:20")),
        _listing("f2", 4, 1, ms("12:00:20")),
        *GOOD_LATE,
    ]
    result = verdict([], everything_late)
    # Five events belonged in aggregates (lost from them), five listings
    # were not justified (one too many each); l1 is fine.
    assert (result["ok"], result["lost"], result["duplicated"]) == (False, 5, 5)
    assert result["late_unjustified"] == 5


def test_all_late_output_with_forged_watermarks_fails() -> None:
    # The same, each listing claiming batch 2's watermark: the windows of
    # e1..f1 end before it, but their copies were read in batches 0 and 1,
    # whose watermarks were at most 12:00:20; f2's window ends after it.
    forged = [_listing(e, offset, 2, WATERMARK_2) for e, offset in [("e1", 0), ("e2", 1), ("e3", 2), ("f1", 3)]]
    forged += [_listing("f2", 4, 2, WATERMARK_2), *GOOD_LATE]
    result = verdict([], forged)
    assert (result["ok"], result["lost"], result["duplicated"]) == (False, 5, 5)


def test_a_lost_and_a_doubled_event_of_one_key_do_not_cancel_out() -> None:
    # ad-1 12:00 impressions: e3 lost (2 counted, not 3), and e2's retry
    # listed late although its first copy was counted (read in batch 0,
    # window open). The old arithmetic (counts plus listings) says 3 = 3.
    aggregates = [aggregate("ad-1", M12, 2, 0), *GOOD_AGGREGATES[1:]]
    late = [*GOOD_LATE, _listing("e2", 6, 2, WATERMARK_2)]
    result = verdict(aggregates, late)
    assert (result["ok"], result["lost"], result["duplicated"]) == (False, 1, 1)
    assert result["late_doubles"] == 1
    # The sum that cancels, for the record: the aggregates-only check passes it.
    old = C.check_events(
        C.Truth.from_summaries([SUMMARY], closed_before=CLOSED_BEFORE),
        aggregates,
        [_event("l1", "ad-1", "click", "12:00:40"), _event("e2", "ad-1", "impression", "12:00:20")],
        DLQ,
    )
    assert old["ok"]


def test_a_listing_whose_window_its_watermark_had_not_closed_fails() -> None:
    # f2 (window 12:02-12:03) listed in batch 2, whose watermark 12:02:10
    # had not reached 12:03: it belonged in the aggregate, which lacks it.
    aggregates = GOOD_AGGREGATES[:2]
    result = verdict(aggregates, [*GOOD_LATE, _listing("f2", 4, 2, WATERMARK_2)])
    assert (result["ok"], result["lost"], result["duplicated"]) == (False, 1, 1)
    assert any("after its batch's watermark" in p for p in result["problems"])


def test_a_watermark_the_raw_records_do_not_allow_fails() -> None:
    # Batch 2 read offsets 0-4 before it: at most 12:02:20 - 10 s. A header
    # of 12:05:00 is not justified, though l1's window ends before it.
    result = verdict(GOOD_AGGREGATES, [_listing("l1", 5, 2, ms("12:05:00"))])
    assert (result["ok"], result["lost"], result["duplicated"]) == (False, 1, 1)
    assert any("above what the raw records before it allow" in p for p in result["problems"])


def test_a_listing_read_while_its_window_was_open_fails() -> None:
    # f1 listed from batch 2 (header watermark past its window's end), but
    # its only copy is offset 3, read in batch 1 (watermark <= 12:00:20 <
    # 12:02:00): it was counted, so the listing is one too many.
    result = verdict(GOOD_AGGREGATES, [*GOOD_LATE, _listing("f1", 3, 2, WATERMARK_2)])
    assert (result["ok"], result["lost"], result["duplicated"]) == (False, 0, 1)


def test_a_late_event_listed_twice_or_never_sent_fails() -> None:
    twice = verdict(GOOD_AGGREGATES, GOOD_LATE * 2)
    assert (twice["ok"], twice["lost"], twice["duplicated"]) == (False, 0, 1)
    unknown = verdict(GOOD_AGGREGATES, [*GOOD_LATE, _listing("zz", 5, 2, WATERMARK_2)])
    assert (unknown["ok"], unknown["duplicated"]) == (False, 1)


def test_a_relisting_after_the_dedupe_retention_is_allowed() -> None:
    # Retention 60 s: l1's minute was forgotten once the watermark passed
    # 12:01:00 + 60 s = 12:02:00, so a later listing at 12:02:10 is allowed.
    short = C.StreamRules(lateness_ms=10_000, max_future_skew_ms=300_000, late_dedupe_retention_ms=60_000)
    assert verdict(GOOD_AGGREGATES, GOOD_LATE * 2, short)["ok"]


def test_unseen_batch_boundaries_give_a_looser_bound_that_still_holds() -> None:
    # Only batch 3 seen: batch 2's watermark is bounded by every record
    # below offset 9 (12:03:30 - 10 s): the correct run still passes.
    assert verdict(GOOD_AGGREGATES, GOOD_LATE, ledger=[C.LedgerBoundary(3, {0: 9})])["ok"]


def test_a_lost_window_and_a_doubled_window_are_caught() -> None:
    lost = verdict(GOOD_AGGREGATES[1:], GOOD_LATE)
    assert (lost["ok"], lost["lost"], lost["duplicated"]) == (False, 3, 0)
    doubled = verdict([*GOOD_AGGREGATES, GOOD_AGGREGATES[0]], GOOD_LATE)
    assert (doubled["ok"], doubled["duplicated"]) == (False, 1 + 3)  # one extra copy, three extra events


def test_the_raw_topic_must_hold_what_the_producer_sent() -> None:
    raw = C.RawTopic([C.RawRecord(0, 0, BROKER_TIME, RAW_VALUES[0])], RULES)
    truth = C.Truth.from_summaries([SUMMARY], closed_before=CLOSED_BEFORE)
    result = C.check_stream_output(
        truth, raw, C.WatermarkBounds(raw, [], RULES.lateness_ms), [], [], DLQ, RULES, CLOSED_BEFORE
    )
    # Sent 6 judged events, the topic holds e1 only: 5 lost before the job,
    # and e1 is not counted either.
    assert (result["ok"], result["lost"]) == (False, 5 + 1)


def test_parse_event_follows_the_contract() -> None:
    def parse(body: object, timestamp_ms: int = BROKER_TIME) -> C.RawEvent | None:
        return C.parse_event(json.dumps(body).encode(), timestamp_ms, 300_000)

    good = {"event_id": "a", "ad_id": "ad-1", "event_type": "click", "event_time": "2026-11-22T13:00:30+01:00"}
    assert parse(good) == C.RawEvent("a", "ad-1", "click", ms("12:00:30"))
    assert parse({**good, "event_time": ms("12:00:30")}).key == ("ad-1", M12, "click")  # type: ignore[union-attr]
    assert parse({**good, "event_time": True}) is None
    assert parse({**good, "event_time": "2026-11-22T12:00:30"}) is None  # no zone
    assert parse({**good, "event_type": "view"}) is None
    assert parse({**good, "ad_id": "x" * 201}) is None
    assert parse({**good, "ad_id": "x" * 200}) is not None
    # More than 300 s after its record's (broker's) timestamp: malformed.
    assert parse(good, ms("12:00:29") - 300_000) is None
    assert parse(good, ms("12:00:30") - 300_000) is not None
    assert C.parse_event(b"[1]", BROKER_TIME, 0) is None


def test_ledger_boundaries_and_late_headers_are_read() -> None:
    meta = json.dumps({"batch_id": 7, "watermark_ms": 5})
    old = json.dumps({"batch_id": 6})
    assert C.ledger_boundary({0: (10, meta), 1: (4, meta), 2: (3, old)}) == C.LedgerBoundary(7, {0: 10, 1: 4})
    assert C.ledger_boundary({}) is None
    headers = {
        "adpipe.event_id": "l1",
        "adpipe.source": "chaos-x-ad-events/2/41",
        "adpipe.watermark_ms": str(WATERMARK_2),
        "adpipe.batch": "2",
    }
    assert C.LateListing.from_record(b"{trunc", headers) == C.LateListing("l1", (2, 41), WATERMARK_2, 2)
    assert C.LateListing.from_record(b'{"event_id": "x"}', {}) == C.LateListing("x", None, None, None)


def test_a_listing_without_headers_is_not_justified() -> None:
    result = verdict(GOOD_AGGREGATES, [C.LateListing("l1", None, None, None)])
    assert not result["ok"] and result["late_unjustified"] == 1


def test_the_minute_label_is_utc() -> None:
    assert C.minute_label(ms("12:00:59")) == M12
    assert C.minute_label(int(datetime(2026, 11, 22, 12, 1, tzinfo=UTC).timestamp() * 1000)) == M12_01


def test_the_tables_read_with_delta_rs_are_compared_with_kafka() -> None:
    raw = C.RawTopic([C.RawRecord(0, o, BROKER_TIME, v) for o, v in enumerate(RAW_VALUES)], RULES)
    hour = {"2026-11-22T12"}
    at = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    first = {"record_uuid": "u-ad-1-" + M12, "ad_id": "ad-1", "window_start": at, "impressions": 3, "clicks": 0}
    rows = {
        "ad_minute_aggregates": [first],
        "ad_minute_aggregate_revisions": [first],
        # g1 (12:03) is in the hour too: its window is only not judged by the events check.
        "ad_events_raw": [{"event_id": e} for e in ("e1", "e2", "e3", "f1", "f2", "l1", "g1")],
        "ad_events_quarantine": [{"source": "late", "event_key": "l1"}, {"source": "dlq", "event_key": "events/0/8"}],
    }
    good = C.compare_tables(rows, GOOD_AGGREGATES[:1], raw, GOOD_LATE, DLQ, hour)
    assert good["wrong"] == [] and good["ok"]
    raw_twice = {**rows, "ad_events_raw": [*rows["ad_events_raw"], {"event_id": "e1"}]}
    assert C.compare_tables(raw_twice, GOOD_AGGREGATES[:1], raw, GOOD_LATE, DLQ, hour)["wrong"] == [
        "ad_events_raw e1: expected 1, found 2"
    ]
    wrong_count = {**rows, "ad_minute_aggregates": [{**rows["ad_minute_aggregates"][0], "impressions": 2}]}
    assert not C.compare_tables(wrong_count, GOOD_AGGREGATES[:1], raw, GOOD_LATE, DLQ, hour)["ok"]
    no_late = {**rows, "ad_events_quarantine": rows["ad_events_quarantine"][1:]}
    assert not C.compare_tables(no_late, GOOD_AGGREGATES[:1], raw, GOOD_LATE, DLQ, hour)["ok"]
    # A revision of the window: the aggregates table holds the latest, the revisions table both.
    revised = [GOOD_AGGREGATES[0], _revision("ad-1", M12, 3, 1, 1)]
    latest = {**first, "record_uuid": f"u-ad-1-{M12}-r1", "clicks": 1}
    both = {**rows, "ad_minute_aggregates": [latest], "ad_minute_aggregate_revisions": [first, latest]}
    assert C.compare_tables(both, revised, raw, GOOD_LATE, DLQ, hour)["wrong"] == []
    stale = {**both, "ad_minute_aggregates": [first]}
    assert C.compare_tables(stale, revised, raw, GOOD_LATE, DLQ, hour)["wrong"] == [
        f"ad_minute_aggregates ('u-ad-1-{M12}', 'ad-1', '{M12}', 3, 0): expected 0, found 1",
        f"ad_minute_aggregates ('u-ad-1-{M12}-r1', 'ad-1', '{M12}', 3, 1): expected 1, found 0",
    ]
    one_revision = {**both, "ad_minute_aggregate_revisions": [latest]}
    assert not C.compare_tables(one_revision, revised, raw, GOOD_LATE, DLQ, hour)["ok"]


def test_without_deltalake_the_reader_says_why(tmp_path: Path) -> None:
    import importlib.util

    result = C.read_delta_tables(tmp_path)
    assert isinstance(result, str)  # no package, or no table there
    if importlib.util.find_spec("deltalake") is None:
        assert "pin deltalake==1.6.6" in result


def _revision(ad: str, window: str, impressions: int, clicks: int, revision: int) -> bytes:
    body = json.loads(aggregate(ad, window, impressions, clicks, record_uuid=f"u-{ad}-{window}-r{revision}"))
    return json.dumps({**body, "revision": revision}).encode()


LATENESS_2_MIN = C.StreamRules(10_000, 300_000, 86_400_000, allowed_lateness_ms=120_000)


def test_a_late_event_within_the_lateness_counts_in_the_window_s_latest_revision() -> None:
    # l1 (12:00:40) read at 12:02:10, before 12:01:00 + 2 min: it revises 12:00 instead of being listed.
    revised = [*GOOD_AGGREGATES, _revision("ad-1", M12, 3, 1, 1)]
    result = verdict(revised, [], LATENESS_2_MIN)
    assert result["problems"] == []
    assert (result["ok"], result["events_counted"], result["late_justified"]) == (True, 6, 0)


def test_a_listing_before_its_window_s_lateness_passed_fails() -> None:
    result = verdict(GOOD_AGGREGATES, GOOD_LATE, LATENESS_2_MIN)
    assert (result["ok"], result["late_unjustified"]) == (False, 1)
    assert "can be revised until" in result["problems"][0]


def test_a_revision_without_a_new_event_or_with_a_gap_fails() -> None:
    same = [*GOOD_AGGREGATES, _revision("ad-2", M12_01, 1, 0, 1)]
    result = verdict(same, GOOD_LATE)
    assert not result["ok"] and "adds no event" in " ".join(result["problems"])
    gap = [*GOOD_AGGREGATES, _revision("ad-2", M12_01, 1, 0, 2)]
    assert "not 0..1" in " ".join(verdict(gap, GOOD_LATE)["problems"])
    twice = [*GOOD_AGGREGATES, _revision("ad-2", M12_02, 0, 1, 0)]  # revision 0 written again
    result = verdict(twice, GOOD_LATE)
    assert result["duplicated"] == 2  # the record written twice, and its click counted twice
    assert "revision 0 written 2 times" in " ".join(result["problems"])
