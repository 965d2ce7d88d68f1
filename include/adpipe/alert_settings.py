"""Where alerts go besides the alerts file and ``ADPIPE_ALERT_WEBHOOK``, and
when a late hour alerts: read once by :func:`adpipe.settings.load_settings`
(the one reader of configuration) into ``Settings.alerts``.

* ``ADPIPE_ALERT_EMAIL_TO``: comma-separated recipients of an e-mail per
  alert, sent by the SMTP provider through the Airflow Connection
  ``adpipe_smtp`` (host, port, login, password; its extra's ``from_email``
  unless ``ADPIPE_ALERT_EMAIL_FROM`` names the sender). Unset: no e-mail.
* ``ADPIPE_ALERT_SLACK``: ``on`` posts a Slack message per alert through the
  Slack provider's incoming webhook Connection ``adpipe_slack``; ``off``
  (the default): none.
* ``ADPIPE_ALERT_RETRIES`` (2): how many times a failed delivery is tried
  again (the webhook POST, the Slack message; the SMTP provider retries
  e-mail by its Connection's ``retry_limit``).
* ``ADPIPE_PUBLISH_DEADLINE_S``: how long after an hour's end the load DAG's
  run of that hour may take to publish it before a deadline alert fires.
  Default: the watermark delay plus the allowed lateness (the earliest the
  stream can close the hour) plus :data:`LOAD_ALLOWANCE_S`; a value not
  above the delay plus the lateness is refused (every hour would alert)."""

from __future__ import annotations

from dataclasses import dataclass

from adpipe.setting_values import SettingsError, choice, integer

SMTP_CONN_ID = "adpipe_smtp"
SLACK_CONN_ID = "adpipe_slack"
# Time for the load itself past the hour's close: a load takes about a
# minute (the 10,000-ad hour 56.0 s, a new hour in the warm driver 18.3-23.2 s,
# the first one 50.9 s with the driver's start: docs/performance.md), Airflow's
# scheduling seconds, and one retry of a step after its 5-minute delay.
LOAD_ALLOWANCE_S = 600


@dataclass(frozen=True)
class AlertSettings:
    email_to: tuple[str, ...] = ()
    email_from: str = ""  # empty: the adpipe_smtp Connection's from_email
    slack: bool = False
    retries: int = 2
    # Seconds after an hour's end by which it must be published (default
    # 30 + 300 + LOAD_ALLOWANCE_S with the stream's default delay and lateness).
    publish_deadline_s: int = 930


def alert_settings(env: dict[str, str], watermark_delay_s: int, allowed_lateness_s: int) -> AlertSettings:
    """The alert channels and the publish deadline from ``env``; the
    deadline's floor is the stream's delay plus lateness."""
    closes_after = watermark_delay_s + allowed_lateness_s
    deadline = integer(env, "ADPIPE_PUBLISH_DEADLINE_S", closes_after + LOAD_ALLOWANCE_S, 1)
    if deadline <= closes_after:
        raise SettingsError(
            f"ADPIPE_PUBLISH_DEADLINE_S={deadline} must exceed ADPIPE_WATERMARK_DELAY_S + ADPIPE_ALLOWED_LATENESS_S "
            f"= {closes_after}: no hour can be published before then"
        )
    recipients = tuple(a.strip() for a in env.get("ADPIPE_ALERT_EMAIL_TO", "").split(",") if a.strip())
    bad = [a for a in recipients if "@" not in a]
    if bad:
        raise SettingsError(f"ADPIPE_ALERT_EMAIL_TO: {', '.join(bad)} is not an e-mail address")
    return AlertSettings(
        email_to=recipients,
        email_from=env.get("ADPIPE_ALERT_EMAIL_FROM", "").strip(),
        slack=choice(env, "ADPIPE_ALERT_SLACK", ("off", "on")) == "on",
        retries=integer(env, "ADPIPE_ALERT_RETRIES", AlertSettings.retries, 0),
        publish_deadline_s=deadline,
    )
