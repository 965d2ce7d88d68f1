"""Property: the job's Spark reading of a raw event (adpipe.raw_events) and
verify's plain-Python reading (adpipe.tools.verify.classify_record) decide
the same on any value: the same reason, or the same event.

Values are generated around the contract: events whose fields take every
JSON type, event times that are nearly ISO-8601 or nearly epoch
milliseconds, text before and after the JSON, and raw byte noise. Each
example is a batch parsed by one Spark job (a Spark job per value would be
slow). ``derandomize`` keeps CI on the same examples; run with
``--hypothesis-seed`` to explore."""

from __future__ import annotations

import json

from adpipe import raw_events
from adpipe import schemas as S
from adpipe.tools.verify import classify_record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.unit.helpers import RECORD_MS, SKEW_MS, TOPIC, kafka_frame

ISO_PIECES = st.sampled_from(
    ["2026-11-22", "1969-12-31", "9999-12-31", "0001-01-01", "2026-02-30", "2026-13-01", "26-11-22", "2026-11-22 "]
)
TIME_PIECES = st.sampled_from(
    ["T12:00", "T12:00:00", "T23:59:59.999", "T12:00:00.123456789", " 12:00:00", "T24:00:00", ""]
)
ZONE_PIECES = st.sampled_from(["Z", "+01:00", "-0130", "+05", "+25:00", "z", "", "UTC", "Z\n", "+01:00:00"])

iso_times = st.builds(lambda d, t, z: d + t + z, ISO_PIECES, TIME_PIECES, ZONE_PIECES)
epoch_times = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=0, max_value=RECORD_MS + 2 * SKEW_MS),
    st.sampled_from([0, RECORD_MS, RECORD_MS + SKEW_MS, RECORD_MS + SKEW_MS + 1, 253_402_300_799_999, 2**64]),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
any_json = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def _mostly(draw: st.DrawFn, good: st.SearchStrategy, bad: st.SearchStrategy) -> object:
    """A field that is usually right, so that later fields get checked too."""
    return draw(good) if draw(st.integers(0, 9)) < 8 else draw(bad)


@st.composite
def events(draw: st.DrawFn) -> dict:
    body = {
        "event_id": _mostly(draw, st.text(min_size=1, max_size=6), any_json),
        "ad_id": _mostly(draw, st.text(min_size=1, max_size=6), any_json),
        "event_type": _mostly(draw, st.sampled_from(["impression", "click"]), st.sampled_from(["Click", "view", ""])),
        "event_time": draw(st.one_of(iso_times, epoch_times, any_json)),
    }
    if draw(st.integers(0, 9)) == 0:
        del body[draw(st.sampled_from(list(body)))]
    extra = draw(st.dictionaries(st.sampled_from(["campaign_id", "pad", "x"]), any_json, max_size=2))
    return {**body, **extra}


@st.composite
def raw_values(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.sampled_from(["event"] * 6 + ["any", "noise", "none"]))
    if kind == "none":
        return None
    if kind == "noise":
        return draw(st.binary(max_size=24))
    text = json.dumps(draw(events()) if kind == "event" else draw(any_json))
    before = _mostly(draw, st.just(""), st.sampled_from([" ", "\n", "\ufeff", "x"]))
    garbage = st.sampled_from(["}", "]", "],0", ",", " x", "{}", "\x00", "1"])
    after = _mostly(draw, st.sampled_from(["", " ", "\r\n"]), garbage)
    return (before + text + after).encode()


JSON_WS = st.sampled_from(["", "", " ", "\n", "\t", "\r\n"])
NOT_JSON_WS = st.sampled_from(["\x0b", "\u00a0", "\f"])
plain_text = st.text(st.characters(codec="ascii", exclude_characters='"\\', min_codepoint=32), min_size=1, max_size=6)
raw_text = st.text(max_size=6).map(lambda t: f'"{t}"')  # as written: quotes, backslashes, NULs unescaped
digits = st.sampled_from(["0", "7", "0123", "-5", "1.0", "1e3", "999999999999999", "1000000000000000"])


@st.composite
def canonical_texts(draw: st.DrawFn) -> bytes:
    """Text in the shape of the fast path's patterns (adpipe.raw_events),
    mostly matching them, with their edges: any text in the strings
    (escaped or not), numbers for strings, digits that are not JSON
    integers, whitespace that is not JSON's, a missing campaign_id,
    something after the object."""
    ws = st.one_of(JSON_WS, NOT_JSON_WS) if draw(st.integers(0, 9)) == 0 else JSON_WS

    def string(good: st.SearchStrategy) -> str:
        kind = draw(st.sampled_from(["plain"] * 6 + ["raw", "escaped", "unicode", "number"]))
        if kind == "plain":
            return json.dumps(draw(good))
        if kind == "raw":
            return draw(raw_text)
        value = draw(st.text(max_size=6)) if kind != "number" else draw(st.integers())
        return json.dumps(value, ensure_ascii=kind == "escaped")

    def member(name: str, value: str) -> str:
        return f'{draw(ws)}"{name}"{draw(ws)}:{draw(ws)}{value}{draw(ws)}'

    members = [member("event_id", string(plain_text)), member("ad_id", string(plain_text))]
    if draw(st.booleans()):
        members.append(member("campaign_id", string(st.text(max_size=4))))
    event_type = _mostly(draw, st.sampled_from(S.EVENT_TYPES), st.sampled_from(["Click", "", "impression "]))
    members.append(member("event_type", json.dumps(event_type)))
    event_time = draw(
        st.one_of(
            iso_times.map(json.dumps),
            epoch_times.map(str),
            digits,
            st.builds(lambda d: str(RECORD_MS - d), st.integers(0, 10**6)),
        )
    )
    members.append(member("event_time", event_time))
    after = _mostly(draw, st.just(""), st.sampled_from(["}", " x", "\x00", ",", "\n"]))
    return (draw(ws) + "{" + ",".join(members) + "}" + after).encode()


def spark_verdicts(spark: SparkSession, values: list[bytes | None], fast_path: bool = True) -> list[str | tuple]:
    frame = kafka_frame(spark, [(b"k", v, TOPIC, 0, i) for i, v in enumerate(values)])
    rows = (
        raw_events.parse_raw_events(frame, SKEW_MS, fast_path=fast_path)
        .select("offset", "event_id", "ad_id", "event_type", F.unix_millis("event_time").alias("ms"), "reject_reason")
        .orderBy("offset")
        .collect()
    )
    return [r.reject_reason or (r.event_id, r.ad_id, r.event_type, r.ms) for r in rows]


def python_verdict(value: bytes | None) -> str | tuple:
    verdict = classify_record(value, RECORD_MS, SKEW_MS)
    if isinstance(verdict, str):
        return verdict
    return (verdict.event_id, verdict.ad_id, verdict.event_type, verdict.event_ms)


# Each example is a batch of values parsed in one Spark job: few examples,
# the same ones in CI (derandomize), no deadline.
SPARK_BATCHES = settings(
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.large_base_example,
        HealthCheck.data_too_large,
        HealthCheck.too_slow,
    ],
)


@settings(SPARK_BATCHES, max_examples=12)
@given(st.lists(raw_values(), min_size=40, max_size=60))
def test_spark_and_python_decide_the_same_on_any_value(spark: SparkSession, values: list[bytes | None]) -> None:
    disagreements = [
        (v, s, p) for v, s, p in zip(values, spark_verdicts(spark, values), map(python_verdict, values)) if s != p
    ]
    assert disagreements == []


@settings(SPARK_BATCHES, max_examples=10)
@given(st.lists(canonical_texts(), min_size=40, max_size=60))
def test_the_fast_path_decides_as_the_variant_route_and_as_python(spark: SparkSession, values: list[bytes]) -> None:
    fast, variant = spark_verdicts(spark, values), spark_verdicts(spark, values, fast_path=False)
    python = list(map(python_verdict, values))
    assert [(v, f, r) for v, f, r in zip(values, fast, variant) if f != r] == []
    assert [(v, f, p) for v, f, p in zip(values, fast, python) if f != p] == []


# Bytes the JVM reader of the fast path sees before any decoding: invalid
# UTF-8 (a lone continuation byte, an overlong slash, a surrogate, a cut
# sequence) inside an otherwise canonical event, multi-byte text that is
# valid, a NUL and a DEL in a value, a 16-digit time and one at 15 digits.
def _canonical(ad_id: bytes, event_time: bytes = b"1795348800000") -> bytes:
    return b'{"event_id":"e1","ad_id":"' + ad_id + b'","event_type":"click","event_time":' + event_time + b"}"


BYTE_EDGES = [
    _canonical(b"a\x80b"),
    _canonical(b"a\xc0\xafb"),
    _canonical(b"a\xed\xa0\x80b"),
    _canonical(b"a\xe2\x82"),
    _canonical("ad-ü-€-😀".encode()),
    _canonical(b"a\x00b"),
    _canonical(b"a\x7fb"),
    _canonical(b"a", b"1234567890123456"),
    _canonical(b"a", b"123456789012345"),
    _canonical(b"a", b'"2026-11-22T12:00:00Z"'),
    _canonical(b"a", b"0"),
    _canonical(b"a", b"01"),
    _canonical(b"a", b""),
    _canonical(b"a")[:-1],
    _canonical(b"a") + b"\x00",
]


def test_the_fast_path_reads_bytes_as_the_variant_route_and_python_do(spark: SparkSession) -> None:
    fast, variant = spark_verdicts(spark, BYTE_EDGES), spark_verdicts(spark, BYTE_EDGES, fast_path=False)
    python = list(map(python_verdict, BYTE_EDGES))
    assert [(v, f, r) for v, f, r in zip(BYTE_EDGES, fast, variant) if f != r] == []
    assert [(v, f, p) for v, f, p in zip(BYTE_EDGES, fast, python) if f != p] == []
    # Not all of them rejected: the valid multi-byte ad_id and the times read.
    assert fast[4] == ("e1", "ad-ü-€-😀", "click", 1795348800000)
    assert sum(isinstance(f, tuple) for f in fast) >= 4
