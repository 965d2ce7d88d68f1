"""The one notifier every adpipe DAG uses as its failure callback.

An alert is recorded twice, so it is never lost silently: one JSON line in
``$ADPIPE_HOME/alerts/alerts.jsonl`` (plus the task log), then a JSON POST
to ``ADPIPE_ALERT_WEBHOOK`` when that is set. The POST has a timeout; a
failed POST is logged and never raises (a callback that raises would hide
the failure it reports)."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.sdk import BaseNotifier

from adpipe.settings import Settings, load_settings

log = logging.getLogger(__name__)


def alerts_file(settings: Settings) -> Path:
    return settings.home / "alerts" / "alerts.jsonl"


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


def record_alert(settings: Settings, alert: Mapping[str, Any]) -> Path:
    """Append the alert to the alerts file and log it."""
    path = alerts_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(alert, sort_keys=True) + "\n")
    log.error("ALERT %s.%s: %s", alert.get("dag_id"), alert.get("task_id") or "-", alert.get("message"))
    return path


def post_alert(url: str, alert: Mapping[str, Any], timeout_s: float) -> bool:
    """POST the alert as JSON; True on a 2xx answer. Never raises."""
    body = json.dumps(alert, sort_keys=True).encode()
    request = urllib.request.Request(  # noqa: S310 - the URL is the operator's own setting
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            ok = 200 <= response.status < 300
            log.info(
                "alert posted to webhook: HTTP %d in %.0f ms", response.status, (time.monotonic() - started) * 1000
            )
            return ok
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log.warning("alert webhook %s failed (%s); the alert is recorded in the alerts file", url, exc)
        return False


def send_alert(settings: Settings, alert: Mapping[str, Any]) -> dict[str, Any]:
    """Record, then post. Returns the alert with where it went."""
    record_alert(settings, alert)
    posted = (
        post_alert(settings.alert_webhook, alert, settings.alert_webhook_timeout_s) if settings.alert_webhook else None
    )
    return {**alert, "posted": posted}


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
