"""The one notifier every adpipe DAG uses as its failure callback.

What an alert says comes from the Airflow context (the hour too, for a run
of the hourly load); where it goes: the alerts file and the webhook
(:mod:`adpipe.alerting`, which the services outside Airflow use too), then
e-mail and Slack through the providers' notifiers
(:mod:`adpipe.orchestration.alert_channels`). The load DAG's deadline alert
(:mod:`adpipe.orchestration.deadline`) sends its alert the same ways."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import BaseNotifier

from adpipe.alerting import alerts_file, post_alert, record_alert, send_alert
from adpipe.settings import Settings, load_settings

__all__ = ["AdpipeNotifier", "alert_from_context", "alerts_file", "post_alert", "record_alert", "send_alert"]

log = logging.getLogger(__name__)


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return str(value)


def hour_of_context(params: Mapping[str, Any] | None, start: Any, end: Any) -> str | None:
    """The hour a run covers, ``YYYY-MM-DDTHH``: its ``hour`` param, else
    its data interval when that is one whole UTC hour (the load DAG's);
    None for any other run (the stream DAG's five minutes)."""
    named = (params or {}).get("hour")
    if named:
        return str(named)
    if not isinstance(start, datetime) or not isinstance(end, datetime):
        return None
    start_utc = start.astimezone(UTC)
    if end - start != timedelta(hours=1) or start_utc != start_utc.replace(minute=0, second=0, microsecond=0):
        return None
    return start_utc.strftime("%Y-%m-%dT%H")


def alert_from_context(context: Mapping[str, Any]) -> dict[str, Any]:
    """What an alert says, from an Airflow callback context (task or DAG
    level; every field is optional there)."""
    ti = context.get("task_instance") or context.get("ti")
    dag_run = context.get("dag_run")
    dag = context.get("dag")
    exception = context.get("exception")
    dag_id = getattr(dag, "dag_id", None) or getattr(ti, "dag_id", None) or getattr(dag_run, "dag_id", None)
    task_id = getattr(ti, "task_id", None)
    reason = context.get("reason")
    if exception is not None:
        message = f"{type(exception).__name__}: {exception}"
    else:
        message = str(reason or "run failed")
    return {
        "at": datetime.now(UTC).isoformat(),
        "level": "task" if task_id else "dag",
        "dag_id": dag_id,
        "run_id": getattr(dag_run, "run_id", None) or getattr(ti, "run_id", None),
        "task_id": task_id,
        "try_number": getattr(ti, "try_number", None),
        "hour": hour_of_context(
            context.get("params"), context.get("data_interval_start"), context.get("data_interval_end")
        ),
        "logical_date": _iso(context.get("logical_date")),
        "data_interval_start": _iso(context.get("data_interval_start")),
        "data_interval_end": _iso(context.get("data_interval_end")),
        "message": message,
    }


class AdpipeNotifier(BaseNotifier):
    """Failure callback of every adpipe DAG (at the task level: one alert
    per failure): the alerts file, the webhook, e-mail, Slack.

    Settings are read when an alert is sent, not when the DAG file is
    parsed, so a changed ``ADPIPE_ALERT_WEBHOOK`` or recipient takes effect
    at once."""

    def __init__(self, settings: Settings | None = None) -> None:
        super().__init__()
        self._settings = settings

    def notify(self, context: Any) -> None:
        from adpipe.orchestration.alert_channels import deliver

        try:
            settings = self._settings or load_settings()
            alert = alert_from_context(context)
            send_alert(settings, alert)
        except Exception:  # noqa: BLE001 - a failing alert must not mask the failure it reports
            log.exception("could not record or post an alert")
            return
        deliver(settings, alert, context)


notify_failure = AdpipeNotifier()
