"""Hours past the input's retention (adpipe.lakehouse.retention): which
hours are reported instead of failed, the line that reports them, and what
a run's audit and result say of them; worked out by hand from the rule."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from adpipe.lakehouse import retention
from adpipe.lakehouse import tables as T
from adpipe.lakehouse.outcome import Audit, LoadResult
from adpipe.lakehouse.quality import QualityResult

HOUR = datetime(2026, 9, 14, 5, tzinfo=UTC)
# 2026-09-14T06:55:00Z in epoch milliseconds
FIRST_MS = 1_789_368_900_000
GAPS = (
    {"region": "eu", "topic": "ad-events", "partition": 0, "first_offset": 20, "first_timestamp_ms": FIRST_MS},
    {"region": "eu", "topic": "ad-events-dlq", "partition": 3, "first_offset": 7, "first_timestamp_ms": None},
)


def test_an_hour_with_a_gap_and_nothing_loaded_nor_in_kafka_is_past_retention() -> None:
    past = retention.past_retention(HOUR, GAPS, loaded=False, regions_with_input=())
    assert past is not None and past.hour == HOUR and past.gaps == GAPS and past.label == "2026-09-14T05"


def test_a_loaded_hour_an_hour_kafka_still_has_input_of_or_one_without_a_gap_goes_to_the_gate() -> None:
    assert retention.past_retention(HOUR, GAPS, loaded=True, regions_with_input=()) is None  # loaded: fails
    assert retention.past_retention(HOUR, GAPS, loaded=False, regions_with_input=("eu",)) is None  # rows missing
    assert retention.past_retention(HOUR, (), loaded=False, regions_with_input=()) is None  # an empty hour


def test_the_line_names_the_hour_each_partition_and_what_kafka_keeps() -> None:
    line = retention.PastRetention(HOUR, GAPS).describe()
    assert "\n" not in line
    assert line.startswith("hour 2026-09-14T05 is past Kafka's retention: nothing of it was ever loaded")
    assert "eu/ad-events[0] from offset 20 (written 2026-09-14T06:55:00Z)" in line
    assert "eu/ad-events-dlq[3] from offset 7 (empty)" in line


def test_the_line_names_a_dozen_partitions_and_counts_the_rest() -> None:
    many = [{**GAPS[0], "partition": p} for p in range(30)]
    text = retention.describe_gaps(many)
    assert "eu/ad-events[11] from" in text and "eu/ad-events[12] from" not in text
    assert text.endswith(" and 18 partitions more")


def _result(hour: int, success: bool) -> QualityResult:
    return QualityResult(datetime(2026, 9, 14, hour, tzinfo=UTC), success, 30, [] if success else ["raw: x"], None,
                         Path("r.json"))


def test_an_audit_passes_fails_and_reports_each_hour_for_itself() -> None:
    past = retention.PastRetention(HOUR, GAPS)
    audit = Audit([_result(7, True), _result(8, False)], [past])
    assert audit.passed() == ["2026-09-14T07"]
    assert [r.hour.hour for r in audit.failed_asked(["2026-09-14T05", "2026-09-14T08"])] == [8]
    summary = audit.summary(["2026-09-14T05"])  # the hour asked is past retention; 08 is held, not asked
    assert summary["success"] is True and summary["passed"] == ["2026-09-14T07"]
    assert summary["past_retention"] == {"2026-09-14T05": past.describe()}
    assert "FAILED" in summary["describe"] and past.describe() in summary["describe"]
    only_past = Audit([], [past])
    assert only_past.summary(["2026-09-14T05"]) == {
        "success": True, "describe": past.describe(), "passed": [], "past_retention": {"2026-09-14T05": past.describe()}
    }


def test_a_loads_result_says_which_hours_are_past_retention() -> None:
    said = LoadResult(hour="2026-09-14T05", run_id=4, past_retention=["2026-09-14T05"]).describe()
    assert said.startswith("run 4: hours none audited and published")
    assert said.endswith("past Kafka's retention, nothing of them ever loaded (reported, not checked, not held): "
                         "2026-09-14T05")
    assert "past Kafka's retention" not in LoadResult(hour="2026-09-14T05", run_id=4).describe()


def test_the_ledger_step_is_one_of_the_ledgers() -> None:
    assert T.STEP_PAST_RETENTION == "past_retention" and T.STEP_PAST_RETENTION in T.LEDGER_STEPS


def test_a_partition_emptied_by_time_retention_lost_only_what_that_retention_reaches() -> None:
    from adpipe.lakehouse.ranges import may_have_lost

    day = 24 * 3600 * 1000
    now = 100 * day
    week = 7 * day
    # Nothing ever deleted: nothing lost, whatever the hour.
    assert not may_have_lost(0, None, now - 30 * day, week, now)
    # A partition keeping records lost the hour's only if its first kept one is later.
    assert may_have_lost(5, now - 2 * day, now - 3 * day, week, now)
    assert not may_have_lost(5, now - 4 * day, now - 3 * day, week, now)
    # Emptied by retention (a quiet DLQ partition): an hour of the last week
    # was never within time retention's reach, one older may have been.
    assert not may_have_lost(5, None, now - 3 * day, week, now)
    assert may_have_lost(5, None, now - 8 * day, week, now)
    # Kept for ever yet emptied: something else deleted them, so assume the worst.
    assert may_have_lost(5, None, now - 3 * day, -1, now)
