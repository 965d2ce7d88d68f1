"""The load DAG's first task: wait until every region has closed the run's
hour, without holding a worker slot and without minutes of polling.

:class:`HourClosedSensor` asks once (most runs start on an hour closed long
ago: a catchup, a backfill, a rerun); otherwise it defers to
:class:`HourClosedTrigger` in Airflow's triggerer, which asks again every
``interval_s`` seconds (``hour_closed``: each region's stream watermark
past the hour's end plus the allowed lateness, after which no window of
the hour is revised, or a quiet region's clock) and resumes the task the
moment the hour closes. The load then starts seconds after the close
rather than at the sensor's next reschedule, a minute later. Both read the
settings from the Connections (adpipe.orchestration.connections), the
trigger in the triggerer's process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.triggers.base import BaseTrigger, TriggerEvent

from adpipe.lakehouse.ranges import HOUR_CLOSED_POLL_S
from adpipe.orchestration.connections import task_settings
from adpipe.orchestration.load_tasks import hour_is_closed, hour_of_run
from adpipe.settings import Settings

INTERVAL_S = HOUR_CLOSED_POLL_S


def _closed(settings: Settings, label: str) -> bool:
    from adpipe.lakehouse.ranges import parse_hour

    return hour_is_closed(settings, parse_hour(label))


class HourClosedTrigger(BaseTrigger):
    """Fires once the hour ``hour`` (``YYYY-MM-DDTHH``) is closed in every
    region; asks every ``interval_s`` seconds, off the triggerer's event loop."""

    def __init__(self, hour: str, interval_s: float = INTERVAL_S) -> None:
        super().__init__()
        self.hour, self.interval_s = hour, interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath = f"{type(self).__module__}.{type(self).__qualname__}"
        return classpath, {"hour": self.hour, "interval_s": self.interval_s}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        settings = await asyncio.to_thread(task_settings)
        while not await asyncio.to_thread(_closed, settings, self.hour):
            await asyncio.sleep(self.interval_s)
        yield TriggerEvent({"hour": self.hour, "closed": True})


class HourClosedSensor(BaseSensorOperator):
    """True once the run's hour (its ``hour`` param, else its data interval)
    is closed in every region: asked here once, then in the triggerer
    (deferred, up to the sensor's ``timeout``)."""

    def __init__(self, *, interval_s: float = INTERVAL_S, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.interval_s = interval_s

    def _hour(self, context: Any) -> Any:
        return hour_of_run(context.get("params"), context.get("data_interval_start"), context.get("data_interval_end"))

    def poke(self, context: Any) -> bool:
        return hour_is_closed(task_settings(), self._hour(context))

    def execute(self, context: Any) -> Any:
        from adpipe.lakehouse.ranges import hour_label

        hour = self._hour(context)
        if hour_is_closed(task_settings(), hour):
            return True
        self.log.info("hour %s not closed yet: waiting in the triggerer (every %.0f s)", hour_label(hour),
                      self.interval_s)
        self.defer(
            trigger=HourClosedTrigger(hour_label(hour), self.interval_s),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )
        return None  # not reached: defer raises

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> bool:
        self.log.info("hour %s closed", (event or {}).get("hour"))
        return True
