"""Where an alert goes, for every part: the DAGs' failure callbacks
(:mod:`adpipe.orchestration.alerts`) and services outside Airflow (the
budget service's offset gaps).

An alert is recorded twice, so it is never lost silently: one JSON line in
``$ADPIPE_HOME/alerts/alerts.jsonl`` (plus the log), then a JSON POST to
``ADPIPE_ALERT_WEBHOOK`` when that is set. The POST has a timeout and is
tried again ``ADPIPE_ALERT_RETRIES`` times after a failure (no answer, or a
5xx or 429 answer: 0.5 s, then twice as long each time); a POST that still
fails is logged and never raises (a callback that raises would hide the
failure it reports). Under Airflow the same alert also goes out by e-mail
and to Slack (:mod:`adpipe.orchestration.alert_channels`)."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adpipe.settings import Settings

log = logging.getLogger("adpipe.alerts")


def alerts_file(settings: Settings) -> Path:
    return settings.home / "alerts" / "alerts.jsonl"


def record_alert(settings: Settings, alert: Mapping[str, Any]) -> Path:
    """Append the alert to the alerts file and log it."""
    path = alerts_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(alert, sort_keys=True) + "\n")
    where = alert.get("dag_id") or alert.get("source") or "-"
    log.error("ALERT %s.%s: %s", where, alert.get("task_id") or "-", alert.get("message"))
    return path


RETRY_BACKOFF_S = 0.5


def post_alert(url: str, alert: Mapping[str, Any], timeout_s: float, retries: int = 0) -> bool:
    """POST the alert as JSON; True on a 2xx answer. A failure that may pass
    (no answer, 5xx, 429) is tried again up to ``retries`` times. Never raises."""
    body = json.dumps(alert, sort_keys=True).encode()
    for attempt in range(retries + 1):
        request = urllib.request.Request(  # noqa: S310 - the URL is the operator's own setting
            url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
                log.info(
                    "alert posted to webhook: HTTP %d in %.0f ms", response.status, (time.monotonic() - started) * 1000
                )
                return 200 <= response.status < 300
        except urllib.error.HTTPError as exc:
            failure: Exception = exc
            if exc.code < 500 and exc.code != 429:
                break  # the webhook refused this alert: asking again changes nothing
        except (urllib.error.URLError, OSError, ValueError) as exc:
            failure = exc
        if attempt < retries:
            log.info("alert webhook %s failed (%s): trying again", url, failure)
            time.sleep(RETRY_BACKOFF_S * 2**attempt)
    log.warning("alert webhook %s failed (%s); the alert is recorded in the alerts file", url, failure)
    return False


def send_alert(settings: Settings, alert: Mapping[str, Any]) -> dict[str, Any]:
    """Record, then post. Returns the alert with where it went."""
    record_alert(settings, alert)
    posted = (
        post_alert(settings.alert_webhook, alert, settings.alert_webhook_timeout_s, settings.alerts.retries)
        if settings.alert_webhook
        else None
    )
    return {**alert, "posted": posted}
