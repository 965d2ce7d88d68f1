"""Alerts people receive: the failure notifier and the load DAG's deadline
callback send one alert each to the alerts file, the JSON webhook, a real
SMTP server (aiosmtpd on loopback, through the SMTP provider's notifier and
the Connection ``adpipe_smtp``) and a Slack incoming webhook (a loopback
HTTP server in Slack's place, through the Slack provider's notifier and the
Connection ``adpipe_slack``). The Connections are ``AIRFLOW_CONN_*``
variables, as a deployment's secrets backend would give them.

Also: a channel that fails never stops the others and never raises, a Slack
5xx is retried, a backfill run's missed deadline is not alerted, and the
load DAG's deadline is its hour's end plus ``ADPIPE_PUBLISH_DEADLINE_S``.
The deadline firing under the real scheduler and triggerer is
tests/integration/test_hour_deadline.py; the failed gate's alert from a real
run, tests/integration/test_dags.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from adpipe.settings import Settings, SettingsError, load_settings

from tests.alert_receivers import (
    SLACK_PATH,
    Hooks,
    Inbox,
    alert_env,
    free_port,
    hooks_server,
    html_text,
    smtp_connection,
    smtp_server,
)

HOUR = datetime(2026, 11, 22, 12, tzinfo=UTC)
# A failed gate's message as QualityError.describe() writes it (braces
# included: a message is never rendered as a Jinja template).
GATE_MESSAGE = (
    "Great Expectations, hour 2026-11-22T12: FAILED (1 of 29 expectations failed)\n"
    "  FAILED adpipe_ad_minute_aggregates: expect_compound_columns_to_be_unique(column_list=['region', 'ad_id', "
    "'window_start']): 2 unexpected of 9 rows, e.g. {region='r1', ad_id='ad-1'} {{ not a template }}"
)


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    with smtp_server() as server:
        yield server


@pytest.fixture
def alerting_env(tmp_path: Path, inbox: Inbox, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    with hooks_server() as url:
        env = {"ADPIPE_HOME": str(tmp_path), "ADPIPE_JOB_ID": "unit", **alert_env(inbox, url)}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        yield env


def _gate_failure_context() -> dict:
    from adpipe.lakehouse.quality import QualityError

    ti = SimpleNamespace(dag_id="ad_union_and_load", task_id="validate", run_id="scheduled__2026-11-22T12:00:00+00:00",
                         try_number=1)
    return {
        "ti": ti,
        "dag_run": SimpleNamespace(dag_id=ti.dag_id, run_id=ti.run_id),
        "exception": QualityError(GATE_MESSAGE),
        "params": {"hour": None},
        "data_interval_start": HOUR,
        "data_interval_end": HOUR + timedelta(hours=1),
    }


def _alerts_file(settings: Settings) -> list[dict]:
    from adpipe.alerting import alerts_file

    return [json.loads(line) for line in alerts_file(settings).read_text().splitlines()]


def test_a_failed_gate_alerts_once_by_email_slack_file_and_webhook(alerting_env: dict, inbox: Inbox) -> None:
    from adpipe.orchestration.alerts import AdpipeNotifier

    AdpipeNotifier(load_settings(alerting_env))(_gate_failure_context())

    (mail,) = inbox.messages
    assert mail["Subject"] == "[adpipe] ad_union_and_load.validate failed, hour 2026-11-22T12"
    assert mail["From"] == "adpipe@example.org"
    assert mail["X-Envelope-To"] == "oncall@example.org, data@example.org"
    body = html_text(mail)
    assert "QualityError: " + GATE_MESSAGE in body  # the failed expectation, braces as they were

    (slack,) = Hooks.slack()
    assert slack["text"].startswith("[adpipe] ad_union_and_load.validate failed, hour 2026-11-22T12\n")
    assert "expect_compound_columns_to_be_unique(column_list=['region', 'ad_id', 'window_start'])" in slack["text"]
    header, facts, detail = slack["blocks"]
    title = "[adpipe] ad_union_and_load.validate failed, hour 2026-11-22T12"
    assert header == {"type": "header", "text": {"type": "plain_text", "text": title}}
    assert {"type": "mrkdwn", "text": "*hour*\n2026-11-22T12"} in facts["fields"]
    assert {"type": "mrkdwn", "text": "*task*\nvalidate"} in facts["fields"]
    assert detail["text"]["type"] == "mrkdwn" and GATE_MESSAGE in detail["text"]["text"]

    (posted,) = Hooks.posted()
    assert posted["hour"] == "2026-11-22T12" and posted["task_id"] == "validate"
    assert posted["message"] == "QualityError: " + GATE_MESSAGE
    assert _alerts_file(load_settings(alerting_env)) == [posted]


def test_a_dead_smtp_server_stops_no_other_channel_and_slack_is_retried(
    alerting_env: dict, monkeypatch: pytest.MonkeyPatch, inbox: Inbox
) -> None:
    from adpipe.orchestration.alerts import AdpipeNotifier

    monkeypatch.setenv("AIRFLOW_CONN_ADPIPE_SMTP", smtp_connection(free_port(), timeout_s=2))  # nobody listens there
    Hooks.fail = {SLACK_PATH: 2}  # Slack answers 500 twice, then takes the message
    AdpipeNotifier(load_settings(alerting_env))(_gate_failure_context())  # must not raise

    assert inbox.messages == []
    slack = Hooks.slack()
    assert len(slack) == 3 and slack[0] == slack[2]  # the same message, tried again after each 500
    assert len(Hooks.posted()) == 1
    assert len(_alerts_file(load_settings(alerting_env))) == 1


def test_the_webhook_is_retried_after_a_server_error(alerting_env: dict) -> None:
    from adpipe.alerting import post_alert

    Hooks.fail = {"/adpipe": 1}
    assert post_alert(alerting_env["ADPIPE_ALERT_WEBHOOK"], {"message": "m"}, 2, retries=1)
    assert [body for _path, body in Hooks.received] == [{"message": "m"}, {"message": "m"}]
    Hooks.received.clear()
    Hooks.fail = {"/adpipe": 3}
    assert not post_alert(alerting_env["ADPIPE_ALERT_WEBHOOK"], {"message": "m"}, 2, retries=1)
    assert len(Hooks.received) == 2  # one try and one retry, no more


def _scheduler_context(run_type: str = "scheduled", queued_at: str = "2026-11-22T13:00:02Z") -> dict:
    """What the scheduler hands a deadline's callback (Deadline.handle_miss):
    the run as the REST API shows it, and the deadline."""
    return {
        "dag_run": {
            "dag_run_id": f"{run_type}__2026-11-22T12:00:00+00:00", "dag_id": "ad_union_and_load",
            "logical_date": "2026-11-22T12:00:00Z", "data_interval_start": "2026-11-22T12:00:00Z",
            "data_interval_end": "2026-11-22T13:00:00Z", "run_type": run_type, "state": "running", "conf": {},
            "queued_at": queued_at,
        },
        "deadline": {"id": "0193", "deadline_time": datetime(2026, 11, 22, 13, 15, 30, tzinfo=UTC)},
    }


def test_a_missed_deadline_alerts_naming_the_hour_by_every_channel(alerting_env: dict, inbox: Inbox) -> None:
    from adpipe.orchestration.deadline import hour_not_published

    result = json.loads(asyncio.run(hour_not_published(context=_scheduler_context())))

    assert result == {"hour": "2026-11-22T12", "alerted": True, "posted": True, "email": True, "slack": True}
    (mail,) = inbox.messages
    assert mail["Subject"] == "[adpipe] hour 2026-11-22T12 not published by its deadline (ad_union_and_load)"
    body = html_text(mail)
    assert "hour 2026-11-22T12 not published by 2026-11-22 13:15:30 UTC, 930 s after its end" in body
    assert "run scheduled__2026-11-22T12:00:00+00:00 is running" in body
    (slack,) = Hooks.slack()
    assert slack["text"].startswith("[adpipe] hour 2026-11-22T12 not published by its deadline")
    (posted,) = Hooks.posted()
    assert (posted["level"], posted["hour"], posted["deadline"]) == ("deadline", "2026-11-22T12",
                                                                     "2026-11-22T13:15:30+00:00")
    assert _alerts_file(load_settings(alerting_env)) == [posted]


def test_a_backfill_runs_missed_deadline_is_not_alerted(alerting_env: dict, inbox: Inbox) -> None:
    from adpipe.orchestration.deadline import hour_not_published

    result = json.loads(asyncio.run(hour_not_published(context=_scheduler_context("backfill"))))
    assert result == {"hour": "2026-11-22T12", "alerted": False}
    assert inbox.messages == [] and Hooks.received == []


@pytest.mark.parametrize(("queued_at", "alerted"), [
    # A catch-up from a start months back: its run created long after the deadline.
    ("2027-02-01T09:00:00Z", False),
    # A scheduler held up for hours: the hour is late today, and alerts.
    ("2026-11-22T19:40:00Z", True),
])
def test_a_catch_up_runs_missed_deadline_is_not_alerted_a_late_created_one_is(
    alerting_env: dict, inbox: Inbox, queued_at: str, alerted: bool
) -> None:
    from adpipe.orchestration.deadline import hour_not_published

    result = json.loads(asyncio.run(hour_not_published(context=_scheduler_context(queued_at=queued_at))))
    assert result["alerted"] is alerted
    assert len(inbox.messages) == int(alerted) and len(Hooks.posted()) == int(alerted)


def test_the_load_dags_deadline_is_the_hours_end_plus_the_setting(dagbag) -> None:  # noqa: ANN001
    from adpipe.orchestration.deadline import hour_not_published, publish_deadline
    from airflow.sdk import AsyncCallback, DeadlineReference

    (deadline,) = dagbag.dags["ad_union_and_load"].deadline
    assert deadline.reference == DeadlineReference.DAGRUN_LOGICAL_DATE  # the hour's start
    assert deadline.interval == timedelta(hours=1, seconds=930)  # 30 s delay + 300 s lateness + 600 s
    assert deadline.callback == AsyncCallback(hour_not_published)
    for name in ("ad_aggregation_stream", "ad_table_maintenance"):
        assert not dagbag.dags[name].deadline
    slower = load_settings({"ADPIPE_WATERMARK_DELAY_S": "60", "ADPIPE_ALLOWED_LATENESS_S": "900"})
    assert publish_deadline(slower).interval == timedelta(hours=1, seconds=60 + 900 + 600)
    assert publish_deadline(load_settings({"ADPIPE_PUBLISH_DEADLINE_S": "331"})).interval == timedelta(seconds=3931)


@pytest.mark.parametrize("value", ["330", "30"])
def test_a_deadline_before_the_hour_can_close_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="ADPIPE_PUBLISH_DEADLINE_S"):
        load_settings({"ADPIPE_PUBLISH_DEADLINE_S": value})


def test_alert_channel_settings() -> None:
    alerts = load_settings({"ADPIPE_ALERT_EMAIL_TO": " a@x.org,b@y.org ,", "ADPIPE_ALERT_SLACK": "on"}).alerts
    assert (alerts.email_to, alerts.slack, alerts.retries) == (("a@x.org", "b@y.org"), True, 2)
    default = load_settings({}).alerts
    assert (default.email_to, default.slack, default.publish_deadline_s) == ((), False, 930)
    with pytest.raises(SettingsError, match="not an e-mail address"):
        load_settings({"ADPIPE_ALERT_EMAIL_TO": "oncall"})
