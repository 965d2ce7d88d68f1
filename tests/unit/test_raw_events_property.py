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
from adpipe.tools.verify import classify_record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.unit.raw_kafka import RECORD_MS, SKEW_MS, TOPIC, kafka_frame

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


def spark_verdicts(spark: SparkSession, values: list[bytes | None]) -> list[str | tuple]:
    rows = (
        raw_events.parse_raw_events(kafka_frame(spark, [(b"k", v, TOPIC, 0, i) for i, v in enumerate(values)]), SKEW_MS)
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


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.large_base_example,
        HealthCheck.data_too_large,
        HealthCheck.too_slow,
    ],
)
@given(st.lists(raw_values(), min_size=40, max_size=60))
def test_spark_and_python_decide_the_same_on_any_value(spark: SparkSession, values: list[bytes | None]) -> None:
    disagreements = [
        (v, s, p) for v, s, p in zip(values, spark_verdicts(spark, values), map(python_verdict, values)) if s != p
    ]
    assert disagreements == []
