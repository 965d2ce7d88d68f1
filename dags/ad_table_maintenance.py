"""
### ad_table_maintenance — daily OPTIMIZE and VACUUM of the `ads` Delta tables, and the budget ledger's retention

**Why.** Every hourly Union & Load MERGEs a few small files into each hour's
partition (a rerun, a backfill or a late correction adds more), so the
number of files, and the time to plan and read them, grows all day. Once a
day this DAG compacts them and deletes the files no recent version needs:

1. `optimize_and_vacuum` — for `ads.ad_events_raw`, `ads.ad_minute_aggregates`,
   `ads.ad_events_quarantine`, their staging twins in `ads_staging` and the
   loads' ledger `ads.load_runs`, one after the other
   (`adpipe.lakehouse.maintenance`; `adpipe maintain` does the same):
   * the table's `delta.deletedFileRetentionDuration` is set to
     `n = ADPIPE_VACUUM_RETENTION_H` hours (168 = 7 days, and never less:
     Delta's retention check stays on, so a reader or a load that began
     before the OPTIMIZE never loses a file, and time travel reaches 7 days
     back). Delta 4's VACUUM applies this property and ignores its `RETAIN`
     clause; a commit only when the value changes.
   * `OPTIMIZE <table>` bin-packs each partition's small files into few
     large ones in one Delta commit (`dataChange=false`: the same rows).
   * `VACUUM <table> RETAIN <n> HOURS` deletes the files that no table
     version of the last n hours references.

   A table that does not exist yet is skipped. The task returns, per table,
   the files OPTIMIZE added and removed, the files VACUUM deleted and the
   seconds it took.
2. `prune_budget_ledger` (beside it, independent) — `adpipe budget prune`:
   deletes the budget ledger's rows applied more than the aggregates topic's
   `retention.ms` plus `ADPIPE_BUDGET_LEDGER_MARGIN_H` (168) hours ago; their
   sums stay in `budget_ledger_pruned` and spend is unchanged
   (`adpipe.budget.retention`). Skipped without a budget database.

Schedule: `CronTriggerTimetable("30 3 * * *", UTC)` — 03:30 UTC every day,
half an hour away from the hourly loads' start. `optimize_and_vacuum` runs in
the pool `adpipe_tables` (one slot) with the load's stage, validate and
publish, so an OPTIMIZE never runs beside a MERGE on the same table; each
task retries once after 10 minutes and is failed after
`ADPIPE_MAINTENANCE_TIMEOUT_S` (4800 s). No catchup: a missed day adds nothing
to do but the next run's compaction. One run at a time; a run longer than 3
hours is failed.

Alerts: `notify_failure` is the task's failure callback only, as in every
adpipe DAG: one failure is one alert, with the task's exception (a DAG-level
callback would alert a second time for the same failure).

Logic: `adpipe.orchestration.maintenance_tasks`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from adpipe.orchestration.alerts import notify_failure
from adpipe.settings import TABLES_POOL, load_settings
from airflow.sdk import DAG, CronTriggerTimetable, task

# Parse time reads only the environment (no I/O): the tasks' timeout.
_settings = load_settings()

with DAG(
    dag_id="ad_table_maintenance",
    schedule=CronTriggerTimetable("30 3 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(hours=3),
    doc_md=__doc__,
    tags=["adpipe", "maintenance"],
    default_args={
        "owner": "adpipe",
        "retries": 1,
        "retry_delay": timedelta(minutes=10),
        "execution_timeout": timedelta(seconds=_settings.rails.maintenance_timeout_s),
        "on_failure_callback": notify_failure,
    },
) as dag:

    @task(task_id="optimize_and_vacuum", pool=TABLES_POOL)
    def optimize_and_vacuum() -> list[dict]:
        from adpipe.orchestration import maintenance_tasks
        from adpipe.orchestration.connections import task_settings

        return maintenance_tasks.optimize_and_vacuum(task_settings())

    @task(task_id="prune_budget_ledger")
    def prune_budget_ledger() -> dict:
        from adpipe.orchestration import maintenance_tasks
        from adpipe.orchestration.connections import task_settings

        return maintenance_tasks.prune_budget_ledger(task_settings())

    optimize_and_vacuum()
    prune_budget_ledger()
