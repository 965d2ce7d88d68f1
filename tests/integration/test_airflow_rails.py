"""Airflow's own rails and Connections, with Airflow's real task runner
against the real broker and PostgreSQL:

1. A DAG run whose worker has no ``ADPIPE_KAFKA_*``, no database and no
   Spark setting, only Connections (``AIRFLOW_CONN_*``, Airflow's
   environment secrets backend): ``ad_table_maintenance`` on a broker that
   lets no one in without SASL/SCRAM over TLS (``kafka up --secure``), a
   PostgreSQL role with a random password that only the Connections name,
   and the Hive metastore's database named only there. Its OPTIMIZE and
   VACUUM open the metastore, its ledger prune reads the aggregates topic's
   retention as the ``airflow`` user and prunes that role's ledger. Every
   log of the run (the run's output, every file under its home and
   Airflow's, the broker's logs) is searched for both passwords.
2. ``execution_timeout`` kills a task that hangs: the stream DAG's
   ``wait_for_stream`` waiting for a job that never comes up
   (``ADPIPE_STREAM_TASK_TIMEOUT_S=4``, the sensor's own timeout 300 s),
   through ``dag.test()``; the alert names ``AirflowTaskTimeout``.
3. A load step that hangs in the warm load driver (the real driver's
   server, lock and protocol, its verb a stand-in that never returns) is
   killed by its ``execution_timeout`` through ``airflow tasks test``, and
   so is the driver, which would otherwise hold the load for every step
   after it.

Each run's whole output is kept under its home's ``test-logs``."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe import kafka_io
from adpipe import pg as pg_client
from adpipe.lakehouse import warm
from adpipe.local import kafka_broker, kafka_security
from adpipe.local.airflow import DAGS_FOLDER, airflow_env, migrate
from adpipe.orchestration.alerts import alerts_file
from adpipe.orchestration.stream_supervisor import record_start
from adpipe.settings import TABLES_POOL, Settings, isolated_env, load_settings

from tests.conftest import JVM_OPTIONS, PORT_BASE, TEST_HOME

AIRFLOW = str(Path(sys.executable).parent / "airflow")
SECURE_BOOTSTRAP = f"127.0.0.1:{PORT_BASE + 85}"
# What a worker under Airflow takes from its Connections, never from its environment.
CONNECTION_SETTINGS = (
    "ADPIPE_KAFKA_", "ADPIPE_PG_", "ADPIPE_BUDGET_DB", "ADPIPE_METASTORE_DATABASE", "ADPIPE_SPARK_MASTER"
)

# dag.test() of one DAG; prints one RESULT line: the run's state and each
# task's state and duration.
DAG_TEST = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
dag = DagBag(dag_folder=sys.argv[1]).dags[sys.argv[2]]
dr = dag.test()
tis = {ti.task_id: [str(ti.state), ti.duration] for ti in dr.get_task_instances()}
print("RESULT " + json.dumps({"state": str(dr.state), "tis": tis}), flush=True)
"""


@dataclass
class Run:
    returncode: int
    output: str
    log_path: Path

    def result(self) -> dict:
        lines = [line for line in self.output.splitlines() if line.startswith("RESULT ")]
        assert lines, self.output[-6000:]
        return json.loads(lines[-1][7:])


def _run(args: list[str], env: dict[str, str], timeout: float = 300) -> Run:
    log_dir = Path(env["ADPIPE_HOME"]) / "test-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}.log"
    with log_path.open("w") as out:
        done = subprocess.run(args, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)  # noqa: S603
    return Run(done.returncode, log_path.read_text(errors="replace"), log_path)


def _dag_test(dag_id: str, env: dict[str, str]) -> Run:
    return _run([sys.executable, "-c", DAG_TEST, str(DAGS_FOLDER), dag_id], env)


@pytest.fixture(scope="module")
def metadata(pg: Settings) -> str:
    """Airflow's metadata database (the session PostgreSQL's ``airflow``),
    migrated, and the pool made, by ``make airflow``'s own ``migrate``."""
    url = pg.pg_url("airflow")
    migrate(airflow_env(pg, url, base={**os.environ, "ADPIPE_HOME": str(TEST_HOME / "it")}))
    conn = pg_client.connect(pg, "airflow")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT slots FROM slot_pool WHERE pool = %s", (TABLES_POOL,))
            assert cur.fetchall() == [(1,)]
    finally:
        conn.close()
    return url


# -- 1. Connections only ------------------------------------------------------------


@dataclass
class Secure:
    settings: Settings  # the broker's (admin's) settings
    name: str


@pytest.fixture(scope="module")
def secure_broker() -> Iterator[Secure]:
    home = TEST_HOME / "rails-secure"
    name = f"r{uuid.uuid4().hex[:6]}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ADPIPE_KAFKA_")},
        "ADPIPE_HOME": str(home),
        "ADPIPE_KAFKA_BOOTSTRAP": SECURE_BOOTSTRAP,
        "ADPIPE_KAFKA_CONTROLLER_PORT": str(PORT_BASE + 86),
        "ADPIPE_JVM_OPTIONS": JVM_OPTIONS,
        **isolated_env(name),
    }
    settings = load_settings(env)
    kafka_broker.down(settings)
    shutil.rmtree(home, ignore_errors=True)
    up = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "adpipe", "kafka", "up", "--secure"], env=env, capture_output=True, text=True,
        timeout=240, check=False,
    )
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-3000:]
    try:
        yield Secure(settings, name)
    finally:
        kafka_broker.down(settings)


def _role(pg: Settings, name: str, password: str, databases: tuple[str, ...]) -> None:
    """A PostgreSQL role of its own, owning ``databases``: only the
    Connections name it and its password."""
    conn = pg_client.connect(pg, "postgres")
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE ROLE "{name}" LOGIN PASSWORD %s', (password,))
            for database in databases:
                cur.execute(f'CREATE DATABASE "{database}" OWNER "{name}"')
    finally:
        conn.close()


def _files_holding(roots: list[Path], needles: list[str], skip: tuple[Path, ...] = ()) -> list[str]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if not path.is_file() or any(path.is_relative_to(s) for s in skip):
                continue
            text = path.read_bytes()
            found += [f"{path}: {i}" for i, needle in enumerate(needles) if needle.encode() in text]
    return found


# About 100 s (a secure broker, then OPTIMIZE and VACUUM of seven empty tables): make test-slow.
@pytest.mark.slow
def test_a_dag_run_with_only_connections_reaches_a_secure_broker_and_databases_and_logs_no_secret(
    secure_broker: Secure, pg: Settings, metadata: str, tmp_path: Path
) -> None:
    import sqlalchemy as sa
    from adpipe.budget import db
    from adpipe.budget.schema import ensure_schema

    name = secure_broker.name
    role, pg_password = f"{name}_airflow", secrets.token_hex(12)
    metastore_db, budget_db = f"{name}_metastore", f"{name}_budget"
    _role(pg, role, pg_password, (metastore_db, budget_db))
    kafka_password = (kafka_security.secrets_dir(secure_broker.settings) / "airflow.password").read_text().strip()
    budget_url = f"postgresql+psycopg2://{role}:{pg_password}@127.0.0.1:{pg.pg_port}/{budget_db}"

    # A ledger row applied 30 days ago: past the topic's 7 days plus the 168 h margin.
    budget_settings = load_settings({"ADPIPE_BUDGET_DB": budget_url})
    engine = db.make_engine(budget_settings)
    try:
        ensure_schema(engine, budget_settings)
        with engine.begin() as conn:
            conn.execute(sa.insert(db.ledger), [{
                "record_uuid": "old-1", "ad_id": "ad-1", "window_start": "2026-10-01T00:00:00Z", "period": "total",
                "impressions": 10, "clicks": 1, "cpm_micros": 1, "cpc_micros": 1, "spend_micros": 7,
                "kafka_topic": "t", "kafka_partition": 0, "kafka_offset": 1,
                "applied_at": datetime.now(UTC) - timedelta(days=30)}])
    finally:
        engine.dispose()

    home = tmp_path / "home"
    base = {
        **{k: v for k, v in os.environ.items() if not k.startswith(CONNECTION_SETTINGS)},
        "ADPIPE_HOME": str(home), "ADPIPE_JVM_OPTIONS": JVM_OPTIONS, "ADPIPE_SPARK_DRIVER_MEMORY": "1g",
        **isolated_env(name),
    }
    env = {k: v for k, v in airflow_env(load_settings(base), metadata, base=base).items()
           if not k.startswith(("AIRFLOW_CONN_", *CONNECTION_SETTINGS))}
    env.update({
        "AIRFLOW_CONN_ADPIPE_KAFKA": json.dumps({"conn_type": "kafka", "extra": {
            "bootstrap.servers": SECURE_BOOTSTRAP, "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "airflow", "sasl.password": kafka_password,
            "ssl.ca.location": str(kafka_security.ca_file(secure_broker.settings))}}),
        "AIRFLOW_CONN_ADPIPE_METASTORE_DB": json.dumps({"conn_type": "postgres", "host": "127.0.0.1",
                                                        "port": pg.pg_port, "login": role, "password": pg_password,
                                                        "schema": metastore_db}),
        "AIRFLOW_CONN_ADPIPE_BUDGET_DB": json.dumps({"conn_type": "postgres", "host": "127.0.0.1",
                                                     "port": pg.pg_port, "login": role, "password": pg_password,
                                                     "schema": budget_db}),
        "AIRFLOW_CONN_ADPIPE_SPARK": json.dumps({"conn_type": "spark", "host": "local[1]"}),
    })
    assert not [k for k in env if k.startswith(CONNECTION_SETTINGS)]
    # Without the Connections these are the defaults: nothing listens there.
    assert load_settings(env).kafka_bootstrap == "127.0.0.1:9092" and load_settings(env).pg_port == 5433

    run = _dag_test("ad_table_maintenance", env)
    result = run.result()
    assert result["state"] == "success", run.output[-8000:]
    assert {t: s for t, (s, _d) in result["tis"].items()} == {
        "optimize_and_vacuum": "success", "prune_budget_ledger": "success"}
    # The metastore: its schema made by the role, in the database only the Connection names.
    conn = pg_client.connect(load_settings({"ADPIPE_PG_PORT": str(pg.pg_port), "ADPIPE_PG_USER": role,
                                            "ADPIPE_PG_PASSWORD": pg_password}), metastore_db)
    try:
        with conn.cursor() as cur:
            cur.execute('SELECT count(*) FROM "DBS"')
            assert cur.fetchone()[0] >= 1
    finally:
        conn.close()
    # The ledger: pruned after reading the aggregates topic's retention over SASL_SSL.
    engine = db.make_engine(budget_settings)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(db.ledger)).scalar_one() == 0
            pruned = conn.execute(sa.select(db.ledger_pruned.c.spend_micros, db.ledger_pruned.c.records)).all()
            assert [tuple(r) for r in pruned] == [(7, 1)]
    finally:
        engine.dispose()
    assert "pruned 1 ledger rows" in run.output

    # No password in any log of the run: its output, its home (Spark's and
    # the tasks' logs included), Airflow's home, the broker's logs.
    broker_home = secure_broker.settings.home
    leaks = _files_holding(
        [home, Path(env["AIRFLOW_HOME"]), broker_home], [pg_password, kafka_password],
        skip=(kafka_security.secrets_dir(secure_broker.settings), kafka_security.tls_dir(secure_broker.settings),
              *(node.config for node in kafka_broker.nodes(secure_broker.settings))),
    )
    assert leaks == []
    assert pg_password not in run.output and kafka_password not in run.output
    assert len([p for p in home.rglob("*.log") if p.stat().st_size]) >= 2  # the search had logs to read


# -- 2. a task killed by its execution_timeout ----------------------------------------


def test_a_task_that_hangs_is_killed_by_its_execution_timeout(
    broker: Settings, metadata: str, tmp_path: Path
) -> None:
    name = f"rt{uuid.uuid4().hex[:6]}"
    base = {
        **os.environ, "ADPIPE_HOME": str(tmp_path / "home"), "ADPIPE_KAFKA_BOOTSTRAP": broker.kafka_bootstrap,
        "ADPIPE_STREAM_TASK_TIMEOUT_S": "4", **isolated_env(name),
    }
    settings = load_settings(base)
    kafka_io.ensure_pipeline_topics(settings)
    # A "stream job" that runs and never comes up (no started line in its log).
    script = tmp_path / "aggregation_stream.py"
    script.write_text("import sys\nsys.stdin.read()\n")
    job = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE)  # noqa: S603
    try:
        deadline = time.monotonic() + 10
        while b"aggregation_stream" not in Path(f"/proc/{job.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        record_start(settings, job.pid, tmp_path / "job.log")
        began = time.monotonic()
        run = _dag_test("ad_aggregation_stream", airflow_env(settings, metadata, base=base))
        elapsed = time.monotonic() - began
    finally:
        job.kill()
        job.wait()
    result = run.result()
    states = {t: s for t, (s, _d) in result["tis"].items()}
    assert (result["state"], states) == ("failed", {
        "start_stream_if_down": "success", "wait_for_stream": "failed", "check_stream": "upstream_failed"
    }), run.output[-6000:]
    duration = result["tis"]["wait_for_stream"][1]
    assert 4 <= duration < 15, duration  # its execution_timeout, not the sensor's 300 s
    assert "AirflowTaskTimeout" in run.output
    alert = [json.loads(line) for line in alerts_file(settings).read_text().splitlines()][-1]
    assert (alert["task_id"], alert["message"].split(":")[0]) == ("wait_for_stream", "AirflowTaskTimeout")
    assert elapsed < 120


# -- 3. a load step that hangs in the warm load driver --------------------------------

STAND_IN_DRIVER = r"""
import logging, sys, time
from adpipe.lakehouse import warm
from adpipe.settings import load_settings
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
# The warm load driver's own server (lock, warm.json, token, fingerprint,
# protocol); the verb it runs never returns, as a Spark step that hangs.
sys.exit(warm.serve(load_settings(), run=lambda argv: time.sleep(3600) or 0, warm_up=lambda settings: None))
"""


def test_a_load_step_hanging_in_the_warm_driver_is_killed_with_the_driver(
    broker: Settings, metadata: str, tmp_path: Path
) -> None:
    name = f"rw{uuid.uuid4().hex[:6]}"
    base = {
        **os.environ, "ADPIPE_HOME": str(tmp_path / "home"), "ADPIPE_KAFKA_BOOTSTRAP": broker.kafka_bootstrap,
        "ADPIPE_LOAD_SUBMIT": "warm", "ADPIPE_LOAD_STEP_TIMEOUT_S": "4", **isolated_env(name),
    }
    settings = load_settings(base)
    env = airflow_env(settings, metadata, base=base)
    driver_log = tmp_path / "driver.log"
    with driver_log.open("w") as out:
        driver = subprocess.Popen(  # noqa: S603 - detached, as warm.ensure_driver starts one
            [sys.executable, "-c", STAND_IN_DRIVER], env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while warm.ping(settings) is None:
            assert driver.poll() is None and time.monotonic() < deadline, driver_log.read_text()[-3000:]
            time.sleep(0.2)
        # The DAG as the CLI finds it (`tasks test` reads the run's DAG from the database).
        reserialized = _run([AIRFLOW, "dags", "reserialize"], env)
        assert reserialized.returncode == 0, reserialized.output[-3000:]
        run = _run([AIRFLOW, "tasks", "test", "ad_union_and_load", "stage", "2026-11-22T13:00:00+00:00",
                    "--task-params", json.dumps({"hour": "2026-11-22T12"})], env, timeout=120)
        assert "request: adpipe load --hour 2026-11-22T12 --step stage" in driver_log.read_text()
        assert "AirflowTaskTimeout" in run.output, run.output[-6000:]
        # on_kill took the hung driver down with the task (SIGKILL: a hung verb never ends on SIGTERM).
        driver.wait(timeout=30)
        assert driver.returncode == -9
        assert warm.ping(settings) is None
        assert "killing the warm load driver" in run.output
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, 9)
            driver.wait()
