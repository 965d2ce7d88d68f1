"""``make airflow``: Airflow 3 on this machine, configured from the same
settings the jobs read.

    python -m adpipe.local.airflow [--no-kafka] [--exit-when-ready]

1. Start the local PostgreSQL (``adpipe pg up``) and keep Airflow's metadata
   in its ``airflow`` database; when PostgreSQL cannot start, fall back to
   SQLite under ``$ADPIPE_HOME/airflow`` (and say so).
2. Start the local Kafka broker (the stream DAG needs it) unless ``--no-kafka``.
3. ``airflow db migrate`` with ``AIRFLOW_HOME=$ADPIPE_HOME/airflow``, the DAGs
   folder of this repository, no examples; then the pool ``adpipe_tables``
   (one slot) the table writers of the load and maintenance DAGs share.
4. ``airflow standalone`` (api-server, scheduler, dag-processor, triggerer;
   LocalExecutor) with the Connections ``adpipe_spark``, ``adpipe_kafka``,
   ``adpipe_metastore_db``, ``adpipe_budget_db`` (and ``adpipe_spark_connect``
   when ``ADPIPE_SPARK_CONNECT`` names servers) given as ``AIRFLOW_CONN_*``
   variables built from :class:`adpipe.settings.Settings`: the tasks take
   their addresses and credentials from these (adpipe.orchestration.connections).
5. Once the UI answers, print its address and where the login is (Airflow's
   simple auth manager: user ``admin``, its password generated here before
   Airflow starts, so Airflow never prints it, and kept in
   ``$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated``, mode 0600).
   Nothing printed holds a password: the metadata URL is shown without it,
   and the Kafka connection's password is in its extra only.

DAGs start paused (Airflow's default): unpause them in the UI or with
``airflow dags unpause``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlsplit

from adpipe.settings import PROJECT_ROOT, TABLES_POOL, Settings, load_settings

log = logging.getLogger(__name__)

DAGS_FOLDER = PROJECT_ROOT / "dags"
ADMIN_USER = "admin"
# The pool of the table writers (adpipe.settings.TABLES_POOL), one slot, made
# by `migrate` (and by docker-compose's airflow-init): a task of a pool that
# does not exist is never scheduled.
TABLES_POOL_SLOTS = 1
TABLES_POOL_DESCRIPTION = "adpipe: the Spark steps that write the ads Delta tables, one at a time"


def airflow_home(settings: Settings) -> Path:
    return settings.home / "airflow"


def sqlite_url(settings: Settings) -> str:
    return f"sqlite:///{airflow_home(settings) / 'airflow.db'}"


def _db_connection(url: str) -> dict:
    """An Airflow connection (JSON form) for a SQLAlchemy URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme == "sqlite":
        return {"conn_type": "sqlite", "host": unquote(parts.path)}
    return {
        "conn_type": "postgres" if scheme.startswith("postgres") else scheme,
        "host": parts.hostname or "",
        "port": parts.port,
        "login": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "schema": parts.path.lstrip("/"),
    }


def connections_env(settings: Settings) -> dict[str, str]:
    """``AIRFLOW_CONN_*`` variables from the settings the jobs read: the
    Connections a task's settings come from (adpipe.orchestration.connections
    maps them back)."""
    env = {
        # The provider reads a master without "://" from the host field.
        "AIRFLOW_CONN_ADPIPE_SPARK": json.dumps({"conn_type": "spark", "host": settings.spark_master}),
        # librdkafka settings, credentials included on a secured cluster
        # (Airflow masks an extra key naming a password in its logs).
        "AIRFLOW_CONN_ADPIPE_KAFKA": json.dumps({"conn_type": "kafka", "extra": settings.kafka.client_config()}),
        # The PostgreSQL server and the Hive metastore's database on it.
        "AIRFLOW_CONN_ADPIPE_METASTORE_DB": json.dumps(
            _db_connection(settings.pg_url(settings.metastore_database))
        ),
        "AIRFLOW_CONN_ADPIPE_BUDGET_DB": json.dumps(_db_connection(settings.budget_db)),
    }
    if settings.spark_connect:
        # The load's Spark Connect servers, when the settings name any.
        env["AIRFLOW_CONN_ADPIPE_SPARK_CONNECT"] = json.dumps(_spark_connect_connection(settings.spark_connect))
    return env


def _spark_connect_connection(urls: str) -> dict:
    """An Airflow Spark Connect connection (JSON form) for
    ``ADPIPE_SPARK_CONNECT``: the first server as host and port, the others
    in the extra's ``urls``."""
    first, *others = urls.split(",")
    host, _, port = urlsplit(first).netloc.rpartition(":")  # an IPv6 host keeps its brackets
    connection = {"conn_type": "spark_connect", "host": host, "port": int(port)}
    return {**connection, "extra": {"urls": others}} if others else connection


def airflow_env(settings: Settings, database_url: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment Airflow runs in (every component, and ``dag.test``)."""
    env = dict(os.environ if base is None else base)
    home = airflow_home(settings)
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url,
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            # In a container (docker-compose) the UI must listen on 0.0.0.0.
            "AIRFLOW__API__HOST": env.get("AIRFLOW__API__HOST", "127.0.0.1"),
            "AIRFLOW__API__PORT": str(settings.airflow_port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{settings.airflow_port}",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{settings.airflow_port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
            # Two cores: one Spark job at a time is plenty.
            "AIRFLOW__CORE__PARALLELISM": "4",
            "ADPIPE_HOME": str(settings.home),
            "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
            **connections_env(settings),
            **metrics_env(settings),
        }
    )
    if settings.pg_password == Settings.pg_password:
        # The local PostgreSQL's password is the public, loopback-only
        # default "adpipe": Airflow masks a Connection's password in every
        # log line, and would turn each path and command naming adpipe into
        # ***. Longer secrets (every one adpipe generates) are masked still.
        env["AIRFLOW__LOGGING__MIN_LENGTH_MASKED_SECRET"] = str(len(Settings.pg_password) + 1)
    return env


def metrics_env(settings: Settings) -> dict[str, str]:
    """Airflow's own metrics (scheduler, DAG processing, task instances,
    DAG runs) as StatsD to ``ADPIPE_AIRFLOW_STATSD``: a statsd_exporter there
    turns them into Prometheus metrics (``airflow_...``). Off: none."""
    if not settings.airflow_statsd:
        return {"AIRFLOW__METRICS__STATSD_ON": "False"}
    host, port = settings.airflow_statsd.rsplit(":", 1)
    return {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": host,
        "AIRFLOW__METRICS__STATSD_PORT": port,
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }


def metadata_database(settings: Settings) -> str:
    """PostgreSQL's ``airflow`` database, started if needed; SQLite otherwise."""
    from adpipe.local import postgres

    try:
        postgres.up(settings)
        return settings.pg_url("airflow")
    except Exception as exc:  # noqa: BLE001 - any failure means: use the fallback
        log.warning("PostgreSQL unavailable (%s): Airflow metadata falls back to SQLite", exc)
        airflow_home(settings).mkdir(parents=True, exist_ok=True)
        return sqlite_url(settings)


def migrate(env: dict[str, str]) -> None:
    """The metadata database's schema (``airflow db migrate``), then the
    pool the DAGs' table writers share (``airflow pools set``: made, or its
    slots and description set again)."""
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)  # noqa: S603
    pool = [airflow, "pools", "set", TABLES_POOL, str(TABLES_POOL_SLOTS), TABLES_POOL_DESCRIPTION]
    subprocess.run(pool, env=env, check=True, stdout=subprocess.DEVNULL)  # noqa: S603


def ui_answers(port: int, timeout_s: float = 3.0) -> bool:
    return health(port, timeout_s) is not None


def health(port: int, timeout_s: float = 3.0) -> dict | None:
    """The API server's health report (metadata database, scheduler,
    triggerer, DAG processor, each with a ``status``), or None when it does
    not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=timeout_s) as r:  # noqa: S310
            return json.loads(r.read()) if r.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def admin_password_file(settings: Settings) -> Path:
    return airflow_home(settings) / "simple_auth_manager_passwords.json.generated"


def admin_password(settings: Settings) -> str | None:
    try:
        return json.loads(admin_password_file(settings).read_text()).get(ADMIN_USER)
    except (OSError, ValueError):
        return None


def ensure_admin_password(settings: Settings) -> Path:
    """The UI login's password file, made (0600) before Airflow starts: the
    simple auth manager prints a password it generates itself, and never one
    it finds in this file."""
    path = admin_password_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    if admin_password(settings) is None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps({ADMIN_USER: secrets.token_urlsafe(12)}) + "\n")
    path.chmod(0o600)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-kafka", action="store_true", help="do not start the local Kafka broker")
    parser.add_argument("--exit-when-ready", action="store_true", help="stop again once the UI answers (a check)")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings()

    database_url = metadata_database(settings)  # Step 1
    if not args.no_kafka:  # Step 2
        from adpipe import kafka_io
        from adpipe.local import kafka_broker

        kafka_broker.up(settings)
        kafka_io.ensure_pipeline_topics(settings)
    env = airflow_env(settings, database_url)
    airflow_home(settings).mkdir(parents=True, exist_ok=True)
    password_file = ensure_admin_password(settings)
    log.info("airflow db migrate (%s)", database_url.split("@")[-1])
    migrate(env)  # Step 3

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    # Ctrl-C, or SIGTERM (a background job ignores SIGINT): stop Airflow too.
    signal.signal(signal.SIGTERM, stop)
    airflow = str(Path(sys.executable).parent / "airflow")
    proc = subprocess.Popen([airflow, "standalone"], env=env, start_new_session=True)  # noqa: S603 - Step 4
    deadline = time.monotonic() + args.ready_timeout
    try:
        while not ui_answers(settings.airflow_port):  # Step 5
            if proc.poll() is not None:
                log.error("airflow standalone exited with %s", proc.returncode)
                return 1
            if time.monotonic() > deadline:
                log.error("the Airflow UI did not answer within %.0fs", args.ready_timeout)
                return 1
            time.sleep(2)
        print(
            "\n"
            f"  Airflow UI:  http://127.0.0.1:{settings.airflow_port}\n"
            f"  login:       {ADMIN_USER}, password in {password_file}\n"
            f"  metadata:    {database_url.split('@')[-1]}\n"
            f"  DAGs:        {DAGS_FOLDER} (paused at creation: unpause in the UI)\n"
            f"  AIRFLOW_HOME={airflow_home(settings)}\n",
            flush=True,
        )
        if args.exit_when_ready:
            return 0
        proc.wait()
        return proc.returncode or 0
    except KeyboardInterrupt:
        return 0
    finally:
        stop_standalone(proc)


def stop_standalone(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Stop ``airflow standalone`` started in a process group of its own:
    the scheduler, api-server, dag-processor and triggerer each stop cleanly
    on SIGTERM; what is left after ``timeout_s`` is killed."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
