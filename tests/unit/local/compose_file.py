"""What the compose file's tests share: the file, the Dockerfile and the
Makefile, the services by role, and a service's environment and settings."""

from __future__ import annotations

import yaml
from adpipe.settings import PROJECT_ROOT, load_settings

COMPOSE = PROJECT_ROOT / "docker-compose.yaml"
DOCKERFILE = PROJECT_ROOT / "Dockerfile"
MAKEFILE = PROJECT_ROOT / "Makefile"

# Properties whose value depends on the host (addresses, paths, the names of
# the two listeners) differ on purpose; the listeners are checked below.
HOST_SPECIFIC = {
    "listeners",
    "advertised.listeners",
    "controller.quorum.voters",
    "log.dirs",
    "inter.broker.listener.name",
    "listener.security.protocol.map",
}
# Airflow's control plane (no task runs there) and its Celery workers (every task runs on one).
AIRFLOW_COMPONENTS = {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"}
AIRFLOW_WORKERS = {"airflow-worker-1", "airflow-worker-2"}
AIRFLOW_SERVICES = AIRFLOW_COMPONENTS | AIRFLOW_WORKERS
# The load's Spark Connect server (adpipe connect serve): the load's steps run there.
SPARK_CONNECT = "spark-connect"
ADPIPE_SERVICES = {"stream", "stream-standby", "budget", "producer", SPARK_CONNECT}
SPARK_SERVICES = {"spark-master", "spark-worker"}
# The services that run Spark drivers: the stream job's, the Spark Connect
# server's, and every task's on a worker.
SPARK_DRIVERS = {"stream", "stream-standby", SPARK_CONNECT, *AIRFLOW_WORKERS}
# The checkpoint and warehouse every Spark driver and executor shares (HDFS or an object store in production).
SHARED_VOLUME, SHARED_MOUNT = "adpipe-shared", "/opt/adpipe-shared"
HARNESS = PROJECT_ROOT / "tests" / "integration" / "test_airflow_hosts.py"
# Run once and exit: Compose waits on their exit code, not on a health state.
ONE_SHOT = {"airflow-init", "producer"}


def load_compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def service_env(service: dict) -> dict[str, str]:
    return {k: str(v) for k, v in service.get("environment", {}).items()}


def service_settings(service: dict):  # noqa: ANN202 - adpipe.settings.Settings
    return load_settings(service_env(service))
