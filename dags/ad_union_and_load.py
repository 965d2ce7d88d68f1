"""
### ad_union_and_load — hourly Union & Load into Delta: write, audit, publish

**Hourly by design.** Uber's Union & Load is a streaming job; ours is a batch
job per closed UTC hour. The aggregates are already exactly-once in Kafka,
so an hourly, idempotent load is simpler to reason about, rerun and backfill,
and an hour is the unit the quality gate and Data Docs report on.

**Load by arrival, file by event time.** Each run reads what arrived in every
region's topics since the last run (offsets kept in the ledger
`ads.load_runs`) and files each row in its own `event_hour`: a record that
arrives hours late lands in its hour with the next run, counted as a late
correction (`ads.late_corrections`).

Schedule: `CronDataIntervalTimetable("0 * * * *", UTC)` — each run's data
interval is one hour (a plain cron schedule in Airflow 3 has a zero-length
interval). A new deployment loads from its first hour on: without
`ADPIPE_LOAD_START` the first run is the hour that closed last when the DAG
is unpaused (no catch-up of earlier hours), then one run per hour; with it,
`catchup=True` from that hour. One run at a time.
`airflow backfill create --dag-id ad_union_and_load --from-date ... --to-date ...`
runs past hours the same way. A manual run may name its hour in the `hour`
param (`YYYY-MM-DDTHH`); otherwise every task reads it from the data interval.

1. `wait_for_hour_closed` — sensor (timeout `ADPIPE_LOAD_WAIT_TIMEOUT_S`):
   every region's stream has closed the hour for good (watermark past its
   end plus `ADPIPE_ALLOWED_LATENESS_S`, after which no window of it is
   revised; a quiet region: no lag and the clock past the end plus the
   watermark delay and the allowed lateness). It
   asks once, then defers to a trigger that asks every 10 s in Airflow's
   triggerer (no worker slot held): the load starts seconds after the close.
2. `stage` — the new records of every region into `ads_staging.*`; the
   staged run is its XCom, which `validate`, `verify` and `publish` read
   (Airflow's metadata database: any worker, any host, any `ADPIPE_HOME`).
   `stage`, `validate` and `publish` run in the home's warm load driver
   (`adpipe load --serve`, started by the first step if none runs: one
   Spark session for every step and hour, no Spark start per step);
   `ADPIPE_LOAD_SUBMIT=spark-submit` submits each as a Spark application of
   its own through `SparkSubmitOperator` (`jobs/union_and_load.py --step
   ...`, connection `adpipe_spark`: for an executor whose tasks run on other
   hosts), `in-process` runs it in the task's own process.
3. `validate` — the Great Expectations gate on each hour to publish
   (published plus staged rows; Kafka's retention and the regions that had
   input). **A failed expectation fails the run, and nothing is published.**
4. `verify` — the independent check: the candidate against counts
   recomputed in plain Python from the raw Kafka records.
5. `publish` — only when no check failed: the audited rows into
   `ads.ad_events_raw`, `ads.ad_minute_aggregates`, `ads.ad_events_quarantine`
   (Airflow Assets, so downstream DAGs can be scheduled on them). A failed
   check leaves it `upstream_failed`, which fails the run.

**An hour past Kafka's retention** of which nothing was ever loaded (its
records deleted before any load read them: a start set months back, a
backfill of old hours) fails nothing: `validate` and `verify` end
*skipped*, the reason the one WARNING line that names what Kafka keeps, and
`publish` is skipped after them;
the ledger records a `past_retention` step; nothing alerts. An hour that
was loaded and lost records to retention still fails `validate`
(`kafka_retention`).
6. `publish_data_docs` — beside `publish`, after both checks whatever they
   found: a page linking to the hour's Data Docs
   (`$ADPIPE_HOME/data_docs/<hour>.html`, `latest.html`). Cosmetic: nothing
   waits on it.

**Rails.** Every task but the sensor is failed after `ADPIPE_LOAD_STEP_TIMEOUT_S`
(3600 s; the sensor after `ADPIPE_LOAD_WAIT_TIMEOUT_S`), a run after
`ADPIPE_LOAD_RUN_TIMEOUT_S` (8 h), so one hung step cannot hold the one active
run, and every catch-up run behind it, for ever. `stage`, `validate` and
`publish` take the one slot of the pool `adpipe_tables`, which the daily
OPTIMIZE and VACUUM takes too. The idempotent tasks (the sensor, `stage`,
`publish`, the Data Docs page) retry once after
`ADPIPE_LOAD_RETRY_DELAY_S` (300 s), on whatever worker is free; `validate` and
`verify` never (a failed check is not transient: fail and alert now).
Addresses and credentials come from the Connections `adpipe_kafka`,
`adpipe_metastore_db`, `adpipe_spark` (`adpipe.orchestration.connections`).

**Alerts.** Every task alerts once on failure through the one notifier (task
level only): the alerts file, the webhook, e-mail and Slack
(`adpipe.orchestration.alerts`). A deadline alert fires when a run's hour is
not published `ADPIPE_PUBLISH_DEADLINE_S` after the hour's end (default: the
watermark delay plus the allowed lateness plus 10 minutes, 930 s), whatever
holds it up (`adpipe.orchestration.deadline`); not for a backfill, nor for a
catch-up run created more than a day past its deadline (logged instead).
Logic: `adpipe.orchestration.load_tasks`, `adpipe.lakehouse.load`.
"""

from __future__ import annotations

from datetime import timedelta

from adpipe.orchestration.alerts import notify_failure
from adpipe.orchestration.assets import TABLE_ASSETS
from adpipe.orchestration.deadline import publish_deadline
from adpipe.orchestration.hour_closed import HourClosedSensor
from adpipe.orchestration.load_tasks import FIRST_START, load_step
from adpipe.settings import TABLES_POOL, load_settings
from airflow.sdk import DAG, CronDataIntervalTimetable, Param, task

# Parse time reads only the environment (no I/O): start date, timeouts, how
# the Spark steps run.
_settings = load_settings()
_step_timeout = timedelta(seconds=_settings.rails.load_step_timeout_s)

with DAG(
    dag_id="ad_union_and_load",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=_settings.load_start or FIRST_START,
    catchup=_settings.load_start is not None,
    max_active_runs=1,
    dagrun_timeout=timedelta(seconds=_settings.rails.load_run_timeout_s),
    # The hour published ADPIPE_PUBLISH_DEADLINE_S after its end, or an alert.
    deadline=publish_deadline(_settings),
    doc_md=__doc__,
    tags=["adpipe", "load"],
    params={
        "hour": Param(
            None,
            type=["null", "string"],
            pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}$",
            description="UTC hour YYYY-MM-DDTHH for a manual run; empty: the run's data interval",
        )
    },
    default_args={
        "owner": "adpipe",
        "retries": 1,
        "retry_delay": timedelta(seconds=_settings.rails.load_retry_delay_s),
        "execution_timeout": _step_timeout,
        "on_failure_callback": notify_failure,
    },
) as dag:

    def _hour(context: dict) -> object:
        from adpipe.orchestration import load_tasks

        return load_tasks.hour_of_run(
            context.get("params"), context.get("data_interval_start"), context.get("data_interval_end")
        )

    # Asks once, then waits in the triggerer (no worker slot held), asking
    # every 10 s: the load starts seconds after the hour closes.
    hour_closed = HourClosedSensor(
        task_id="wait_for_hour_closed",
        timeout=_settings.load_wait_timeout_s,
        execution_timeout=timedelta(seconds=_settings.load_wait_timeout_s),
    )

    # The Spark steps: in the warm load driver, or with ADPIPE_LOAD_SUBMIT=
    # spark-submit|in-process (see the doc above); one at a time with the
    # table maintenance.
    # The staged run is stage's XCom (staged.output): the later steps pull it
    # from Airflow's metadata database, on whatever worker they run.
    submit = _settings.load_submit
    staged = load_step("stage", submit, task_id="stage", pool=TABLES_POOL)
    # A failed expectation is not transient: no retry, fail and alert now.
    validate = load_step(
        "validate", submit, task_id="validate", staged_run=staged.output, retries=0, pool=TABLES_POOL
    )

    @task(task_id="verify", retries=0)
    def verify(staged_run: dict, **context) -> dict:  # noqa: ANN003
        from adpipe.orchestration import load_tasks
        from adpipe.orchestration.connections import task_env

        env = task_env()
        return load_tasks.verify(load_settings(env), _hour(context), staged_run, env=env)

    # all_success: a check skipped (the hour past Kafka's retention, nothing
    # of it loaded) skips the publication too; a failed one fails the run.
    published = load_step(
        "publish", submit, task_id="publish", staged_run=staged.output, outlets=TABLE_ASSETS, pool=TABLES_POOL
    )

    @task(task_id="publish_data_docs", trigger_rule="all_done")
    def publish_data_docs(**context) -> str | None:  # noqa: ANN003
        from adpipe.orchestration import load_tasks
        from adpipe.orchestration.connections import task_settings

        return load_tasks.publish_data_docs(task_settings(), _hour(context))

    checked = [validate, verify(staged.output)]
    hour_closed >> staged >> checked
    # publish waits on both checks (a failed one leaves it upstream_failed,
    # and the run failed), and on stage, whose XCom it reads; the audit's
    # Data Docs are linked whatever it found (all_done), beside it: nothing
    # waits on a cosmetic task.
    checked >> published
    checked >> publish_data_docs()
