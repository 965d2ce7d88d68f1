"""produce.plan: the seeded synthetic events and the summary that is the
independent truth the pipeline's output is compared against."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest
from adpipe import schemas as S
from adpipe.tools.produce import ProduceSpec, parse_start, plan
from adpipe.tools.verify import RawEvent, classify

START_MS = 1_795_348_800_000  # 2026-11-22T12:00:00Z, ProduceSpec's default start
SPEC = ProduceSpec(events=300, seed=7, duplicate_rate=0.1, late_rate=0.05, malformed_rate=0.1)

REASON_OF_KIND = {
    "not_json": S.REASON_NOT_JSON,
    "not_object": S.REASON_NOT_OBJECT,
    "missing_event_id": S.REASON_BAD_EVENT_ID,
    "event_id_not_string": S.REASON_BAD_EVENT_ID,
    "unknown_event_type": S.REASON_BAD_EVENT_TYPE,
    "bad_event_time": S.REASON_BAD_EVENT_TIME,
    "naive_event_time": S.REASON_BAD_EVENT_TIME,
    "bool_event_time": S.REASON_BAD_EVENT_TIME,
    "missing_ad_id": S.REASON_BAD_AD_ID,
}


def wire(spec: ProduceSpec) -> list[tuple[bytes | None, bytes, str]]:
    return [(m.key, m.value, m.kind) for m in plan(spec).messages]


def test_plan_is_deterministic_for_a_seed() -> None:
    first, second = wire(SPEC), wire(SPEC)
    assert first == second
    assert len(first) == plan(SPEC).summary["messages"]


def test_plan_differs_for_another_seed() -> None:
    other = ProduceSpec(events=300, seed=8, duplicate_rate=0.1, late_rate=0.05, malformed_rate=0.1)
    assert [v for _, v, _ in wire(SPEC)] != [v for _, v, _ in wire(other)]


def test_summary_counts_are_exact() -> None:
    the_plan = plan(SPEC)
    summary, messages = the_plan.summary, the_plan.messages
    kinds = Counter(m.kind for m in messages)
    assert summary["seed"] == 7
    assert summary["start"] == "2026-11-22T12:00:00Z"
    assert summary["minutes"] == 5
    assert summary["distinct_on_time"] == 300
    assert kinds["on_time"] == 300
    assert summary["duplicates"] == kinds["duplicate"]
    assert summary["late"] == 15  # round(300 * 0.05)
    assert kinds["late"] == 15
    assert summary["malformed"] == 30  # round(300 * 0.1)
    assert sum(summary["malformed_by_reason"].values()) == 30
    assert summary["messages"] == len(messages) == 300 + summary["duplicates"] + 30 + 15
    assert sum(c["events"] for c in summary["counts"]) == 300
    assert len(summary["late_events"]) == 15


def test_duplicates_repeat_an_earlier_on_time_message() -> None:
    messages = plan(SPEC).messages
    duplicates = [i for i, m in enumerate(messages) if m.kind == "duplicate"]
    # At most one per draw of round(300 * 0.1); a draw that hits a duplicate is skipped.
    assert 0 < len(duplicates) <= 30
    for i in duplicates:
        earlier = {(m.key, m.value) for m in messages[:i] if m.kind == "on_time"}
        assert (messages[i].key, messages[i].value) in earlier


def test_late_events_are_sent_last_and_are_before_start() -> None:
    the_plan = plan(SPEC)
    kinds = [m.kind for m in the_plan.messages]
    assert kinds[-15:] == ["late"] * 15
    assert "late" not in kinds[:-15]
    late = [classify(m.value) for m in the_plan.messages[-15:]]
    assert all(isinstance(e, RawEvent) for e in late)
    # At least late_gap_minutes (7) and at most 7 + late_by_minutes (5) before start.
    assert all(START_MS - 12 * 60_000 <= e.event_ms < START_MS - 7 * 60_000 for e in late)
    assert all(w["window_start"] < "2026-11-22T11:53:00Z" for w in the_plan.summary["late_events"])
    assert [(e.event_id, e.ad_id, e.event_type, e.window_start) for e in late] == [
        (w["event_id"], w["ad_id"], w["event_type"], w["window_start"]) for w in the_plan.summary["late_events"]
    ]


def test_summary_counts_match_the_on_time_messages_read_by_the_contract() -> None:
    the_plan = plan(SPEC)
    on_time = [classify(m.value) for m in the_plan.messages if m.kind == "on_time"]
    assert all(isinstance(e, RawEvent) for e in on_time)
    assert len({e.event_id for e in on_time}) == 300
    assert all(START_MS <= e.event_ms < START_MS + 5 * 60_000 for e in on_time)
    recount = Counter((e.ad_id, e.window_start, e.event_type) for e in on_time)
    summary_counts = {(c["ad_id"], c["window_start"], c["event_type"]): c["events"] for c in the_plan.summary["counts"]}
    assert summary_counts == recount
    late_ids = {w["event_id"] for w in the_plan.summary["late_events"]}
    assert late_ids.isdisjoint(e.event_id for e in on_time)


def test_malformed_messages_fail_the_contract_with_their_kind() -> None:
    the_plan = plan(SPEC)
    malformed = [m for m in the_plan.messages if m.kind.startswith("malformed:")]
    assert len(malformed) == 30
    for m in malformed:
        assert classify(m.value) == REASON_OF_KIND[m.kind.split(":", 1)[1]]
    assert the_plan.summary["malformed_by_reason"] == dict(sorted(Counter(m.kind[10:] for m in malformed).items()))


def test_arrival_order_is_not_event_time_order() -> None:
    times = [classify(m.value).event_ms for m in plan(SPEC).messages if m.kind == "on_time"]
    assert times != sorted(times)


def test_no_events_plans_no_messages() -> None:
    summary = plan(ProduceSpec(events=0, duplicate_rate=1.0, late_rate=1.0, malformed_rate=1.0)).summary
    assert (summary["messages"], summary["duplicates"], summary["late"], summary["malformed"]) == (0, 0, 0, 0)
    assert (summary["counts"], summary["late_events"]) == ([], [])


@pytest.mark.parametrize(
    "changes",
    [
        {"click_rate": 1.5},
        {"duplicate_rate": -0.1},
        {"late_rate": 1.01},
        {"malformed_rate": -1.0},
        {"events": -1},
        {"ads": 0},
        {"minutes": 0},
        {"campaigns": 0},
        {"start": datetime(2026, 11, 22, 12, 0)},  # noqa: DTZ001 - naive on purpose
    ],
    ids=lambda c: next(iter(c)),
)
def test_produce_spec_rejects_bad_values(changes: dict) -> None:
    with pytest.raises(ValueError):
        ProduceSpec(**{"events": 10, **changes})


def test_produce_spec_accepts_the_rate_bounds() -> None:
    spec = ProduceSpec(events=10, click_rate=0.0, duplicate_rate=1.0, late_rate=0.0, malformed_rate=1.0)
    assert (spec.click_rate, spec.malformed_rate) == (0.0, 1.0)


def test_parse_start() -> None:
    assert parse_start("2026-11-22T13:00:00+01:00") == datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    with pytest.raises(ValueError):
        parse_start("2026-11-22T12:00:00")


def test_revising_events_are_counted_and_timed_minutes_before_their_neighbour() -> None:
    spec = ProduceSpec(events=300, seed=7, minutes=5, revise_rate=0.1)
    the_plan = plan(spec)
    messages = the_plan.messages
    revising = [i for i, m in enumerate(messages) if m.kind == "revising"]
    assert len(revising) == 30 == the_plan.summary["revising"]
    for i in revising:
        neighbour = max(j for j in range(i) if messages[j].kind == "on_time")
        event, before = classify(messages[i].value), classify(messages[neighbour].value)
        assert isinstance(event, RawEvent) and isinstance(before, RawEvent)
        assert event.event_ms >= START_MS
        assert event.event_ms == START_MS or before.event_ms - 240_000 <= event.event_ms <= before.event_ms - 90_000
    counted = [classify(m.value) for m in messages if m.kind in ("on_time", "revising")]
    recount = Counter((e.ad_id, e.window_start, e.event_type) for e in counted)
    assert recount == Counter({(r["ad_id"], r["window_start"], r["event_type"]): r["events"]
                               for r in the_plan.summary["counts"]})
