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


def test_the_table_must_hold_each_windows_latest_revision_and_the_history_every_one() -> None:
    # Read from Kafka in this order: w1's revision 1 before its revision 0 (two partitions), w2 before revisions.
    records = [
        {"record_uuid": "u1r1", "ad_id": "ad-1", "window_start": "w1", "impressions": 3, "clicks": 1, "revision": 1},
        {"record_uuid": "u1", "ad_id": "ad-1", "window_start": "w1", "impressions": 2, "clicks": 1, "revision": 0},
        {"record_uuid": "u2", "ad_id": "ad-2", "window_start": "w1", "impressions": 1, "clicks": 0},
    ]
    latest, revisions = table_verify._aggregate_rows(records)
    assert latest == {"u1r1": ("ad-1", "w1", 3, 1, 1), "u2": ("ad-2", "w1", 1, 0, 0)}
    assert revisions == {**latest, "u1": ("ad-1", "w1", 2, 1, 0)}
    # A table left at revision 0: its latest missing, its old one unexpected.
    table = [("u1", revisions["u1"]), ("u2", latest["u2"])]
    report = table_verify.compare({"aggregates": latest}, {"aggregates": table})
    assert report["aggregates"]["missing"] == ["u1r1"] and report["aggregates"]["unexpected"] == ["u1"]


def test_a_revision_counting_more_than_its_windows_latest_is_named() -> None:
    from types import SimpleNamespace as Row

    def row(uuid: str, region: str, impressions: int, clicks: int, revision: int) -> Row:
        return Row(record_uuid=uuid, region=region, ad_id="ad-1", window_start="w1", impressions=impressions,
                   clicks=clicks, revision=revision)

    latest = [row("a1", "eu", 3, 1, 1), row("b0", "us", 9, 9, 0)]
    history = [row("a0", "eu", 2, 1, 0), row("a1", "eu", 3, 1, 1), row("ax", "eu", 2, 2, 0), row("b0", "us", 9, 9, 0)]
    over = table_verify.revisions_over_latest(latest, history)
    # Region us's window has more of both, but it is another window: only eu's extra click is named.
    assert [(o["record_uuid"], o["counts"], o["latest"]) for o in over] == [("ax", [2, 2], [3, 1])]
