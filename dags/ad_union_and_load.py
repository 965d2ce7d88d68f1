"""
### ad_union_and_load — hourly Union & Load into Delta, gated by Great Expectations

**Hourly by design.** Uber's Union & Load is a streaming job; ours is a batch
job per closed UTC hour. The aggregates are already exactly-once in Kafka,
so an hourly, idempotent load is simpler to reason about, rerun and backfill,
and an hour is the unit the quality gate and Data Docs report on.

Schedule: `CronDataIntervalTimetable("0 * * * *", UTC)` — each run's data
interval is one hour (a plain cron schedule in Airflow 3 has a zero-length
interval). `catchup=True` from `ADPIPE_LOAD_START`, one run at a time;
`airflow backfill create --dag-id ad_union_and_load --from-date ... --to-date ...`
loads past hours the same way. Every task reads the hour from the run's
data interval, never from the clock.

1. `wait_for_hour_closed` — sensor (reschedule mode, timeout
   `ADPIPE_LOAD_WAIT_TIMEOUT_S`): every region's stream watermark (delay plus
   allowed lateness) is past the hour's end, so all its windows are committed.
2. `load` — `adpipe.lakehouse.load.load_hour`: union of the regions' raw events,
   aggregates and quarantined records into `ads.*` (insert-only MERGE on each
   key: rerunning an hour changes nothing).
3. `validate` — `adpipe.lakehouse.quality.validate_hour`: the Great Expectations suites
   on the hour. **A failed expectation fails the run**, and the failure
   notifier names it.
4. `publish_data_docs` — the hour's Data Docs under
   `$ADPIPE_HOME/data_docs/<hour>` (`latest` points at the newest).

Logic: `adpipe.orchestration.load_tasks`.
"""

from __future__ import annotations

from datetime import timedelta

from adpipe.orchestration.alerts import notify_failure
from adpipe.settings import load_settings
from airflow.sdk import DAG, CronDataIntervalTimetable, task

# Parse time reads only the environment (no I/O): start date, sensor timeout.
_settings = load_settings()

with DAG(
    dag_id="ad_union_and_load",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=_settings.load_start,
    catchup=True,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["adpipe", "load"],
    default_args={
        "owner": "adpipe",
        "retries": 1,
        "retry_delay": timedelta(minutes=5),
        "on_failure_callback": notify_failure,
    },
    on_failure_callback=notify_failure,
) as dag:

    @task.sensor(
        task_id="wait_for_hour_closed", poke_interval=60, timeout=_settings.load_wait_timeout_s, mode="reschedule"
    )
    def wait_for_hour_closed(data_interval_start=None, data_interval_end=None) -> bool:  # noqa: ANN001
        from adpipe.orchestration import load_tasks

        hour = load_tasks.hour_of_interval(data_interval_start, data_interval_end)
        return load_tasks.hour_is_closed(load_settings(), hour)

    @task(task_id="load")
    def load(data_interval_start=None, data_interval_end=None) -> dict:  # noqa: ANN001
        from adpipe.orchestration import load_tasks

        hour = load_tasks.hour_of_interval(data_interval_start, data_interval_end)
        return load_tasks.load(load_settings(), hour)

    # A failed expectation is not transient: no retry, fail and alert now.
    @task(task_id="validate", retries=0)
    def validate(data_interval_start=None, data_interval_end=None) -> dict:  # noqa: ANN001
        from adpipe.orchestration import load_tasks

        hour = load_tasks.hour_of_interval(data_interval_start, data_interval_end)
        return load_tasks.validate(load_settings(), hour)

    @task(task_id="publish_data_docs")
    def publish_data_docs(validation: dict, data_interval_start=None, data_interval_end=None) -> str | None:  # noqa: ANN001
        from adpipe.orchestration import load_tasks

        hour = load_tasks.hour_of_interval(data_interval_start, data_interval_end)
        return load_tasks.publish_data_docs(load_settings(), hour, validation.get("data_docs"))

    validation = validate()
    wait_for_hour_closed() >> load() >> validation
    publish_data_docs(validation)
