"""docker-compose.yaml holds the roles of the tested multi-host harness
(tests/integration/test_airflow_hosts.py): Airflow's options as the harness
sets them, the CeleryExecutor on Redis, two workers each with its own
ADPIPE_HOME, the checkpoint and warehouse every Spark driver and executor
shares, a Spark standalone cluster started as ``adpipe spark up`` starts
one, and the load's Spark Connect server the workers' load steps are
clients of (the harness's Spark Connect variant)."""

from __future__ import annotations

import ast
import json
import shlex
import sys
from pathlib import Path
from urllib.parse import urlsplit

from adpipe.local import spark_cluster
from adpipe.settings import load_settings

from tests.unit.local.compose_file import (
    AIRFLOW_SERVICES,
    AIRFLOW_WORKERS,
    COMPOSE,
    HARNESS,
    SHARED_MOUNT,
    SHARED_VOLUME,
    SPARK_CONNECT,
    SPARK_DRIVERS,
    load_compose,
    service_env,
    service_settings,
)


def _harness_airflow_options() -> dict[str, str | None]:
    """The AIRFLOW__* options the harness's ``airflow_on()`` sets on every
    host: a literal's value, None for one it computes (an address, a secret)."""
    tree = ast.parse(HARNESS.read_text())
    [airflow_on] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "airflow_on"]
    found: dict[str, str | None] = {}
    for node in ast.walk(airflow_on):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and str(key.value).startswith("AIRFLOW__"):
                    found[key.value] = value.value if isinstance(value, ast.Constant) else None
    return found


# The harness's options this stack sets otherwise, on purpose.
HARNESS_DIFFERS = {
    # Its hosts' addresses: here the services' names (checked below).
    "AIRFLOW__CELERY__BROKER_URL", "AIRFLOW__CELERY__RESULT_BACKEND", "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    # Airflow's defaults in a container: every interface, port 8080.
    "AIRFLOW__API__HOST", "AIRFLOW__API__PORT", "AIRFLOW__API__BASE_URL",
    # Generated once by airflow-init into the shared airflow.cfg, not passed around.
    "AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY",
    # The harness's speed-ups: 20 s to a dead worker's task failing (60 here),
    # a detection every 2 s, DAG files never parsed again.
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL",
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL",
}


def test_airflow_runs_the_harness_s_celery_executor_on_redis() -> None:
    services = load_compose()["services"]
    harness = _harness_airflow_options()
    assert HARNESS_DIFFERS <= set(harness), "the harness's options changed: see HARNESS_DIFFERS"
    for name in AIRFLOW_SERVICES | {"airflow-init"}:
        env = service_env(services[name])
        for option, value in harness.items():
            if option not in HARNESS_DIFFERS:
                assert value is not None and env.get(option) == value, f"{name}: {option} is not the harness's"
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__CELERY__WORKER_CONCURRENCY"] == "2", name
        # The broker: the redis service; the results: Airflow's metadata
        # database, as the harness builds the URL (SQLAlchemy's default driver).
        assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://redis:6379/0", name
        metadata = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert metadata == load_settings({"ADPIPE_PG_HOST": "postgres", "ADPIPE_PG_PORT": "5432"}).pg_url("airflow")
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+" + metadata.replace("+psycopg2", ""), name
        assert urlsplit(env["AIRFLOW__CELERY__RESULT_BACKEND"]).scheme == "db+postgresql", name
        # A dead worker's task is failed a minute after its last heartbeat, then retried on a live worker.
        assert env["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"] == "60", name
    redis = services["redis"]
    assert redis["image"] == "redis:7.2-bookworm" and redis["restart"] == "always" and "ports" not in redis
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "LocalExecutor" not in COMPOSE.read_text()


def test_two_celery_workers_each_a_host_with_its_own_home() -> None:
    compose = load_compose()
    services = compose["services"]
    assert {n for n in services if "worker" in n and n.startswith("airflow-")} == AIRFLOW_WORKERS
    homes = set()
    for name in sorted(AIRFLOW_WORKERS):
        worker = services[name]
        host = worker["hostname"]
        assert host == name.removeprefix("airflow-"), name  # worker-1, worker-2: the harness's hosts
        # Airflow's compose file's healthcheck and warm shutdown for its workers.
        assert worker["healthcheck"]["test"] == ["CMD-SHELL", (
            "celery --app airflow.providers.celery.executors.celery_executor.app inspect ping"
            ' -d "celery@$${HOSTNAME}"'
        )]
        assert service_env(worker)["DUMB_INIT_SETSID"] == "0"
        assert worker["depends_on"]["spark-master"] == {"condition": "service_healthy"}
        # Its home: a volume of its own, neither the control plane's nor the other worker's.
        settings = service_settings(worker)
        [home] = [v.split(":")[0] for v in worker["volumes"] if v.split(":")[1] == str(settings.home)]
        assert home == f"adpipe-home-{host}" and home in compose["volumes"]
        homes.add(home)
        # The checkpoint and the warehouse: the ones every worker and the stream job share.
        assert f"{SHARED_VOLUME}:{SHARED_MOUNT}" in worker["volumes"]
        assert settings.checkpoint_uri.startswith(f"file://{SHARED_MOUNT}/checkpoints/")
        assert settings.warehouse_uri == f"file://{SHARED_MOUNT}/warehouse"
        # Its Spark drivers are reached by their executors at its name, an alias on the network.
        assert settings.spark_driver_host == host and host in worker["networks"]["default"]["aliases"]
    assert len(homes) == 2 and "adpipe-home" not in homes


def test_every_spark_driver_and_executor_shares_the_checkpoint_and_warehouse() -> None:
    services = load_compose()["services"]
    stream = service_settings(services["stream"])
    assert stream.checkpoint_base_uri == f"file://{SHARED_MOUNT}/checkpoints"
    assert stream.warehouse_base_uri == f"file://{SHARED_MOUNT}/warehouse"
    for name, service in services.items():
        if not any(v.startswith("ADPIPE_") for v in service_env(service)):
            continue
        settings = service_settings(service)
        # Every adpipe process, Airflow's too, names the same ones, on the shared volume it mounts.
        assert (settings.checkpoint_uri, settings.warehouse_uri) == (stream.checkpoint_uri, stream.warehouse_uri), name
        assert f"{SHARED_VOLUME}:{SHARED_MOUNT}" in service["volumes"], name
    assert f"{SHARED_VOLUME}:{SHARED_MOUNT}" in services["spark-worker"]["volumes"]
    # Each driver has an address of its own its executors reach: its service's name or its alias.
    drivers = {n: service_settings(s).spark_driver_host for n, s in services.items()
               if "ADPIPE_SPARK_DRIVER_HOST" in service_env(s)}
    assert set(drivers) == SPARK_DRIVERS and len(set(drivers.values())) == len(drivers)
    for name, host in drivers.items():
        aliases = services[name].get("networks", {}).get("default", {}).get("aliases", [])
        assert host == name or host in aliases, name


def _megabytes(size: str) -> int:
    return int(size[:-1]) * {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[size[-1].lower()]


def _options(words: list[str]) -> dict[str, str]:
    return dict(zip(words[::2], words[1::2], strict=True))


def _java_properties(options: str) -> dict[str, str]:
    assert all(word.startswith("-D") for word in shlex.split(options)), options
    return dict(word.removeprefix("-D").split("=", 1) for word in shlex.split(options))


def test_spark_runs_on_a_standalone_cluster_as_adpipe_spark_up_starts_it() -> None:
    services = load_compose()["services"]
    master, worker = services["spark-master"], services["spark-worker"]
    # pyspark's spark-class, installed beside adpipe's own command (the
    # stream service's), as in this environment.
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "spark-class").is_file() and (bin_dir / "adpipe").is_file()
    assert master["command"][:2] == ["spark-class", spark_cluster.MASTER_CLASS]
    master_options = _options(master["command"][2:])
    assert master_options == {"--host": "spark-master", "--port": "7077", "--webui-port": "8081"}
    url = f"spark://{master_options['--host']}:{master_options['--port']}"
    # Every adpipe process's master, Airflow's tasks' through their Connection
    # (which connections_env builds from the stream's settings: checked above).
    assert service_settings(services["stream"]).spark_master == url
    assert json.loads(service_env(services["airflow-worker-1"])["AIRFLOW_CONN_ADPIPE_SPARK"])["host"] == url
    for name, service in services.items():
        if "ADPIPE_SPARK_MASTER" in service_env(service):
            assert service_settings(service).spark_master == url, name
    assert worker["command"][:3] == ["spark-class", spark_cluster.WORKER_CLASS, url]
    worker_options = _options(worker["command"][3:])
    assert worker_options["--host"] == "spark-worker" and worker_options["--webui-port"] == "8082"
    # The local cluster's daemons' heap and properties.
    for service, variable, properties in ((master, "SPARK_MASTER_OPTS", spark_cluster.MASTER_PROPERTIES),
                                          (worker, "SPARK_WORKER_OPTS", spark_cluster.WORKER_PROPERTIES)):
        env = service_env(service)
        assert env == {"SPARK_DAEMON_MEMORY": spark_cluster.DAEMON_MEMORY, variable: env[variable]}
        assert _java_properties(env[variable]) == properties
    # A core and an executor's heap for every application that may run at
    # once (the stream job, its standby, each worker's warm load driver),
    # each capped: one would take every core, and the next wait for one.
    drivers = [service_settings(services[n]) for n in SPARK_DRIVERS]
    assert all(d.spark_cores_max >= 1 for d in drivers)
    assert int(worker_options["--cores"]) >= sum(d.spark_cores_max for d in drivers)
    assert _megabytes(worker_options["--memory"]) >= sum(_megabytes(d.spark_executor_memory) for d in drivers)
    # Health: each daemon's web UI; the drivers and the worker start once the master answers.
    assert master["healthcheck"]["test"] == ["CMD", "curl", "--fail", "http://localhost:8081/json/"]
    assert worker["healthcheck"]["test"] == ["CMD", "curl", "--fail", "http://localhost:8082/json/"]
    for name in SPARK_DRIVERS | {"spark-worker"}:
        assert services[name]["depends_on"]["spark-master"] == {"condition": "service_healthy"}, name


def test_the_load_s_spark_connect_server_is_a_service_the_workers_reach_through_their_connection() -> None:
    services = load_compose()["services"]
    server = services[SPARK_CONNECT]
    assert server["command"] == ["adpipe", "connect", "serve"]
    env = service_env(server)
    # Its address, Spark's own port on its service's name (where it binds,
    # and where its executors reach its driver).
    address = "sc://spark-connect:15002"
    assert env["ADPIPE_SPARK_CONNECT"] == address and env["ADPIPE_SPARK_DRIVER_HOST"] == SPARK_CONNECT
    assert service_settings(server).spark_connect == address
    # The metastore's database is made by airflow-init; the executors are the Spark cluster's.
    assert server["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "spark-master": {"condition": "service_healthy"},
        "airflow-init": {"condition": "service_completed_successfully"},
    }
    # The settings a load builds its session from: the other adpipe services' own, this driver's address apart.
    own = ("ADPIPE_SPARK_DRIVER_HOST", "ADPIPE_METRICS_HOST")
    stream = {k: v for k, v in service_env(services["stream"]).items() if k not in own}
    assert {k: v for k, v in env.items() if k != "ADPIPE_SPARK_DRIVER_HOST"} == stream
    # Every adpipe process outside Airflow names this server; every Airflow
    # component (the workers, whose load steps are its clients, included)
    # has it only as the Connection adpipe_spark_connect, never as a setting.
    for name, service in services.items():
        service_vars = service_env(service)
        if name in AIRFLOW_SERVICES | {"airflow-init"}:
            assert "ADPIPE_SPARK_CONNECT" not in service_vars, name
            connection = json.loads(service_vars["AIRFLOW_CONN_ADPIPE_SPARK_CONNECT"])
            assert connection == {"conn_type": "spark_connect", "host": SPARK_CONNECT, "port": 15002}, name
        elif "ADPIPE_HOME" in service_vars:
            assert service_vars["ADPIPE_SPARK_CONNECT"] == address, name
    for name in AIRFLOW_WORKERS:
        assert "AIRFLOW_CONN_ADPIPE_SPARK_CONNECT" in service_env(services[name]), name
    # Inside the stack only, as Redis and Spark.
    assert "ports" not in server
