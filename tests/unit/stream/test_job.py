"""The stream job's pure parts: record identity, the aggregate record, and
the DLQ/late routing of one batch's exception rows."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from adpipe import schemas as S
from adpipe.settings import load_settings
from adpipe.stream.job import ExceptionCopies, aggregate_record, iso_utc, record_uuid, value_limits
from adpipe.stream.offset_log import BatchOffsets
from adpipe.stream.sink import OutRecord

# --- record_uuid and iso_utc -------------------------------------------------

NOON = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_record_uuid_is_a_stable_uuid5() -> None:
    value = record_uuid("region-local", "ad-000001", NOON)
    # Pinned: consumers deduplicate on it, so it must never change between releases.
    assert value == "642a194a-8dd8-5646-aab9-489275eb6560"
    assert record_uuid("region-local", "ad-000001", NOON) == value
    parsed = uuid.UUID(value)
    assert (parsed.version, parsed.variant) == (5, uuid.RFC_4122)


NOON_MS = 1_795_348_800_000  # 2026-11-22T12:00:00Z


def test_record_uuid_same_window_in_any_representation() -> None:
    expected = "642a194a-8dd8-5646-aab9-489275eb6560"
    assert record_uuid("region-local", "ad-000001", NOON_MS) == expected
    plus_one = timezone(timedelta(hours=1))
    assert record_uuid("region-local", "ad-000001", datetime(2026, 11, 22, 13, 0, tzinfo=plus_one)) == expected


def test_record_uuid_differs_by_job_ad_and_window() -> None:
    values = {
        record_uuid("region-local", "ad-000001", NOON),
        record_uuid("region-eu", "ad-000001", NOON),
        record_uuid("region-local", "ad-000002", NOON),
        record_uuid("region-local", "ad-000001", NOON + timedelta(minutes=1)),
    }
    assert len(values) == 4


def test_iso_utc() -> None:
    assert iso_utc(NOON_MS + 62_999) == "2026-11-22T12:01:02Z"
    assert iso_utc(0) == "1970-01-01T00:00:00Z"
    assert iso_utc(datetime(2026, 11, 22, 12, 1, 2, 999_999, tzinfo=UTC)) == "2026-11-22T12:01:02Z"
    minus_five = timezone(timedelta(hours=-5))
    assert iso_utc(datetime(2026, 11, 22, 21, 30, tzinfo=minus_five)) == "2026-11-23T02:30:00Z"


def test_a_naive_datetime_is_refused_not_read_in_the_hosts_zone() -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        iso_utc(datetime(2026, 11, 22, 12, 0))  # noqa: DTZ001
    with pytest.raises(ValueError, match="naive datetime"):
        record_uuid("region-local", "ad-000001", datetime(2026, 11, 22, 12, 0))  # noqa: DTZ001


def test_aggregate_record() -> None:
    settings = load_settings({"ADPIPE_JOB_ID": "region-local"})
    row = {
        "ad_id": "ad-000001",
        "window_start": NOON_MS,
        "window_end": NOON_MS + 60_000,
        "impressions": 7,
        "clicks": 2,
    }
    record = aggregate_record(settings, row, 12)
    assert (record.topic, record.key) == ("ad-aggregates", b"ad-000001")
    assert json.loads(record.value) == {
        "record_uuid": "642a194a-8dd8-5646-aab9-489275eb6560",
        "ad_id": "ad-000001",
        "window_start": "2026-11-22T12:00:00Z",
        "window_end": "2026-11-22T12:01:00Z",
        "impressions": 7,
        "clicks": 2,
        "revision": 0,
    }
    assert list(record.headers) == [
        ("adpipe.kind", b"aggregate"),
        ("adpipe.job", b"region-local"),
        ("adpipe.batch", b"12"),
    ]


def test_a_revision_keeps_its_window_and_has_a_record_uuid_of_its_own() -> None:
    settings = load_settings({"ADPIPE_JOB_ID": "region-local"})
    row = {"ad_id": "ad-000001", "window_start": NOON_MS, "window_end": NOON_MS + 60_000, "impressions": 9, "clicks": 3}
    first = json.loads(aggregate_record(settings, row, 12).value)
    second = json.loads(aggregate_record(settings, {**row, "revision": 2}, 14).value)
    assert first["record_uuid"] == "642a194a-8dd8-5646-aab9-489275eb6560"  # revision 0: as before revisions
    assert second == {**first, "record_uuid": record_uuid("region-local", "ad-000001", NOON_MS, 2), "revision": 2}
    assert len({record_uuid("region-local", "ad-000001", NOON_MS, r) for r in range(4)}) == 4




# --- exception copies --------------------------------------------------------


def exception_records(  # noqa: ANN201
    settings,  # noqa: ANN001
    rows: list[dict],
    offsets: BatchOffsets,
    limits: dict | None = None,
):
    """The copies of rows given in (partition, offset) order, and the counts."""
    copies = ExceptionCopies(settings, offsets.batch_id, WATERMARK_MS, limits or {})
    records = list(copies.records(sorted(rows, key=lambda r: (r["partition"], r["offset"]))))
    return records, copies.dlq, copies.late

OFFSETS = BatchOffsets(batch_id=7, topic="ad-events", start={0: 10, 1: 20}, end={0: 30, 1: 40}, spark_watermark_ms=8)
WATERMARK_MS = 1_795_349_070_000


def exception_row(
    partition: int,
    offset: int,
    value: bytes | None,
    reason: str | None = None,
    event_id: str | None = None,
    ad_id: str | None = None,
    key: bytes | None = b"raw-key",
    event_ms: int | None = 1,
    kind: str | None = None,
    first_event_ms: int | None = None,
) -> dict:
    return {
        "kind": kind or ("late" if reason is None else "malformed"),
        "first_event_ms": first_event_ms,
        "key": bytearray(key) if key is not None else None,
        "value": bytearray(value) if value is not None else None,
        "topic": "ad-events",
        "partition": partition,
        "offset": offset,
        "event_id": event_id,
        "ad_id": ad_id,
        "event_ms": event_ms if reason is None else None,
        "reject_reason": reason,
    }


def test_exception_records_route_dlq_and_late() -> None:
    settings = load_settings({"ADPIPE_JOB_ID": "region-eu"})
    late_value = b'{"event_id":"e-1","ad_id":"ad-9","event_type":"click","event_time":1}'
    rows = [
        exception_row(1, 25, late_value, event_id="e-1", ad_id="ad-9"),
        exception_row(0, 12, b"{not json", reason=S.REASON_NOT_JSON, key=b"\xff\x00"),
        exception_row(0, 14, None, reason=S.REASON_NOT_JSON, key=None),
    ]
    records, dlq, late = exception_records(settings, rows, OFFSETS)
    assert (dlq, late) == (2, 1)
    assert records == [
        OutRecord(
            "ad-events-dlq",
            b"\xff\x00",
            b"{not json",
            [
                ("adpipe.kind", b"dlq"),
                ("adpipe.reason", b"not_json"),
                ("adpipe.source", b"ad-events/0/12"),
                ("adpipe.job", b"region-eu"),
                ("adpipe.batch", b"7"),
            ],
        ),
        OutRecord(
            "ad-events-dlq",
            None,
            b"",
            [
                ("adpipe.kind", b"dlq"),
                ("adpipe.reason", b"not_json"),
                ("adpipe.source", b"ad-events/0/14"),
                ("adpipe.job", b"region-eu"),
                ("adpipe.batch", b"7"),
            ],
        ),
        OutRecord(
            "ad-events-late",
            b"ad-9",
            late_value,
            [
                ("adpipe.kind", b"late"),
                ("adpipe.reason", b"late"),
                ("adpipe.source", b"ad-events/1/25"),
                ("adpipe.event_id", b"e-1"),
                ("adpipe.event_time_ms", b"1"),
                ("adpipe.watermark_ms", b"1795349070000"),
                ("adpipe.job", b"region-eu"),
                ("adpipe.batch", b"7"),
            ],
        ),
    ]
    assert all(type(r.value) is bytes for r in records)


def test_a_conflicting_copy_goes_to_the_dlq_with_both_event_times() -> None:
    settings = load_settings({"ADPIPE_JOB_ID": "region-eu"})
    value = b'{"event_id":"e-1","ad_id":"ad-9","event_type":"click","event_time":120000}'
    rows = [exception_row(1, 3, value, event_id="e-1", ad_id="ad-9", event_ms=120_000, kind="conflict",
                          first_event_ms=1_000)]
    records, dlq, late = exception_records(settings, rows, OFFSETS)
    assert (dlq, late) == (1, 0)
    assert records == [
        OutRecord(
            "ad-events-dlq",
            b"raw-key",
            value,
            [
                ("adpipe.kind", b"dlq"),
                ("adpipe.reason", b"conflicting_duplicate"),
                ("adpipe.source", b"ad-events/1/3"),
                ("adpipe.event_id", b"e-1"),
                ("adpipe.event_time_ms", b"120000"),
                ("adpipe.first_event_time_ms", b"1000"),
                ("adpipe.job", b"region-eu"),
                ("adpipe.batch", b"7"),
            ],
        )
    ]


def test_copies_over_their_topics_limit_are_truncated_with_what_they_were() -> None:
    settings = load_settings({"ADPIPE_JOB_ID": "region-eu"})
    big = b'{"event_id":"e-9","ad_id":"ad-9","event_type":"click","event_time":1,"pad":"' + b"x" * 5000 + b'"}'
    rows = [
        exception_row(0, 3, big, event_id="e-9", ad_id="ad-9"),  # late
        exception_row(0, 4, b"[" + b"1," * 3000 + b"1]", reason=S.REASON_NOT_OBJECT, key=b"k" * 5000),
        exception_row(0, 5, b"{not json", reason=S.REASON_NOT_JSON),  # small: whole
    ]
    limits = {"ad-events-dlq": 2048, "ad-events-late": 4096}
    records, dlq, late = exception_records(settings, rows, OFFSETS, limits)
    assert (dlq, late) == (2, 1)
    by_source = {dict(r.headers)["adpipe.source"]: r for r in records}
    late_copy, dlq_copy, small = by_source[b"ad-events/0/3"], by_source[b"ad-events/0/4"], by_source[b"ad-events/0/5"]
    # Key, value and headers together fill the limit: the value keeps what room is left.
    assert late_copy.topic == "ad-events-late"
    assert late_copy.value == big[: 4096 - _weight(late_copy.key, late_copy.headers)]
    late_headers = dict(late_copy.headers)
    assert late_headers["adpipe.reason"] == b"oversized"
    assert late_headers["adpipe.original_reason"] == b"late"
    assert late_headers["adpipe.original_size"] == str(len(big)).encode()
    # The event stays named though its JSON is cut.
    assert (late_headers["adpipe.event_id"], late_headers["adpipe.event_time_ms"]) == (b"e-9", b"1")
    dlq_headers = dict(dlq_copy.headers)
    assert len(dlq_copy.key) == 1024
    assert dlq_copy.value == (b"[" + b"1," * 3000)[: 2048 - _weight(dlq_copy.key, dlq_copy.headers)]
    assert (dlq_headers["adpipe.reason"], dlq_headers["adpipe.original_reason"]) == (b"oversized", b"not_object")
    assert dlq_headers["adpipe.original_size"] == b"6003"  # 1 + 3000 * 2 + 2
    assert dict(small.headers)["adpipe.reason"] == b"not_json" and small.value == b"{not json"
    assert "adpipe.original_size" not in dict(small.headers)


def _weight(key: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    """Key and headers' bytes, added up here by hand."""
    return len(key or b"") + sum(len(name) + len(value) for name, value in headers)


def test_a_copy_is_truncated_when_its_key_and_headers_make_it_too_large() -> None:
    """A small value with a 600 KB key (the broker took the raw record) is
    over a 1 MB topic's room too once copied whole with a 600 KB value: the
    key counts; a copy whose key, value and headers fit stays whole."""
    settings = load_settings({"ADPIPE_JOB_ID": "region-eu"})
    huge_key = b"k" * 600_000
    rows = [
        exception_row(0, 1, b"x" * 500_000, reason=S.REASON_NOT_JSON, key=huge_key),
        exception_row(0, 2, b"x" * 10, reason=S.REASON_NOT_JSON, key=huge_key),
    ]
    limit = 1_048_588 - 16_384
    records, dlq, _late = exception_records(settings, rows, OFFSETS, {"ad-events-dlq": limit})
    assert dlq == 2
    big, small = records
    assert dict(big.headers)["adpipe.reason"] == b"oversized"
    assert dict(big.headers)["adpipe.original_size"] == b"500000"
    # The key is cut; the value then fits whole in the room left.
    assert len(big.key) == 1024 and big.value == b"x" * 500_000
    assert _weight(big.key, big.headers) + len(big.value) <= limit
    assert (small.key, small.value, dict(small.headers)["adpipe.reason"]) == (huge_key, b"x" * 10, b"not_json")
    assert _weight(small.key, small.headers) + len(small.value) <= limit


def test_value_limits_leave_room_for_the_rest_of_the_record() -> None:
    assert value_limits({"dlq": 1_048_588, "tiny": 100}) == {"dlq": 1_048_588 - 16_384, "tiny": 4_096}


def test_exception_records_of_a_clean_batch() -> None:
    assert exception_records(load_settings({}), [], OFFSETS) == ([], 0, 0)


def test_exception_records_use_the_configured_topics() -> None:
    settings = load_settings({"ADPIPE_TOPIC_DLQ": "my-dlq", "ADPIPE_TOPIC_LATE": "my-late"})
    rows = [exception_row(0, 1, b"[]", reason=S.REASON_NOT_OBJECT), exception_row(0, 2, b"{}", event_id="e", ad_id="a")]
    records, _, _ = exception_records(settings, rows, OFFSETS)
    assert [r.topic for r in records] == ["my-dlq", "my-late"]
