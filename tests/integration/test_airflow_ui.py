"""The Airflow UI in a real headless browser: Debian's Chromium driven by
Playwright for Python (``executable_path``; Playwright never downloads a
browser), against ``airflow standalone`` as ``make airflow`` runs it (the
real scheduler, LocalExecutor, metadata in PostgreSQL, the Spark steps in
the warm load driver, ``ADPIPE_LOAD_SUBMIT=warm``; test_dags submits them
with SparkSubmitOperator).

The story, each step checked through the page's DOM (text, roles, test ids;
Playwright's waits, no sleeps) and saved as a screenshot under
``$ADPIPE_HOME/screenshots`` (``$ADPIPE_TEST_HOME/ui/screenshots``):

1. log in as ``admin`` (the simple auth manager's password file);
2. every DAG of ``dags/`` is listed, and its Docs dialog shows its ``doc_md``;
3. unpause ``ad_union_and_load`` with its toggle and trigger a run for one
   closed hour (the ``hour`` param of the trigger form);
4. the grid shows the run succeeded, task by task (each cell's tooltip);
5. an aggregate duplicated under a new ``record_uuid`` is injected and the
   hour triggered again: the grid shows the run failed; the failed run's
   ``validate`` log holds the notifier's alert, the same one as in
   ``$ADPIPE_HOME/alerts/alerts.jsonl``, naming the expectation and the key;
6. the hour's Great Expectations Data Docs: ``publish_data_docs`` logs the
   page's ``file://`` address (``$ADPIPE_HOME/data_docs/<hour>.html``). A web
   page may not link to a local file, so the test opens the address the UI
   shows; from there the failed validation's page is one click away;
7. the engineer acts on the held hour from ``ad_hour_repair``'s trigger form:
   a malformed hour is refused naming the param; a ``repair`` (the form's
   default) fails, its log saying why (it reads Kafka again, and the
   duplicate is there) and that nothing was published; ``discard_staged``
   succeeds, and its log gives the hour's published rows: as many aggregates
   as Kafka holds windows of the hour;
8. the stream job's state: a run of ``ad_aggregation_stream`` starts the job,
   and ``check_stream``'s XCom tab shows it alive, its driver's pid (the one
   the supervisor started) and host, no standby, its last batch, watermark
   and lag.

``ADPIPE_LOAD_START`` is the test's own start (to the minute): the
timetable's first hourly run would be due an hour or more later, so
unpausing schedules nothing beside the triggered runs, and their logical
date (the trigger form's default, now) is not before the DAG's start.

Chromium is ``/usr/bin/chromium`` (``ADPIPE_TEST_CHROMIUM`` for another),
installed by ``make deps-ui``. Marked ``ui``: ``make test-ui``, about
eight minutes on two busy cores (the load runs and the hour's actions share
one warm load driver); the stream job the last step starts is stopped with
the scene."""

from __future__ import annotations

import ast
import json
import re
import shutil
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from adpipe import kafka_io
from adpipe.local.airflow import ADMIN_USER, DAGS_FOLDER
from adpipe.orchestration.alerts import alerts_file
from adpipe.orchestration.stream_supervisor import process_alive, read_state, stop_stream
from adpipe.settings import Settings
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from tests.conftest import PORT_BASE, TEST_HOME, chromium
from tests.integration.helpers import (
    NO_REVISIONS,
    Standalone,
    airflow_standalone,
    inject_duplicate_aggregate,
    make_pipeline,
    warm_env,
)

pytestmark = [pytest.mark.ui, pytest.mark.timeout(2400)]

DAG = "ad_union_and_load"
TASKS = ("wait_for_hour_closed", "stage", "validate", "verify", "publish_data_docs", "publish")
REPAIR_DAG = "ad_hour_repair"
STREAM_DAG = "ad_aggregation_stream"
UI_HOME = TEST_HOME / "ui"
# A run is a few Spark applications on two shared cores: minutes, not seconds.
RUN_TIMEOUT_MS = 15 * 60 * 1000


@dataclass
class Scene:
    airflow: Standalone
    hour: str  # YYYY-MM-DDTHH, closed by the stream

    @property
    def settings(self) -> Settings:
        return self.airflow.settings

    @property
    def screenshots(self) -> Path:
        return self.settings.home / "screenshots"


@pytest.fixture(scope="module")
def scene(broker: Settings, pg: Settings) -> Iterator[Scene]:
    """One hour of events, two hours ago, run through the stream job until
    the hour is closed (events run two minutes past its end), then Airflow."""
    shutil.rmtree(UI_HOME, ignore_errors=True)
    UI_HOME.mkdir(parents=True)
    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    name = uuid.uuid4().hex[:8]
    p = make_pipeline(
        UI_HOME,
        warm_env(
            {
                "ADPIPE_HOME": str(UI_HOME),
                "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{name}",
                "ADPIPE_LOAD_START": now.replace(second=0, microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "ADPIPE_AIRFLOW_PORT": str(PORT_BASE + 40),
                **NO_REVISIONS,
            },
            ADPIPE_LOAD_SUBMIT="warm",
        ),
    )
    p.produce(events=240, seed=7401, ads=3, ad_offset=960, minutes=62, start=hour, duplicate_rate=0.05)
    run = p.stream(max_offsets=400)
    assert run.returncode == 0, run.log[-3000:]
    try:
        with airflow_standalone(p, name) as airflow:
            yield Scene(airflow, hour.strftime("%Y-%m-%dT%H"))
    finally:
        # The stream job ad_aggregation_stream started outlives Airflow (detached).
        started = read_state(p.settings).get("pid")
        if process_alive(started):
            stop_stream(started)


@pytest.fixture
def page(scene: Scene) -> Iterator[Page]:
    executable = chromium()
    with sync_playwright() as pw:
        browser: Browser = pw.chromium.launch(executable_path=executable)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)
            expect.set_options(timeout=60_000)
            _log_in(page, scene.airflow)
            yield page
        finally:
            browser.close()


def _log_in(page: Page, airflow: Standalone) -> None:
    page.goto(airflow.url + "/")
    page.get_by_label("Username").fill(ADMIN_USER)
    page.get_by_label("Password").fill(airflow.password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("nav-dags-link")).to_be_visible()


def _shot(page: Page, scene: Scene, name: str, *showing: Locator) -> Path:
    """Screenshot ``name``.png once each of ``showing`` is visible: what the
    picture shows is asserted through the DOM, not read from its pixels."""
    for locator in showing:
        expect(locator).to_be_visible()
    path = scene.screenshots / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), animations="disabled")  # a dialog's fade-in ended
    return path


def _dag_docs() -> dict[str, str]:
    """Each DAG file's id (its file name) and the heading of its ``doc_md``
    (the module docstring), as Markdown renders it."""
    docs = {}
    for path in sorted(DAGS_FOLDER.glob("*.py")):
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        heading = next(line for line in docstring.splitlines() if line.strip())
        docs[path.stem] = heading.removeprefix("### ").replace("`", "")
    return docs


def _open_trigger_form(page: Page, scene: Scene, dag: str = DAG) -> Locator:
    page.goto(f"{scene.airflow.url}/dags/{dag}")
    page.get_by_test_id("trigger-dag-button").click()
    form = page.get_by_role("dialog")
    expect(form).to_contain_text(f"Trigger Dag - {dag}")
    return form


def _fill_hour(form: Locator, hour: str) -> None:
    hour_field = form.locator("input[name=element_hour]")
    hour_field.fill(hour)
    expect(hour_field).to_have_value(hour)


def _submit(page: Page, scene: Scene, form: Locator, shot: str, dag: str = DAG) -> str:
    """Screenshot the filled form, trigger the run; its run id."""
    _shot(page, scene, shot, form)
    form.get_by_test_id("trigger-dag-submit").click()
    page.wait_for_url(re.compile(rf"/dags/{dag}/runs/manual__"))
    return unquote(urlsplit(page.url).path.rsplit("/runs/", 1)[1])


def _trigger(page: Page, scene: Scene, shot: str) -> str:
    """Trigger a run of the hour from the DAG page's trigger form; its run id."""
    form = _open_trigger_form(page, scene)
    expect(form).to_contain_text("Run Parameters")
    _fill_hour(form, scene.hour)
    return _submit(page, scene, form, shot)


def _wait_for_run_end(page: Page, scene: Scene, run_id: str, dag: str = DAG) -> str:
    """The run's end as the DAG page shows it: the "Latest Run" badge, which
    the UI refreshes while a run is active."""
    page.goto(f"{scene.airflow.url}/dags/{dag}")
    badge = (
        page.get_by_test_id("header-card").locator(f"a[href='/dags/{dag}/runs/{run_id}']").get_by_test_id("state-badge")
    )
    expect(badge).to_have_attribute("aria-label", re.compile("^(success|failed)$"), timeout=RUN_TIMEOUT_MS)
    return str(badge.get_attribute("aria-label"))


def _grid_states(
    page: Page, scene: Scene, run_id: str, dag: str = DAG, tasks: tuple[str, ...] = TASKS
) -> dict[str, str]:
    """Each task's state in the run's grid column, read from the tooltip its
    cell shows on hover."""
    page.goto(f"{scene.airflow.url}/dags/{dag}")
    states = {}
    for task in tasks:
        page.get_by_test_id(f"grid-{run_id}-{task}").hover()
        tooltip = page.get_by_role("tooltip")
        expect(tooltip).to_contain_text(f"Task ID: {task}")
        expect(tooltip).to_contain_text(f"Run ID: {run_id}")
        states[task] = re.search(r"State: (.+)", tooltip.inner_text()).group(1).strip()
        page.mouse.move(0, 0)
        expect(tooltip).to_be_hidden()
    return states


def _open_task_log(page: Page, scene: Scene, run_id: str, task: str, dag: str = DAG) -> Locator:
    """Open a task instance from its grid cell; its log, as displayed."""
    page.goto(f"{scene.airflow.url}/dags/{dag}")
    page.get_by_test_id(f"grid-{run_id}-{task}").click()
    page.wait_for_url(f"**/runs/{run_id}/tasks/{task}")
    log = page.get_by_test_id("virtualized-list")
    expect(log).to_be_visible()
    return log


def test_login_lists_every_dag_with_its_docs(scene: Scene, page: Page) -> None:
    docs = _dag_docs()
    assert {"ad_aggregation_stream", DAG} <= set(docs)
    page.goto(f"{scene.airflow.url}/dags")
    dag_links = [page.get_by_role("link", name=dag_id, exact=True) for dag_id in docs]
    _shot(page, scene, "01-dags", page.get_by_text(f"{len(docs)} Dags", exact=True), *dag_links)

    for dag_id, heading in docs.items():
        page.goto(f"{scene.airflow.url}/dags/{dag_id}")
        page.get_by_test_id("markdown-button").click()
        dialog = page.get_by_role("dialog")
        expect(dialog).to_contain_text("Dag Documentation")
        _shot(page, scene, f"02-docs-{dag_id}", dialog.get_by_role("heading", name=heading))
        page.keyboard.press("Escape")
        expect(dialog).to_be_hidden()


def test_a_triggered_hour_succeeds_then_a_duplicate_fails_it_with_the_alert_and_data_docs(
    scene: Scene, page: Page
) -> None:
    # 1. Unpause with the DAG page's toggle.
    page.goto(f"{scene.airflow.url}/dags/{DAG}")
    toggle = page.get_by_test_id("toggle-pause")
    expect(toggle).to_have_attribute("data-state", "unchecked")  # DAGs start paused
    toggle.click()
    expect(toggle).to_have_attribute("data-state", "checked")
    _shot(page, scene, "03-unpaused", toggle, page.get_by_test_id("trigger-dag-button"))

    # 2. A run for the hour; the grid shows every task succeeded.
    good_run = _trigger(page, scene, "04-trigger")
    assert _wait_for_run_end(page, scene, good_run) == "success"
    assert _grid_states(page, scene, good_run) == dict.fromkeys(TASKS, "Success")
    page.get_by_test_id(f"grid-{good_run}-publish").hover()
    _shot(page, scene, "05-grid-success", page.get_by_role("tooltip").get_by_text("State: Success"))
    page.mouse.move(0, 0)

    # 3. A duplicated aggregate, the hour again: the gate fails the run.
    original, _duplicate = inject_duplicate_aggregate(scene.settings, scene.hour)
    bad_run = _trigger(page, scene, "06-trigger-again")
    assert _wait_for_run_end(page, scene, bad_run) == "failed"
    states = _grid_states(page, scene, bad_run)
    assert states == {
        "wait_for_hour_closed": "Success",
        "stage": "Success",
        "validate": "Failed",
        "verify": "Failed",
        "publish_data_docs": "Success",
        "publish": "Upstream Failed",
    }, states
    # Only the two triggered runs: unpausing scheduled none.
    run_bars = page.locator(f"a[href^='/dags/{DAG}/runs/'][href$='/']")
    expect(run_bars).to_have_count(2)
    _shot(page, scene, "07-grid", run_bars.first, run_bars.last)

    # 4. The failed run, opened from its column in the grid.
    page.locator(f"a[href='/dags/{DAG}/runs/{bad_run}/']").click()
    page.wait_for_url(f"**/runs/{bad_run}/")
    validate_row = page.get_by_role("row").filter(has=page.get_by_role("link", name="validate", exact=True))
    expect(validate_row).to_contain_text("Failed")
    _shot(page, scene, "08-failed-run", page.get_by_text(bad_run, exact=True).first, validate_row)

    # 5. The alert, in the failed validate task's log: the notifier's record.
    alerts = [json.loads(line) for line in alerts_file(scene.settings).read_text().splitlines()]
    alert = next(a for a in alerts if a["run_id"] == bad_run and a["task_id"] == "validate")
    assert alert["message"].startswith("QualityError")
    log = _open_task_log(page, scene, bad_run, "validate")
    page.get_by_test_id("log-search-input").fill("ALERT")
    expect(log).to_contain_text(f"ALERT {DAG}.validate: {alert['message'].splitlines()[0]}")
    expect(log).to_contain_text("expect_compound_columns_to_be_unique(column_list=['region', 'ad_id', 'window_start'])")
    expect(log).to_contain_text(f"ad_id='{original['ad_id']}', window_start={original['window_start'][:19]}")
    _shot(page, scene, "09-alert", log.get_by_text(f"ALERT {DAG}.validate", exact=False).first)

    # 6. The hour's Data Docs: the address publish_data_docs logged, opened.
    log = _open_task_log(page, scene, bad_run, "publish_data_docs")
    expect(log).to_contain_text(f"Data Docs of {scene.hour}: file://")
    address = re.search(rf"Data Docs of {scene.hour}: (file://\S+\.html)", log.inner_text()).group(1)
    assert address == (scene.settings.home / "data_docs" / f"{scene.hour}.html").resolve().as_uri()
    page.goto(address)
    expect(page.locator("h1")).to_have_text(f"Great Expectations, hour {scene.hour}")
    validations = page.locator(f"a[href*='/validations/adpipe_ad_minute_aggregates/adpipe-{scene.hour}/']")
    expect(validations).to_have_count(2)  # the passed audit, then the failed one (names sort by time)
    _shot(page, scene, "10-data-docs-hour", validations.last)
    validations.last.click()
    # The hour is small: GE checked it on its pandas engine (the data source names the page).
    page.wait_for_url(re.compile(r"adpipe_pandas-adpipe_ad_minute_aggregates\.html$"))
    body = page.locator("body")
    expect(body).to_contain_text(re.compile(r"Status:\s*Failed"))
    expect(body).to_contain_text(f"adpipe-{scene.hour}")
    failed_check = page.get_by_text(
        "Values for given compound columns must be unique together: region, ad_id, window_start"
    )
    expect(body).to_contain_text(f"{original['ad_id']}{original['window_start'][:19]}")
    _shot(page, scene, "11-data-docs-validation", failed_check)


def _hour_windows(settings: Settings, hour: str) -> int:
    """The (ad_id, window_start) pairs of ``hour`` among the aggregates in
    Kafka (read_committed), read in plain Python: the rows the hour's
    published table must have, one per window whatever duplicates Kafka holds."""
    records = kafka_io.read_topic(settings.kafka_bootstrap, settings.topics.aggregates)
    aggregates = [json.loads(r.value) for r in records]
    return len({(a["ad_id"], a["window_start"]) for a in aggregates if a["window_start"].startswith(hour)})


def _act_on_hour(page: Page, scene: Scene, action: str, shot: str) -> str:
    """Trigger ``ad_hour_repair`` for the scene's hour with ``action``, from
    the form (the action picked in its select, by its label); the run id."""
    form = _open_trigger_form(page, scene, REPAIR_DAG)
    _fill_hour(form, scene.hour)
    current = form.get_by_text("repair: rebuild the hour from Kafka", exact=False)
    if action != "repair":  # the default
        # The select's value text sits under its own (empty) input, which takes the pointer: click through it.
        current.click(force=True)
        page.get_by_role("option", name=re.compile(f"^{action}: ")).click()
        expect(form.get_by_text(f"{action}: ", exact=False).first).to_be_visible()
    return _submit(page, scene, form, shot, REPAIR_DAG)


def test_the_held_hour_is_acted_on_from_the_trigger_form_and_published(scene: Scene, page: Page) -> None:
    # 1. The failed hour, as the engineer finds it: the load's latest run failed.
    page.goto(f"{scene.airflow.url}/dags/{DAG}")
    latest = page.get_by_test_id("header-card").locator(f"a[href^='/dags/{DAG}/runs/manual__']").first
    expect(latest.get_by_test_id("state-badge")).to_have_attribute("aria-label", "failed")

    # 2. A malformed hour: Airflow refuses the run, naming the param and its pattern.
    form = _open_trigger_form(page, scene, REPAIR_DAG)
    expect(form).to_contain_text("Held hour")
    bad = scene.hour.replace("T", " ")
    _fill_hour(form, bad)
    form.get_by_test_id("trigger-dag-submit").click()
    expect(form).to_contain_text(f"Invalid input for param hour: '{bad}' does not match")
    _shot(page, scene, "12-repair-form-refused", form.get_by_text("Invalid input for param hour", exact=False))
    page.keyboard.press("Escape")

    # 3. A repair (the form's default) reads Kafka again, the duplicate with
    # it: its gate fails, nothing is written, and the task's log says so.
    repair_run = _act_on_hour(page, scene, "repair", "13-repair-form")
    assert _wait_for_run_end(page, scene, repair_run, REPAIR_DAG) == "failed"
    log = _open_task_log(page, scene, repair_run, "act_on_held_hour", REPAIR_DAG)
    page.get_by_test_id("log-search-input").fill("HourActionFailed")
    failure = (f"HourActionFailed: adpipe load --hour {scene.hour} --repair --held-only exited 1: the gate failed "
               f"for {scene.hour}: nothing was published")
    expect(log).to_contain_text(failure)
    expect(log).to_contain_text("expect_compound_columns_to_be_unique(column_list=['region', 'ad_id', 'window_start'])")
    _shot(page, scene, "14-repair-failed", log.get_by_text(failure, exact=False).first)

    # 4. The staged duplicate discarded: the hour is published, as audited.
    discard_run = _act_on_hour(page, scene, "discard_staged", "15-discard-form")
    assert _wait_for_run_end(page, scene, discard_run, REPAIR_DAG) == "success"
    states = _grid_states(page, scene, discard_run, REPAIR_DAG, ("act_on_held_hour",))
    assert states == {"act_on_held_hour": "Success"}
    log = _open_task_log(page, scene, discard_run, "act_on_held_hour", REPAIR_DAG)
    page.get_by_test_id("log-search-input").fill(f"hour {scene.hour} published: ")
    expect(log).to_contain_text(f"discarded the staged rows of {scene.hour}: {{'ads.ad_events_raw': 0, "
                                f"'ads.ad_minute_aggregates': 1, 'ads.ad_events_quarantine': 0}}; hour {scene.hour} "
                                "published: ads.ad_events_raw ")
    published = re.search(
        rf"hour {scene.hour} published: ads\.ad_events_raw (\d+), ads\.ad_minute_aggregates (\d+), ", log.inner_text()
    )
    assert published, log.inner_text()[-3000:]
    raw, aggregates = int(published.group(1)), int(published.group(2))
    assert aggregates == _hour_windows(scene.settings, scene.hour) and raw > aggregates, published.group(0)
    _shot(page, scene, "16-discarded-published", log.get_by_text(f"hour {scene.hour} published", exact=False).first)


def test_the_stream_jobs_state_is_in_the_ui(scene: Scene, page: Page) -> None:
    # A run of the supervising DAG (unpaused by the form) starts the job and checks it.
    form = _open_trigger_form(page, scene, STREAM_DAG)
    expect(form.get_by_text(f"Unpause {STREAM_DAG} on trigger")).to_be_visible()
    run_id = _submit(page, scene, form, "17-stream-trigger", STREAM_DAG)
    assert _wait_for_run_end(page, scene, run_id, STREAM_DAG) == "success"
    # Paused again: the five-minute schedule starts no other run in the test.
    page.goto(f"{scene.airflow.url}/dags/{STREAM_DAG}")
    toggle = page.get_by_test_id("toggle-pause")
    expect(toggle).to_have_attribute("data-state", "checked")
    toggle.click()
    expect(toggle).to_have_attribute("data-state", "unchecked")

    # check_stream's XCom tab: the line, then the JSON.
    state = read_state(scene.settings)
    assert process_alive(state.get("pid")), state
    job = scene.settings.job_id
    page.goto(f"{scene.airflow.url}/dags/{STREAM_DAG}/runs/{run_id}/tasks/check_stream/xcom")
    summary = page.get_by_role("row").filter(has_text="stream_summary")
    expect(summary).to_contain_text(
        re.compile(rf"stream {job}: alive \(process, pid {state['pid']} on {re.escape(socket.gethostname())}; "
                   rf"no standby\); last batch \d+ \d+s ago \(watermark \d{{4}}-\d\d-\d\dT[\d:]+Z\); lag 0 records;")
    )
    _shot(page, scene, "18-stream-state", summary)
    page.get_by_role("button", name="Expand all extra JSON").click()
    facts = page.get_by_role("row").filter(has_text="stream_state")
    # The JSON editor renders only the lines in its view, in no fixed DOM order:
    # the facts looked for are the first ones; "no standby" is in the line above.
    for fact in ('"state": "alive"', f'"pid": {state["pid"]}', '"seen_by": "process"',
                 '"lag_records": 0', '"watermark": "'):
        expect(facts).to_contain_text(re.compile(re.escape(fact).replace(r"\ ", r"\s+")))
    _shot(page, scene, "19-stream-state-json", facts)
