"""The load DAG's deadline alert: an hour not published
``ADPIPE_PUBLISH_DEADLINE_S`` after its end alerts, whatever holds it up (a
stream that never closes it, a sensor waiting, a step hanging or retrying,
a failed gate, a scheduler that created its run late).

Airflow 3's deadline alerts: when the scheduler creates the run of hour H
(logical date H, data interval H .. H+1h) it evaluates the deadline's
reference, the run's logical date, plus the interval, one hour plus the
setting: H + 1 h + ADPIPE_PUBLISH_DEADLINE_S. A run that succeeds (publishes)
before then drops its deadline; otherwise, once the time passes, the
scheduler queues the callback, :func:`hour_not_published`, and Airflow's
triggerer runs it. It sends one alert the ways a task's failure does: the
alerts file, the webhook, e-mail and Slack. A run with no logical date (a
manual run that names none) gets no deadline; a backfill run's deadline,
long past when an operator backfills old hours, is logged and not alerted,
and so is a catch-up run's (``ADPIPE_LOAD_START`` months back: the
scheduler creates a run per past hour) whose run was created more than
CATCH_UP_AFTER after its deadline. A scheduler held up for hours still
alerts each hour it held up.

The default (the stream's watermark delay plus its allowed lateness, then
ten minutes for the load: :mod:`adpipe.alert_settings`) is past the
earliest time the hour can close and a load's minute, with room for one
retry of a step after its five-minute delay."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference

from adpipe.settings import Settings, load_settings

log = logging.getLogger(__name__)

# A run created this long after its hour's deadline loads history (a
# catch-up from a start months back), not an hour that is late today.
CATCH_UP_AFTER = timedelta(days=1)


def publish_deadline(settings: Settings) -> DeadlineAlert:
    """The load DAG's deadline: the run's logical date (its hour's start)
    plus one hour plus ``ADPIPE_PUBLISH_DEADLINE_S``."""
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_LOGICAL_DATE,
        interval=timedelta(hours=1, seconds=settings.alerts.publish_deadline_s),
        callback=AsyncCallback(hour_not_published),
        name="hour_published",
    )


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    return None


def deadline_alert(context: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The alert of a missed deadline, from the context the scheduler gives
    the callback: the run (``dag_run``, as the REST API shows it) and the
    deadline (``deadline``)."""
    run = context.get("dag_run") or {}
    deadline = _time((context.get("deadline") or {}).get("deadline_time"))
    start = _time(run.get("data_interval_start"))
    named = (run.get("conf") or {}).get("hour")
    hour = str(named) if named else (start.strftime("%Y-%m-%dT%H") if start else None)
    when = f"{deadline:%Y-%m-%d %H:%M:%S} UTC" if deadline else "its deadline"
    return {
        "at": datetime.now(UTC).isoformat(),
        "level": "deadline",
        "dag_id": run.get("dag_id"),
        "run_id": run.get("dag_run_id"),
        "run_type": run.get("run_type"),
        "task_id": None,
        "hour": hour,
        "deadline": deadline.isoformat() if deadline else None,
        "logical_date": run.get("logical_date"),
        "queued_at": run.get("queued_at"),
        "data_interval_start": run.get("data_interval_start"),
        "data_interval_end": run.get("data_interval_end"),
        "message": (
            f"hour {hour} not published by {when}, {settings.alerts.publish_deadline_s} s after its end "
            f"(ADPIPE_PUBLISH_DEADLINE_S): run {run.get('dag_run_id')} is {run.get('state')}"
        ),
    }


def catching_up(alert: dict[str, Any]) -> bool:
    """Whether the alert's run was created (queued) more than CATCH_UP_AFTER
    after its deadline: a run of history, whose deadline was long gone
    before it existed."""
    deadline, queued = _time(alert.get("deadline")), _time(alert.get("queued_at"))
    return deadline is not None and queued is not None and queued - deadline > CATCH_UP_AFTER


async def hour_not_published(context: dict[str, Any] | None = None, **kwargs: Any) -> str:
    """The deadline's callback, in the triggerer: one alert to the alerts
    file, the webhook, e-mail and Slack. Returns where it went, as JSON
    text: Airflow keeps it as the callback's output, a text column (a dict
    there fails the triggerer's UPDATE on PostgreSQL, and the triggerer)."""
    from adpipe.alerting import send_alert
    from adpipe.orchestration.alert_channels import adeliver

    settings = load_settings()
    alert = deadline_alert(context or {}, settings)
    catch_up = catching_up(alert)
    if alert["run_type"] == "backfill" or catch_up:
        kind = "catch-up" if catch_up else "backfill"
        log.info("deadline of %s run %s (hour %s) passed: not alerted", kind, alert["run_id"], alert["hour"])
        return json.dumps({"hour": alert["hour"], "alerted": False})
    recorded = await asyncio.to_thread(send_alert, settings, alert)
    sent = await adeliver(settings, alert, context or {})
    log.warning("%s", alert["message"])
    return json.dumps({"hour": alert["hour"], "alerted": True, "posted": recorded["posted"], **sent})
