"""The one notifier every adpipe DAG uses as its failure callback.

What an alert says comes from the Airflow context; where it goes (the
alerts file, then the webhook) is :mod:`adpipe.alerting`, which the
services outside Airflow use too."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
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
        "logical_date": _iso(context.get("logical_date")),
        "data_interval_start": _iso(context.get("data_interval_start")),
        "data_interval_end": _iso(context.get("data_interval_end")),
        "message": message,
    }


class AdpipeNotifier(BaseNotifier):
    """Failure callback of every adpipe DAG (DAG level and task level).

    Settings are read when an alert is sent, not when the DAG file is
    parsed, so a changed ``ADPIPE_ALERT_WEBHOOK`` takes effect at once."""

    def __init__(self, settings: Settings | None = None) -> None:
        super().__init__()
        self._settings = settings

    def notify(self, context: Any) -> None:
        try:
            settings = self._settings or load_settings()
            send_alert(settings, alert_from_context(context))
        except Exception:  # noqa: BLE001 - a failing alert must not mask the failure it reports
            log.exception("could not record or post an alert")


notify_failure = AdpipeNotifier()
