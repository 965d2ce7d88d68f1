"""
### ad_hour_repair — repair or discard an hour held by its quality gate, from the trigger form

**When.** An hour whose Great Expectations gate (or whose repair's gate)
failed is *held*: its rows stay staged in `ads_staging`, later loads
publish the other hours and leave it alone, and one alert names it. It
waits for an engineer, who inspects it (the failed `validate` task's log,
the hour's Data Docs) and decides here. No schedule: only a manual run.

**The form** (Trigger, then the run's parameters; Airflow checks both
against their schema before it creates the run):

* `hour` — the held hour, UTC, `YYYY-MM-DDTHH` (the alert names it);
* `action` —
  * `repair`: rebuild the hour from Kafka (read from the hour's start,
    whatever was loaded), audited by the same gate, written over its
    published partitions in one commit per table. For an hour whose
    published or staged rows are wrong while Kafka is right. A repair whose
    gate fails again writes nothing: the hour stays held, and the task's
    log names the expectations.
  * `discard_staged`: delete the hour's staged rows; its published rows
    stand. For staged rows judged unpublishable, such as a duplicate a
    broken upstream wrote to Kafka (a repair, which reads Kafka again,
    would fail on it).

One task, `act_on_held_hour`: the command line's own action,
`adpipe load --hour H --repair|--discard-staged --held-only`, run where
the load's steps run (`ADPIPE_LOAD_SUBMIT`: the warm load driver by
default). An hour that no failed gate holds is left unchanged and the task
fails, naming the hour's last step (published, repaired, discarded).
On success its log and its XCom `return_value` end with the rows of the
hour now published, per table; a repair also updates the three tables'
Assets (through the alias `adpipe_repaired_tables`).

**Rails.** The task takes the pool `adpipe_tables` (one slot, with the
load's table writers and the maintenance), is failed after
`ADPIPE_LOAD_STEP_TIMEOUT_S` (3600 s), and never retried (an operator's
action: fail and say why); a run after `ADPIPE_LOAD_RUN_TIMEOUT_S` (8 h:
it may wait for the pool behind a load). One run at a time. A failure
alerts once through the one notifier. Kafka, PostgreSQL and Spark come
from the Connections `adpipe_kafka`, `adpipe_metastore_db`, `adpipe_spark`.

Logic: `adpipe.orchestration.hour_actions`, `adpipe.lakehouse.repair`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from adpipe.orchestration.alerts import notify_failure
from adpipe.orchestration.assets import REPAIRED_TABLES
from adpipe.orchestration.hour_actions import ACTIONS, hour_action_operator
from adpipe.orchestration.load_tasks import HOUR_PATTERN
from adpipe.settings import TABLES_POOL, load_settings
from airflow.sdk import DAG, Param

# Parse time reads only the environment (no I/O): timeouts, where the action runs.
_settings = load_settings()

with DAG(
    dag_id="ad_hour_repair",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(seconds=_settings.rails.load_run_timeout_s),
    doc_md=__doc__,
    tags=["adpipe", "load", "operator"],
    params={
        "hour": Param(
            type="string",
            pattern=HOUR_PATTERN,
            title="Held hour",
            description="The UTC hour the alert names, YYYY-MM-DDTHH (e.g. 2026-11-22T12)",
        ),
        "action": Param(
            "repair",
            type="string",
            enum=list(ACTIONS),
            values_display={
                "repair": "repair: rebuild the hour from Kafka, audited, over its published rows",
                "discard_staged": "discard_staged: delete its staged rows; its published rows stand",
            },
            title="Action",
            description="What to do with the held hour (this DAG's Docs say when to choose which)",
        ),
    },
    default_args={
        "owner": "adpipe",
        "retries": 0,
        "execution_timeout": timedelta(seconds=_settings.rails.load_step_timeout_s),
        "on_failure_callback": notify_failure,
    },
) as dag:
    hour_action_operator(
        _settings.load_submit, task_id="act_on_held_hour", pool=TABLES_POOL, outlets=[REPAIRED_TABLES]
    )
