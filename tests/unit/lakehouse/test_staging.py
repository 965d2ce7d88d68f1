"""Which hours a load run audits (adpipe.lakehouse.staging.hours_to_audit):
worked out by hand from the rule."""

from __future__ import annotations

from datetime import UTC, datetime

from adpipe.lakehouse.staging import hours_to_audit


def at(hour: int) -> datetime:
    return datetime(2026, 11, 22, hour, tzinfo=UTC)


def test_a_run_audits_the_hours_asked_and_the_pending_ones_closed_before_its_read() -> None:
    pending = {"2026-11-22T08", "2026-11-22T09", "2026-11-22T10", "2026-11-22T11"}
    hours, waiting = hours_to_audit(pending, asked=[at(9)], horizon=at(10), held={})
    assert hours == [at(8), at(9), at(10)] and waiting == []  # 11 closed after the read: the next run's


def test_held_hours_wait_for_an_operator_unless_asked() -> None:
    pending = {"2026-11-22T07", "2026-11-22T08", "2026-11-22T09"}
    held = {"2026-11-22T07": "gate failed", "2026-11-22T09": "gate failed"}
    hours, waiting = hours_to_audit(pending, asked=[at(9)], horizon=at(9), held=held)
    assert hours == [at(8), at(9)] and waiting == ["2026-11-22T07"]


def test_with_no_closed_hour_only_the_hours_asked_are_audited() -> None:
    hours, waiting = hours_to_audit({"2026-11-22T05"}, asked=[at(11), at(12)], horizon=None, held={})
    assert hours == [at(11), at(12)] and waiting == []
