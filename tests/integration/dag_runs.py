"""The driver scripts test_dags.py runs as processes of their own, with
Airflow's environment, and what reads their output: ``dag.test()`` of a
DAG (``DAG_TEST``), the runs of a backfill (``BACKFILL_RUN``), one worker's
share of a triggered run (``WORKER_RUN``), the tables' rows after them
(``TABLE_ROWS``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

# dag.test() for one DAG and one or more logical dates; prints one RESULT line
# per run, then (with ADPIPE_TEST_TABLE_HOURS) the rows of the three tables.
DAG_TEST = r"""
import json, sys
from datetime import datetime
from airflow.dag_processing.dagbag import DagBag
dag = DagBag(dag_folder=sys.argv[1]).dags[sys.argv[2]]
for ld in sys.argv[3].split(","):
    dr = dag.test(logical_date=datetime.fromisoformat(ld) if ld else None)
    tis = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
    print("RESULT " + json.dumps({"state": str(dr.state), "tis": tis,
          "interval": [str(dr.data_interval_start), str(dr.data_interval_end)]}), flush=True)
"""

# Runs the runs of the latest backfill of a DAG in this process, with the loop
# dag.test() uses (no scheduler, no executor): `airflow backfill create` made
# the runs and their data intervals; this executes their real task code
# (run_task_in_process, as dag.test()) in logical-date order. Each run is read
# afresh by id: running a task closes the scoped session, which detaches (and,
# after expire_all, empties) every DagRun object loaded before.
BACKFILL_RUN = r"""
import json, logging, sys, time
from sqlalchemy import select
from airflow import settings
from airflow.dag_processing.dagbag import DagBag
from airflow.models.backfill import Backfill
from airflow.models.dagrun import DagRun
from airflow.models.serialized_dag import SerializedDagModel
from airflow.sdk import timezone
from airflow.sdk.definitions.dag import _run_task
from airflow.utils.state import DagRunState, State, TaskInstanceState

log = logging.getLogger("backfill_run")
dag = DagBag(dag_folder=sys.argv[1]).dags[sys.argv[2]]
session = settings.Session()
# The scheduler's view of the DAG, as serialized in the metadata database: its
# deadline alerts by id (a copy serialized here keeps them as dicts, which a
# successful run's update_state cannot look up), with dag.test()'s callbacks.
scheduler_dag = SerializedDagModel.get_dag(dag.dag_id, session=session)
scheduler_dag.on_success_callback = dag.on_success_callback
scheduler_dag.on_failure_callback = dag.on_failure_callback
backfill = session.scalars(select(Backfill).where(Backfill.dag_id == dag.dag_id).order_by(Backfill.id.desc())).first()
run_ids = session.scalars(
    select(DagRun.id).where(DagRun.backfill_id == backfill.id).order_by(DagRun.logical_date)
).all()
for run_pk in run_ids:
    session = settings.Session()
    dr = session.scalars(select(DagRun).where(DagRun.id == run_pk)).one()
    dr.dag = scheduler_dag
    dr.state = DagRunState.RUNNING
    dr.start_date = timezone.utcnow()
    session.commit()
    while dr.state == DagRunState.RUNNING:
        session.expire_all()
        schedulable, _ = dr.update_state(session=session)
        for ti in schedulable:
            if ti.state != TaskInstanceState.UP_FOR_RESCHEDULE:
                ti.try_number += 1
            ti.state = TaskInstanceState.SCHEDULED
            ti.scheduled_dttm = timezone.utcnow()
        session.commit()
        tis = set(dr.get_task_instances(session=session))
        scheduled = [t for t in tis if t.state == TaskInstanceState.SCHEDULED]
        if not scheduled and any(t.state not in State.finished for t in tis):
            time.sleep(1)  # a retry or reschedule delay
        for ti in scheduled:
            try:
                _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
            except Exception:
                log.exception("Task failed; ti=%s", ti)
    session = settings.Session()
    dr = session.scalars(select(DagRun).where(DagRun.id == run_pk)).one()
    tis = {ti.task_id: str(ti.state) for ti in dr.get_task_instances(session=session)}
    print("RESULT " + json.dumps({"state": str(dr.state), "tis": tis, "run_id": dr.run_id,
          "interval": [str(dr.data_interval_start), str(dr.data_interval_end)]}), flush=True)
"""

# One worker's share of a DAG run that `airflow dags trigger` made: the
# scheduled task instances of the tasks named, run in this process with the
# loop dag.test() uses (update_state, then _run_task -> run_task_in_process:
# the real task code, its XComs in the metadata database), until each of them
# is finished; the others are left scheduled for the next worker. Prints
# RESULT (the run's state, its task instances') and XCOM (the stage task's
# XCom as the metadata database holds it).
WORKER_RUN = r"""
import json, logging, sys, time
from sqlalchemy import select
from airflow import settings
from airflow.dag_processing.dagbag import DagBag
from airflow.models.dagrun import DagRun
from airflow.models.serialized_dag import SerializedDagModel
from airflow.models.xcom import XComModel
from airflow.sdk import timezone
from airflow.sdk.definitions.dag import _run_task
from airflow.utils.state import DagRunState, State, TaskInstanceState

log = logging.getLogger("worker_run")
dag = DagBag(dag_folder=sys.argv[1]).dags[sys.argv[2]]
run_id, mine = sys.argv[3], set(sys.argv[4].split(","))
session = settings.Session()
# The scheduler's view of the DAG, as BACKFILL_RUN's.
scheduler_dag = SerializedDagModel.get_dag(dag.dag_id, session=session)
scheduler_dag.on_success_callback = dag.on_success_callback
scheduler_dag.on_failure_callback = dag.on_failure_callback
dr = session.scalars(select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id)).one()
dr.dag = scheduler_dag
if dr.state != DagRunState.RUNNING:
    dr.state = DagRunState.RUNNING
    dr.start_date = timezone.utcnow()
session.commit()
while dr.state == DagRunState.RUNNING:
    session.expire_all()
    schedulable, _ = dr.update_state(session=session)
    for ti in schedulable:
        if ti.state != TaskInstanceState.UP_FOR_RESCHEDULE:
            ti.try_number += 1
        ti.state = TaskInstanceState.SCHEDULED
        ti.scheduled_dttm = timezone.utcnow()
    session.commit()
    tis = {ti.task_id: ti for ti in dr.get_task_instances(session=session)}
    if all(tis[task_id].state in State.finished for task_id in mine):
        break
    scheduled = [ti for ti in tis.values() if ti.state == TaskInstanceState.SCHEDULED and ti.task_id in mine]
    if not scheduled:
        time.sleep(1)  # a retry delay
    for ti in scheduled:
        try:
            _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
        except Exception:
            log.exception("Task failed; ti=%s", ti)
session = settings.Session()
dr = session.scalars(select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id)).one()
tis = {ti.task_id: str(ti.state) for ti in dr.get_task_instances(session=session)}
print("RESULT " + json.dumps({"state": str(dr.state), "tis": tis, "run_id": run_id}), flush=True)
row = session.scalars(select(XComModel).where(
    XComModel.dag_id == dag.dag_id, XComModel.run_id == run_id, XComModel.task_id == "stage",
    XComModel.key == "return_value")).first()
print("XCOM " + json.dumps(XComModel.deserialize_value(row) if row is not None else None), flush=True)
"""

# Appended to a driver script when ADPIPE_TEST_TABLE_HOURS is set: after the
# runs, the three tables' rows of those hours (without the load time, sorted),
# read through the metastore in the same process (its Spark session is up
# already; a separate reader would start a second JVM for a few hundred rows).
TABLE_ROWS = r"""
import os
from datetime import datetime
from adpipe.lakehouse import tables
from adpipe.lakehouse.metastore import metastore_session
from adpipe.settings import load_settings
from pyspark.sql import functions as F
hours = os.environ.get("ADPIPE_TEST_TABLE_HOURS")
if hours:
    spark = metastore_session(load_settings(), "adpipe-test-read")
    hours = [datetime.fromisoformat(h) for h in hours.split(",")]
    out = {}
    for name in (tables.RAW, tables.AGGREGATES, tables.QUARANTINE):
        df = spark.table(name).where(F.col("event_hour").isin(hours)).drop("loaded_at")
        # Times as UTC text (the session's zone): collect() would give the host's local time.
        df = df.select(*[F.date_format(c, "yyyy-MM-dd'T'HH:mm:ss'Z'").alias(c) if t == "timestamp" else F.col(c)
                         for c, t in df.dtypes])
        out[name] = sorted(json.dumps(r.asDict(), default=str, sort_keys=True) for r in df.collect())
    print("TABLES " + json.dumps(out), flush=True)
"""
@dataclass
class Driver:
    """A driver script running as a subprocess; its whole output goes to a
    file next to the run's home (kept for a post-mortem, and no pipe to
    fill while another driver is waited on)."""

    proc: subprocess.Popen
    log_path: Path

    def finish(self, timeout: int = 600) -> tuple[list[dict], str]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        output = self.log_path.read_text()
        results = [json.loads(line[7:]) for line in output.splitlines() if line.startswith("RESULT ")]
        return results, output


def start_script(script: str, args: list[str], env: dict[str, str]) -> Driver:
    log_dir = Path(env["ADPIPE_HOME"]) / "test-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(  # noqa: S603
            [sys.executable, "-c", script + TABLE_ROWS, *args], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    return Driver(proc, log_path)


def run_script(script: str, args: list[str], env: dict[str, str], timeout: int = 600) -> tuple[list[dict], str]:
    return start_script(script, args, env).finish(timeout)


def task_log(output: str, task_id: str) -> str:
    """The log of the last try of ``task_id`` in a dag.test()-style run's
    output: the lines between Airflow's ``[DAG TEST] starting task_id=...``
    and ``[DAG TEST] end task task_id=...`` markers."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if f"[DAG TEST] starting task_id={task_id} " in line]
    if not starts:
        return ""
    section = []
    for line in lines[starts[-1] :]:
        section.append(line)
        if f"[DAG TEST] end task task_id={task_id} " in line:
            break
    return "\n".join(section)


def explain(results: list[dict], output: str, limit: int = 12000) -> str:
    """Why runs failed: the log of every task that did not succeed (or, with
    no RESULT line at all, the output's tail)."""
    parts = [f"RESULTS: {json.dumps(results)}"]
    for result in results:
        for task_id, state in result.get("tis", {}).items():
            if state in ("failed", "up_for_retry", "up_for_reschedule", "None", "queued", "scheduled"):
                parts.append(f"--- log of {task_id} ({state}) in {result.get('run_id', '')} ---")
                parts.append(task_log(output, task_id)[-limit:] or "(no log section found)")
    if len(parts) == 1:
        parts.append(output[-limit:])
    return "\n".join(parts)
