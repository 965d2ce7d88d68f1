"""The load DAG's deadline alert under the real scheduler and triggerer
(``airflow standalone`` as ``make airflow`` starts it, LocalExecutor,
metadata in PostgreSQL), with the default ``ADPIPE_PUBLISH_DEADLINE_S``.

``ADPIPE_LOAD_START`` is the hour two hours before the current one, H: the
scheduler's first run is H's, created after H's end plus 930 s had passed
(H ended at least an hour ago), so its deadline is missed as soon as the
run exists. Nothing ever closes H: no stream job runs and a raw event
arrived after H's end, so ``wait_for_hour_closed`` waits (deferred) and the
run is never published. The test sees what an on-call person would: one
e-mail at the real SMTP server (aiosmtpd) and one Slack message naming H
and its deadline, and the same alert in the alerts file and at the webhook;
no task failed, so no failure alert."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe.alerting import alerts_file
from adpipe.settings import Settings

from tests.alert_receivers import RECIPIENTS, Hooks, alert_env, hooks_server, html_text, smtp_server
from tests.conftest import PORT_BASE
from tests.integration.helpers import Api, airflow_standalone, make_pipeline, until

# About three and a half minutes on two cores, most of it Airflow starting: make test-slow.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
DAG = "ad_union_and_load"


@pytest.fixture
def receivers() -> Iterator[tuple]:
    with smtp_server() as inbox, hooks_server() as url:
        yield inbox, url


def test_an_hour_not_published_by_its_deadline_alerts_by_email_and_slack(
    broker: Settings, pg: Settings, tmp_path: Path, receivers: tuple
) -> None:
    inbox, hooks_url = receivers
    current = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    hour = current - timedelta(hours=2)
    label = hour.strftime("%Y-%m-%dT%H")
    # The deadline, computed here: the hour's end plus the default 930 s
    # (30 s watermark delay + 300 s lateness + 600 s for the load).
    deadline = hour + timedelta(hours=1, seconds=930)
    name = uuid.uuid4().hex[:8]
    p = make_pipeline(tmp_path, {
        "ADPIPE_HOME": str(tmp_path / "home"),
        "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{name}",
        "ADPIPE_LOAD_START": hour.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ADPIPE_AIRFLOW_PORT": str(PORT_BASE + 60),
        **alert_env(inbox, hooks_url),
    })
    # A record after the hour's end and no stream job: the hour never closes.
    p.produce(events=3, seed=11, ads=1, minutes=1, start=datetime.now(UTC) - timedelta(minutes=2))

    with airflow_standalone(p, name) as airflow:
        api = Api(airflow.settings.airflow_port, airflow.password)
        until("the DAG parsed", lambda: api("GET", f"/api/v2/dags/{DAG}")["dag_id"], 300, airflow.log_path)
        assert api("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})["is_paused"] is False
        until("the deadline's e-mail", lambda: inbox.messages, 300, airflow.log_path)
        until("the deadline's Slack message", Hooks.slack, 60, airflow.log_path)
        runs = api("GET", f"/api/v2/dags/{DAG}/dagRuns?order_by=logical_date")["dag_runs"]
        states = {r["data_interval_start"][:13]: r["state"] for r in runs}
        run_id = runs[0]["dag_run_id"]
        time.sleep(5)  # a second alert for the same deadline would come within a scheduler loop or two

    assert states == {label: "running"}, states  # not published: the sensor still waits
    (mail,) = inbox.messages
    assert mail["Subject"] == f"[adpipe] hour {label} not published by its deadline ({DAG})"
    assert mail["X-Envelope-To"] == RECIPIENTS
    body = html_text(mail)
    assert f"hour {label} not published by {deadline:%Y-%m-%d %H:%M:%S} UTC, 930 s after its end" in body, body
    assert f"run {run_id} is running" in body, body
    (slack,) = Hooks.slack()
    assert slack["text"].startswith(f"[adpipe] hour {label} not published by its deadline")
    assert {"type": "mrkdwn", "text": f"*hour*\n{label}"} in slack["blocks"][1]["fields"]
    (posted,) = Hooks.posted()  # the deadline's alert only: no task failed
    assert (posted["level"], posted["hour"], posted["deadline"]) == ("deadline", label, deadline.isoformat())
    assert [a["level"] for a in _alerts(airflow.settings)] == ["deadline"]


def _alerts(settings: Settings) -> list[dict]:
    import json

    return [json.loads(line) for line in alerts_file(settings).read_text().splitlines()]
