"""When an hour is closed for Union & Load, with a real broker and a real
stream job: a busy region closes it once its watermark is past the hour's
end plus the allowed lateness (not at the hour's end: its windows may
still be revised); a quiet region
(nothing arrived since the hour's end, so a watermark that stands still)
closes it once its stream has no lag and the wall clock is past the hour's
end plus the lateness; a region with records its stream has not committed,
or with records that arrived after the hour (its watermark decides), does
not close it by the clock. The load DAG's trigger (which its first task
defers to) waits while the hour is open and fires once it closes."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe.lakehouse.load import hour_closed
from adpipe.orchestration.hour_closed import HourClosedTrigger
from adpipe.settings import Settings, load_settings
from confluent_kafka import Producer

from tests.integration.helpers import Pipeline, make_pipeline, on_producers_clock

HOUR = datetime(2026, 11, 22, 12, tzinfo=UTC)
END = HOUR + timedelta(hours=1)
LATENESS = timedelta(seconds=30 + 300)  # the default watermark delay and allowed lateness


def _event(n: int, at: datetime) -> bytes:
    body = {"event_id": f"quiet-{n}", "ad_id": "ad-q", "event_type": "impression", "event_time": at.isoformat()}
    return json.dumps(body).encode()


def _send(pipeline: Pipeline, values: list[bytes], written_at: datetime | None) -> None:
    """Raw events with the record timestamp ``written_at`` (None: now)."""
    producer = Producer({"bootstrap.servers": pipeline.settings.kafka_bootstrap, "enable.idempotence": True})
    stamp = int(written_at.timestamp() * 1000) if written_at else 0
    for value in values:
        producer.produce(pipeline.settings.topics.events, value, timestamp=stamp)
    assert producer.flush(30) == 0


def _both(busy: Pipeline, other: Pipeline) -> dict[str, str]:
    """The environment of a load of both regions."""
    regions = json.dumps(
        [
            {"job_id": p.settings.job_id, "events": p.settings.topics.events,
             "aggregates": p.settings.topics.aggregates, "dlq": p.settings.topics.dlq, "late": p.settings.topics.late}
            for p in (busy, other)
        ]
    )
    return {**busy.env, "ADPIPE_REGIONS": regions}


def _fired(trigger: HourClosedTrigger, within_s: float) -> dict | None:
    """The trigger's event if it fires within ``within_s`` (as Airflow's triggerer runs it)."""

    async def first() -> dict | None:
        async for event in trigger.run():
            return event.payload
        return None

    async def bounded() -> dict | None:
        try:
            return await asyncio.wait_for(first(), within_s)
        except TimeoutError:
            return None

    return asyncio.run(bounded())


def test_a_quiet_region_closes_its_hours_by_the_clock_a_lagging_one_does_not(
    broker: Settings,  # noqa: ARG001 - the session's broker must be up
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "quiet").mkdir()
    busy, quiet = make_pipeline(tmp_path / "busy"), make_pipeline(tmp_path / "quiet")
    on_producers_clock(quiet.settings)  # its records are written 'during' 12:00-13:00 by their timestamps
    # The busy region's watermark passes 13:00 (12:58 .. 13:03 of events):
    # the hour's windows are closed, not final (revised until 13:05).
    busy.produce(events=300, seed=51, minutes=5, start=HOUR + timedelta(minutes=58))
    assert busy.stream().returncode == 0
    assert not hour_closed(load_settings(busy.env), HOUR, now=END + timedelta(days=1))
    # 13:03 .. 13:07: past 13:05, closed for good.
    busy.produce(events=200, seed=52, minutes=4, start=HOUR + timedelta(minutes=63))
    assert busy.stream().returncode == 0
    env = _both(busy, quiet)
    settings = load_settings(env)
    assert hour_closed(load_settings(busy.env), HOUR, now=END)  # the busy region alone: by its watermark

    # The quiet region never had an event: closed only once the clock is past end + lateness.
    assert not hour_closed(settings, HOUR, now=END + LATENESS - timedelta(seconds=1))
    assert hour_closed(settings, HOUR, now=END + LATENESS)

    # Events written during the hour (record timestamps 12:10): while its
    # stream has not counted them, not closed whatever the clock says.
    _send(quiet, [_event(n, HOUR + timedelta(minutes=10)) for n in range(20)], HOUR + timedelta(minutes=10))
    assert not hour_closed(settings, HOUR, now=END + timedelta(days=1))
    # The load DAG's trigger (Airflow's triggerer: the settings from its
    # environment, the real clock, days past the hour) waits meanwhile...
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    trigger = HourClosedTrigger("2026-11-22T12", interval_s=0.5)
    assert _fired(trigger, 3) is None
    # Counted (its watermark stays before 13:00): quiet again, closed by the clock.
    assert quiet.stream().returncode == 0
    assert hour_closed(settings, HOUR, now=END + timedelta(days=1))
    # ...and fires at its next question once the hour is closed.
    assert _fired(trigger, 30) == {"hour": "2026-11-22T12", "closed": True}
    assert not hour_closed(settings, HOUR, now=END)
    # An event that arrives after the hour's end (written now): the region is not
    # quiet any more, and its watermark (12:09:30) decides: not closed.
    _send(quiet, [_event(99, HOUR + timedelta(minutes=11))], None)
    assert quiet.stream().returncode == 0
    assert not hour_closed(settings, HOUR, now=END + timedelta(days=1))
