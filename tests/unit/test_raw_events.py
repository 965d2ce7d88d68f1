"""The contract's raw-event reading in Spark (adpipe.raw_events) on a table
of cases, and the Python reading (adpipe.tools.verify.classify) held to
the same verdicts, edge cases included."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from adpipe import raw_events
from adpipe import schemas as S
from adpipe.tools.verify import RawEvent, classify, classify_record
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.corpus import bad_raw_values
from tests.unit.helpers import DROP, RECORD_MS, SKEW_MS, TOPIC, body, kafka_frame

# id, raw value, expected reject_reason, expected event_time (naive UTC, as
# Spark returns it), expected epoch milliseconds (classify's reading).
CASES = [
    ("iso_z", body(), None, datetime(2026, 11, 22, 12, 0, 0, 250_000), 1_795_348_800_250),
    (
        "iso_plus_0100",
        body(event_time="2026-11-22T13:00:05+01:00"),
        None,
        datetime(2026, 11, 22, 12, 0, 5),
        1_795_348_805_000,
    ),
    (
        "iso_minus_0130_no_colon",
        body(event_time="2026-11-22T10:30:00.5-0130"),
        None,
        datetime(2026, 11, 22, 12, 0, 0, 500_000),
        1_795_348_800_500,
    ),
    (
        "epoch_ms",
        body(event_time=1_795_348_987_545),
        None,
        datetime(2026, 11, 22, 12, 3, 7, 545_000),
        1_795_348_987_545,
    ),
    ("epoch_zero", body(event_time=0), None, datetime(1970, 1, 1), 0),
    ("click", body(event_type="click"), None, datetime(2026, 11, 22, 12, 0, 0, 250_000), 1_795_348_800_250),
    # The record's own timestamp decides, never the wall clock (RECORD_MS: 13:00Z).
    (
        "event_time_at_the_skew_limit",
        body(event_time=RECORD_MS + SKEW_MS),
        None,
        datetime(2026, 11, 22, 13, 5),
        RECORD_MS + SKEW_MS,
    ),
    ("event_time_past_the_skew", body(event_time=RECORD_MS + SKEW_MS + 1), S.REASON_FUTURE_EVENT_TIME, None, None),
    # Escaped characters that are no C0 control and no lone surrogate: valid.
    ("escaped_surrogate_pair_id", body(ad_id="ad-\U0001f600", event_id="e-\u00e9"), None,
     datetime(2026, 11, 22, 12, 0, 0, 250_000), 1_795_348_800_250),
    ("del_and_tab_outside_the_ids", body(ad_id="ad\x7f", note="a\tb\u0001"), None,
     datetime(2026, 11, 22, 12, 0, 0, 250_000), 1_795_348_800_250),
    ("nul_in_ad_id", body(ad_id="ad\x00x"), S.REASON_BAD_CHARACTERS, None, None),
    ("lone_surrogate_in_campaign_id", body(campaign_id="c\udbff"), S.REASON_BAD_CHARACTERS, None, None),
]
CASE_IDS = [c[0] for c in CASES]


def key_of(offset: int) -> bytes:
    # Not UTF-8 on purpose: keys must come back byte for byte.
    return b"\xff\x00k-" + str(offset).encode()


@pytest.fixture(scope="module")
def parsed(spark: SparkSession) -> dict[int, dict]:
    """The whole table parsed in one Spark job, by offset."""
    rows = [(key_of(i), value, TOPIC, i % 4, i) for i, (_, value, *_rest) in enumerate(CASES)]
    df = kafka_frame(spark, rows)
    return {r["offset"]: r.asDict() for r in raw_events.parse_raw_events(df, SKEW_MS).collect()}


@pytest.mark.parametrize(("offset", "case"), list(enumerate(CASES)), ids=CASE_IDS)
def test_parse_raw_events_reason_and_time(parsed: dict[int, dict], offset: int, case: tuple) -> None:
    _, _, reason, event_time, _ = case
    row = parsed[offset]
    assert row["reject_reason"] == reason
    if reason is None:
        assert row["event_time"] == event_time
        assert row["event_id"] == json.loads(case[1])["event_id"]
        assert row["ad_id"] == json.loads(case[1])["ad_id"]
        assert row["event_type"] == json.loads(case[1])["event_type"]


def test_parse_raw_events_keeps_every_row_and_the_raw_bytes(parsed: dict[int, dict]) -> None:
    assert sorted(parsed) == list(range(len(CASES)))
    for offset, (_, value, *_rest) in enumerate(CASES):
        row = parsed[offset]
        assert bytes(row["key"]) == key_of(offset)
        assert bytes(row["value"]) == value
        assert (row["topic"], row["partition"]) == (TOPIC, offset % 4)


def test_parse_raw_events_output_schema(spark: SparkSession) -> None:
    df = raw_events.parse_raw_events(kafka_frame(spark, []), SKEW_MS)
    assert df.schema == S.PARSED_EVENT


def test_parse_raw_events_null_key_and_null_value(spark: SparkSession) -> None:
    df = kafka_frame(spark, [(None, None, TOPIC, 0, 0)])
    (row,) = raw_events.parse_raw_events(df, SKEW_MS).collect()
    assert (row["key"], row["value"], row["reject_reason"]) == (None, None, S.REASON_NOT_JSON)


@pytest.mark.parametrize(
    ("value", "campaign_id"),
    [
        (body(), "cmp-1"),
        (body(campaign_id=7), None),
        (body(campaign_id={"id": "cmp-1"}), None),
        (body(campaign_id=None), None),
        (body(campaign_id=DROP), None),
    ],
    ids=["string", "number", "object", "null", "missing"],
)
def test_campaign_id_is_null_unless_a_string(spark: SparkSession, value: bytes, campaign_id: str | None) -> None:
    df = kafka_frame(spark, [(b"k", value, TOPIC, 0, 0)])
    (row,) = raw_events.parse_raw_events(df, SKEW_MS).collect()
    # A bad campaign_id does not make the event malformed.
    assert (row["reject_reason"], row["campaign_id"]) == (None, campaign_id)


def test_valid_and_rejected_events_split_the_parsed_rows(parsed: dict[int, dict], spark: SparkSession) -> None:
    rows = [(key_of(i), value, TOPIC, 0, i) for i, (_, value, *_rest) in enumerate(CASES)]
    frame = raw_events.parse_raw_events(kafka_frame(spark, rows), SKEW_MS)
    valid = sorted(r["offset"] for r in raw_events.valid_events(frame).select("offset").collect())
    rejected = sorted(r["offset"] for r in raw_events.rejected_events(frame).select("offset").collect())
    assert valid == [i for i, case in enumerate(CASES) if case[2] is None]
    assert rejected == [i for i, case in enumerate(CASES) if case[2] is not None]


# --- the corpus of bad values (tests/data/raw_events) -----------------------

CORPUS = bad_raw_values()


@pytest.fixture(scope="module")
def corpus_reasons(spark: SparkSession) -> dict[str, str | None]:
    """Spark's reason for every corpus value, in one Spark job."""
    df = kafka_frame(spark, [(b"k", value, TOPIC, 0, i) for i, (_c, _r, value) in enumerate(CORPUS)])
    rows = raw_events.parse_raw_events(df, SKEW_MS).orderBy("offset").collect()
    return {case: row["reject_reason"] for (case, _r, _v), row in zip(CORPUS, rows)}


@pytest.mark.parametrize(("case", "reason", "value"), CORPUS, ids=[c[0] for c in CORPUS])
def test_every_bad_value_gets_its_reason_from_spark_and_from_verify(
    corpus_reasons: dict, case: str, reason: str, value: bytes
) -> None:
    assert corpus_reasons[case] == reason
    assert classify_record(value, RECORD_MS, SKEW_MS) == reason


def test_the_corpus_has_every_reason_of_a_raw_value() -> None:
    # Not a property of one value: oversized (its copy's size), conflicting_duplicate (an earlier copy).
    reasons = {getattr(S, name) for name in dir(S) if name.startswith("REASON_")} - {
        S.REASON_OVERSIZED,
        S.REASON_CONFLICTING_DUPLICATE,
    }
    assert {reason for _c, reason, _v in CORPUS} == reasons
    assert len(CORPUS) >= 40


# --- the Python reading of the contract (verify.classify) -------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_classify_gives_the_table_verdict(case: tuple) -> None:
    _, value, reason, _, event_ms = case
    verdict = classify_record(value, RECORD_MS, SKEW_MS)
    if reason is None:
        event = json.loads(value)
        assert verdict == RawEvent(event["event_id"], event["ad_id"], event["event_type"], event_ms)
    else:
        assert verdict == reason


def test_classify_none_is_not_json() -> None:
    assert classify(None) == S.REASON_NOT_JSON


def test_raw_event_window_start() -> None:
    assert RawEvent("e", "a", "click", 1_795_348_859_999).window_start == "2026-11-22T12:00:00Z"
    assert RawEvent("e", "a", "click", 1_795_348_860_000).window_start == "2026-11-22T12:01:00Z"


def spark_verdict(row: dict) -> str | tuple:
    if row["reject_reason"] is not None:
        return row["reject_reason"]
    return (row["event_id"], row["ad_id"], row["event_type"], row["event_ms"])


def python_verdict(value: bytes | None) -> str | tuple:
    verdict = classify_record(value, RECORD_MS, SKEW_MS)
    if isinstance(verdict, str):
        return verdict
    return (verdict.event_id, verdict.ad_id, verdict.event_type, verdict.event_ms)


def spark_verdicts(spark: SparkSession, values: list[bytes]) -> list[str | tuple]:
    df = kafka_frame(spark, [(b"k", v, TOPIC, 0, i) for i, v in enumerate(values)])
    rows = (
        raw_events.parse_raw_events(df, SKEW_MS)
        # Epoch millis, not the timestamp: Python cannot hold every time Spark can.
        .select(
            "offset", "event_id", "ad_id", "event_type", F.unix_millis("event_time").alias("event_ms"), "reject_reason"
        )
        .orderBy("offset")
        .collect()
    )
    return [spark_verdict(r.asDict()) for r in rows]


def test_spark_and_python_readings_agree_on_the_table(spark: SparkSession) -> None:
    values = [c[1] for c in CASES]
    assert spark_verdicts(spark, values) == [python_verdict(v) for v in values]


def _edge(case_id: str, value: bytes, bug: str | None = None) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
    return pytest.param(value, id=case_id, marks=marks)


def _edge_value(param: object) -> bytes:
    return param.values[0]  # type: ignore[attr-defined]


# Inputs at the edges of the contract. Where the two readings disagree the
# stream job and `adpipe verify` disagree on the same message (a DLQ record
# verify calls unexpected, or an aggregate it calls missing).
EDGE_CASES = [
    _edge("iso_fraction_9_digits", body(event_time="2026-11-22T12:00:59.999999999Z")),
    _edge("iso_space_separator", body(event_time="2026-11-22 12:00:00Z")),
    _edge("iso_plus_hh_only", body(event_time="2026-11-22T13:00:00+01")),
    _edge("iso_before_1970", body(event_time="1969-12-31T23:59:59Z")),
    _edge("json_padded_with_spaces", b'  {"event_id":"e","ad_id":"a","event_type":"click","event_time":1}  '),
    _edge("json_with_bom", b'\xef\xbb\xbf{"event_id":"e","ad_id":"a","event_type":"click","event_time":1}'),
    _edge("iso_without_seconds", body(event_time="2026-11-22T12:00Z")),
    _edge("iso_without_seconds_with_offset", body(event_time="2026-11-22T13:00+01:00")),
    _edge("iso_without_seconds_with_short_offset", body(event_time="2026-11-22T13:00+01")),
    _edge("iso_trailing_newline", body(event_time="2026-11-22T12:00:00Z\n")),
    _edge("iso_trailing_crlf", body(event_time="2026-11-22T12:00:00Z\r\n")),
    _edge("json_trailing_bracket", b'{"event_id":"e","ad_id":"a","event_type":"click","event_time":1}]'),
    _edge("json_trailing_bracket_then_more", b'{"event_id":"e","ad_id":"a","event_type":"click","event_time":1}],0'),
    _edge("json_comma_then_value", b'{"event_id":"e","ad_id":"a","event_type":"click","event_time":1},{"x":1}'),
    _edge("json_trailing_comma", b'{"event_id":"e","ad_id":"a","event_type":"click","event_time":1},'),
    _edge("json_trailing_whitespace", b'{"event_id":"e","ad_id":"a","event_type":"click","event_time":1} \r\n\t'),
    _edge("nul_in_a_string", b'{"event_id":"e\\u0000","ad_id":"a","event_type":"click","event_time":1}'),
]


@pytest.fixture(scope="module")
def edge_verdicts(spark: SparkSession) -> dict[bytes, str | tuple]:
    values = [_edge_value(p) for p in EDGE_CASES]
    return dict(zip(values, spark_verdicts(spark, values)))


@pytest.mark.parametrize("value", EDGE_CASES)
def test_spark_and_python_readings_agree_at_the_edges(edge_verdicts: dict, value: bytes) -> None:
    assert edge_verdicts[value] == python_verdict(value)


CONTRACT_EXAMPLE = b"""{"event_id": "7f7c4f8e-2d4b-4bb0-9d59-0a4f3f0b8a11",
 "ad_id": "ad-000042",
 "campaign_id": "cmp-007",
 "event_type": "impression",
 "event_time": "2026-11-22T12:34:56.789Z"}"""


def test_the_producers_events_and_the_contracts_example_take_the_fast_path(spark: SparkSession) -> None:
    """The events `adpipe produce` writes (every event_time form it mixes)
    and the contract's own example match one of the fast path's patterns, in
    Spark's regex engine; a reordered or padded event does not (it takes the
    variant route, whose verdicts test_raw_events_property compares)."""
    from adpipe.tools.produce import ProduceSpec, plan

    produced = [m.value for m in plan(ProduceSpec(events=200, seed=3)).messages]
    assert {type(json.loads(v)["event_time"]) for v in produced} == {str, int}
    reordered = json.dumps({"ad_id": "a", "event_id": "e", "event_type": "click", "event_time": 0}).encode()
    padded = json.dumps({**json.loads(CONTRACT_EXAMPLE), "pad": 1}).encode()
    values = [*produced, CONTRACT_EXAMPLE, reordered, padded]
    fast = raw_events.fast_path_kind(F.col("value")).isNotNull()
    rows = kafka_frame(spark, [(b"k", v, TOPIC, 0, i) for i, v in enumerate(values)]).select(fast.alias("fast"))
    assert [r.fast for r in rows.orderBy("offset").collect()] == [True] * (len(produced) + 1) + [False, False]


# --- the one length limit of a field (schemas.MAX_FIELD_CHARS) ---------------

AT_LIMIT = "x" * 200  # the contract's limit, written out: not read from the code under test
NON_BMP_AT_LIMIT = "\U0001f600" * 200  # 200 characters, 800 bytes of UTF-8
LENGTH_CASES = [
    ("ad_id_at_limit", body(ad_id=AT_LIMIT), None),
    ("event_id_at_limit", body(event_id=AT_LIMIT), None),
    ("campaign_id_at_limit", body(campaign_id=AT_LIMIT), None),
    ("non_bmp_ad_id_at_limit", json.dumps({**json.loads(body()), "ad_id": NON_BMP_AT_LIMIT}).encode(), None),
    ("ad_id_over", body(ad_id=AT_LIMIT + "x"), S.REASON_FIELD_TOO_LONG),
    ("event_id_over", body(event_id=AT_LIMIT + "x"), S.REASON_FIELD_TOO_LONG),
    ("campaign_id_over", body(campaign_id=AT_LIMIT + "x"), S.REASON_FIELD_TOO_LONG),
    ("ad_id_600k", body(ad_id="a" * 600_000), S.REASON_FIELD_TOO_LONG),
    ("campaign_id_number_is_no_field", body(campaign_id=10**300), None),
]


def test_a_field_over_the_limit_is_malformed_in_spark_and_in_verify(spark: SparkSession) -> None:
    values = [value for _case, value, _reason in LENGTH_CASES]
    spark_reasons = [v if isinstance(v, str) else None for v in spark_verdicts(spark, values)]
    python_reasons = [v if isinstance(v, str) else None for v in map(python_verdict, values)]
    expected = [reason for _case, _value, reason in LENGTH_CASES]
    assert spark_reasons == expected
    assert python_reasons == expected
    assert S.MAX_FIELD_CHARS == len(AT_LIMIT)
