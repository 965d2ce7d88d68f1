"""An adpipe alert by e-mail and to Slack, through the Airflow providers'
notifiers: the SMTP provider's ``SmtpNotifier`` (Connection ``adpipe_smtp``)
to ``ADPIPE_ALERT_EMAIL_TO``, and the Slack provider's
``SlackWebhookNotifier`` (Connection ``adpipe_slack``, an incoming webhook)
when ``ADPIPE_ALERT_SLACK=on`` (:mod:`adpipe.alert_settings`).

The alert is the dict :mod:`adpipe.orchestration.alerts` builds (the same
one the alerts file and ``ADPIPE_ALERT_WEBHOOK`` get): the e-mail's subject
and the Slack message's first line name what failed and the hour, the body
carries the whole message (a failed gate's expectations, each on a line).
Subject and body are given to the notifiers whole, never as Jinja
templates, so a message holding ``{{`` is sent as it is.

Each channel is tried on its own: one that fails (no Connection, the
server down after its retries) is logged and the others still go; nothing
raises. The e-mail's retries are the SMTP provider's (the Connection's
``retry_limit``), Slack's are slack_sdk's retry handlers (a lost
connection, a 5xx, a 429), ``ADPIPE_ALERT_RETRIES`` times."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from html import escape
from typing import Any

from adpipe.alert_settings import SLACK_CONN_ID, SMTP_CONN_ID
from adpipe.settings import Settings

log = logging.getLogger(__name__)

# Slack refuses a section's text over 3,000 characters.
SLACK_TEXT_LIMIT = 2900
_FIELDS = (
    ("hour", "hour"),
    ("dag_id", "DAG"),
    ("task_id", "task"),
    ("run_id", "run"),
    ("try_number", "try"),
    ("deadline", "deadline"),
    ("at", "at"),
)


def title(alert: Mapping[str, Any]) -> str:
    """One line: what failed, and the hour when the alert names one."""
    hour = f", hour {alert['hour']}" if alert.get("hour") else ""
    if alert.get("level") == "deadline":
        return f"[adpipe] hour {alert.get('hour')} not published by its deadline ({alert.get('dag_id')})"
    if alert.get("task_id"):
        return f"[adpipe] {alert.get('dag_id')}.{alert['task_id']} failed{hour}"
    where = alert.get("dag_id") or alert.get("source") or "adpipe"
    return f"[adpipe] {where}{hour}: alert"


def _facts(alert: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(label, str(alert[key])) for key, label in _FIELDS if alert.get(key) not in (None, "")]


def email_body(alert: Mapping[str, Any]) -> str:
    rows = "".join(f"<tr><th align=left>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in _facts(alert))
    return (
        f"<h3>{escape(title(alert))}</h3><table>{rows}</table>"
        f"<pre>{escape(str(alert.get('message') or ''))}</pre>"
    )


def slack_message(alert: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The Slack message: its ``text`` (notifications, clients without
    blocks) and its Block Kit ``blocks``."""
    message = str(alert.get("message") or "")
    if len(message) > SLACK_TEXT_LIMIT:
        message = message[:SLACK_TEXT_LIMIT] + "\n(cut: the whole alert is in the alerts file)"
    facts = [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in _facts(alert)]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title(alert)[:150]}},
        {"type": "section", "fields": facts[:10]},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"```{message}```"}},
    ]
    return f"{title(alert)}\n{message}", blocks


def email_notifier(settings: Settings, alert: Mapping[str, Any]) -> Any | None:
    """The SMTP provider's notifier for this alert, or None when
    ``ADPIPE_ALERT_EMAIL_TO`` names nobody."""
    if not settings.alerts.email_to:
        return None
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    return SmtpNotifier(
        to=list(settings.alerts.email_to),
        from_email=settings.alerts.email_from or None,
        subject=title(alert),
        html_content=email_body(alert),
        smtp_conn_id=SMTP_CONN_ID,
    )


def slack_notifier(settings: Settings, alert: Mapping[str, Any], asynchronous: bool = False) -> Any | None:
    """The Slack provider's incoming-webhook notifier for this alert, or
    None when ``ADPIPE_ALERT_SLACK`` is off."""
    if not settings.alerts.slack:
        return None
    from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

    n = settings.alerts.retries
    if asynchronous:
        from slack_sdk.http_retry import builtin_async_handlers as h

        handlers: list[Any] = [h.AsyncConnectionErrorRetryHandler(n), h.AsyncServerErrorRetryHandler(n),
                               h.AsyncRateLimitErrorRetryHandler(n)]
    else:
        from slack_sdk.http_retry import builtin_handlers as s

        handlers = [s.ConnectionErrorRetryHandler(n), s.ServerErrorRetryHandler(n), s.RateLimitErrorRetryHandler(n)]
    text, blocks = slack_message(alert)
    return SlackWebhookNotifier(
        slack_webhook_conn_id=SLACK_CONN_ID, text=text, blocks=blocks, timeout=30, retry_handlers=handlers
    )


def deliver(settings: Settings, alert: Mapping[str, Any], context: Any) -> dict[str, bool]:
    """E-mail and Slack, each on its own; which went (True), which failed
    (False). The notifiers' ``notify`` is called, not the notifier itself:
    that would render subject and body as Jinja templates."""
    sent: dict[str, bool] = {}
    for channel, notifier in (("email", email_notifier(settings, alert)), ("slack", slack_notifier(settings, alert))):
        if notifier is None:
            continue
        try:
            notifier.notify(context)
            sent[channel] = True
        except Exception:  # noqa: BLE001 - one channel's failure must not stop the others
            log.exception("could not send the alert by %s", channel)
            sent[channel] = False
    return sent


async def adeliver(settings: Settings, alert: Mapping[str, Any], context: Any) -> dict[str, bool]:
    """:func:`deliver` in the triggerer (a deadline alert's callback): the
    notifiers' ``async_notify``."""
    sent: dict[str, bool] = {}
    channels = (("email", email_notifier(settings, alert)), ("slack", slack_notifier(settings, alert, True)))
    for channel, notifier in channels:
        if notifier is None:
            continue
        try:
            await notifier.async_notify(context)
            sent[channel] = True
        except Exception:  # noqa: BLE001
            log.exception("could not send the alert by %s", channel)
            sent[channel] = False
    return sent
