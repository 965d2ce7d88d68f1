"""verify --hour's comparison of the tables with Kafka (pure part)."""

from __future__ import annotations

from adpipe.tools import table_verify


def test_table_compare_names_missing_unexpected_duplicated_and_wrong_rows() -> None:
    expected = {"aggregates": {"u1": ("ad-1", "w", 3, 0), "u2": ("ad-2", "w", 1, 1)}, "raw": {"e1": (), "e2": ()}}
    actual = {
        "aggregates": [("u1", ("ad-1", "w", 4, 0)), ("u3", ("ad-3", "w", 1, 0))],
        "raw": [("e1", ()), ("e1", ()), ("e2", ())],
    }
    report = table_verify.compare(expected, actual)
    agg, raw = report["aggregates"], report["raw"]
    assert (agg["missing"], agg["unexpected"], [w["key"] for w in agg["wrong"]]) == (["u2"], ["u3"], ["u1"])
    assert raw["duplicated"] == ["e1"] and raw["missing_count"] == 0
    assert report["problems"] == 4 and not report["ok"]
    assert table_verify.compare({"raw": {"e1": ()}}, {"raw": [("e1", ())]})["ok"]


def test_minute_counts_from_raw_kafka_records_catch_an_aggregate_that_agrees_only_with_itself() -> None:
    # The aggregate row matches its own Kafka record (same uuid and counts),
    # but the raw records of that minute say 3 impressions, not 2.
    record = ("ad-1", "2026-11-22T12:00:00Z", 2, 1)
    expected = {"aggregates": {"u1": record}, "minutes": {("eu", "ad-1", "2026-11-22T12:00:00Z"): (3, 1)}}
    actual = {
        "aggregates": [("u1", record)],
        "minutes": [(("eu", "ad-1", "2026-11-22T12:00:00Z"), (2, 1))],
    }
    report = table_verify.compare(expected, actual)
    assert report["aggregates"]["wrong_count"] == 0
    assert report["minutes"]["wrong"] == [
        {"key": ("eu", "ad-1", "2026-11-22T12:00:00Z"), "expected": (3, 1), "table": (2, 1)}
    ]
    assert not report["ok"]
