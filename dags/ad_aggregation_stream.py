"""
### ad_aggregation_stream — keep the aggregation stream job alive

The stream job (`jobs/aggregation_stream.py`: Kafka `ad-events` → one-minute
aggregates → `ad-aggregates`, one Kafka transaction per micro-batch) runs for
days; an Airflow task should not. So this DAG is a **short run every five
minutes** (one at a time, no catchup) that supervises it:

1. `start_stream_if_down` — `StreamStartOperator`: `spark-submit` of the job
   (master from the connection `adpipe_spark`), started **detached** on the
   worker that runs it: its own process group and log under
   `$ADPIPE_HOME/stream/<job_id>/`, so it outlives the task (the Spark
   provider's operator would wait for the driver to exit, i.e. for days). A
   no-op when a driver leads the job in its leadership group, on any host (a
   standby that took over, a job started by hand or by another worker); a
   stalled job (input waiting, no batch for `ADPIPE_STREAM_STALL_S`) is
   stopped first when it runs on this host, and left to its own host's
   supervisor otherwise. A start after an earlier one is counted as a
   restart. With `ADPIPE_STREAM_STANDBY=on` it also keeps a warm standby
   driver (`--standby`) beside the live one, which takes over within
   seconds when the active driver's host dies or is cut off. Its XCom
   `host` names the worker it ran on.
2. `wait_for_stream` — sensor: the job we started has its query running, or
   a driver leads the job on any host (or a job started by hand
   heartbeats); on another worker than the start's it waits for a leader.
   Fails with the job's log tail if the driver started on its host died.
3. `check_stream` — liveness (this host's pid and command line, else the
   leadership group, else the heartbeat's age), consumer lag (raw topic end
   offsets minus the offsets the job committed in its last transaction, and
   how long the oldest waiting record has waited; for a driver on another
   host that wait is also its stall test), restarts within
   `ADPIPE_STREAM_RESTART_WINDOW_S` (those this host's supervisor made); its
   line names the active driver, the standby and the last failover.
   Fails — and so alerts — when restarts pass `ADPIPE_STREAM_MAX_RESTARTS`,
   lag passes `ADPIPE_STREAM_MAX_LAG`, or a driver on another host stalls.

**The job's state in the UI.** `check_stream` publishes it, passing or
failing, in its XCom tab (a run, `check_stream`, XCom): `stream_summary`,
one line (alive, stalled or down; the active driver's pid and host; the
standby drivers; the last batch, its age and watermark; the lag; restarts),
and `stream_state`, the same as JSON (`state`, `active_driver` with how it
was seen: its process, the leadership group or a heartbeat,
`standby_drivers`, `last_batch`, `last_batch_age_s`, `watermark`,
`lag_records`, `lag_oldest_s`, `restarts_in_window`, `last_failover`,
`checked_at`). The same facts as the stream row of `adpipe status`.

Without a standby, a death between two runs costs at most five minutes of latency, never data:
the restarted job resumes from its checkpoint and Kafka ledger, exactly once.
Every failed task alerts once through the one notifier (`adpipe.orchestration.alerts`).

Rails: every task is failed after `ADPIPE_STREAM_TASK_TIMEOUT_S` (600 s), a run
after 15 minutes; no retries (the next run, five minutes later, is the retry).
Kafka and Spark come from the Connections `adpipe_kafka` and `adpipe_spark`
(`adpipe.orchestration.connections`).
Logic: `adpipe.orchestration.stream_supervisor`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from adpipe.orchestration.alerts import notify_failure
from adpipe.orchestration.stream_supervisor import StreamStartOperator
from adpipe.settings import load_settings
from airflow.sdk import DAG, CronTriggerTimetable, task

# Parse time reads only the environment (no I/O): the tasks' timeout.
_settings = load_settings()

with DAG(
    dag_id="ad_aggregation_stream",
    schedule=CronTriggerTimetable("*/5 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=15),
    doc_md=__doc__,
    tags=["adpipe", "stream"],
    # Task level only: one failure is one alert (a DAG-level callback would add a second).
    # Idempotent, but the next run is the retry: no retries of their own.
    default_args={
        "owner": "adpipe",
        "retries": 0,
        "execution_timeout": timedelta(seconds=_settings.rails.stream_task_timeout_s),
        "on_failure_callback": notify_failure,
    },
) as dag:
    start = StreamStartOperator(task_id="start_stream_if_down")

    @task.sensor(task_id="wait_for_stream", poke_interval=5, timeout=300, mode="poke")
    def wait_for_stream(**context) -> bool:  # noqa: ANN003
        from adpipe.orchestration.connections import task_settings
        from adpipe.orchestration.stream_supervisor import STARTED_ON_XCOM, stream_started

        # The start may have run on another worker's host: its XCom says which.
        started_on = context["ti"].xcom_pull(task_ids="start_stream_if_down", key=STARTED_ON_XCOM)
        return stream_started(task_settings(), started_on)

    @task(task_id="check_stream")
    def check_stream(**context) -> dict:  # noqa: ANN003
        from adpipe.orchestration.connections import task_settings
        from adpipe.orchestration.stream_supervisor import check

        return check(task_settings(), ti=context["ti"])

    start >> wait_for_stream() >> check_stream()
