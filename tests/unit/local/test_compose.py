"""docker-compose.yaml and the Dockerfile cannot run here (no Docker engine):
what can be checked without one is. The compose file is valid under the
Compose specification's JSON schema; every environment variable it sets is
one that reads it (adpipe's settings, Airflow's configuration and its
providers', Spark's launcher, the Kafka and PostgreSQL images); it keeps the
local broker's configuration, Airflow's shape, the roles of the tested
multi-host harness (tests/integration/test_airflow_hosts.py: the
CeleryExecutor on Redis, two workers each with its own ADPIPE_HOME, the
checkpoint and warehouse they share), the local Spark cluster's daemons and
the loopback-only ports; and the image installs the project with the
Makefile's own install steps."""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import re
import shlex
import sys
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import yaml
from adpipe.cli import build_parser
from adpipe.local import postgres, spark_cluster
from adpipe.local.airflow import admin_password_file, connections_env
from adpipe.local.kafka_broker import server_properties
from adpipe.settings import PROJECT_ROOT, load_settings
from adpipe.tools.produce import ProduceSpec, parse_start
from check_jsonschema.builtin_schemas import get_builtin_schema

from tests.unit.helpers import make_dry_run

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
ADPIPE_SERVICES = {"stream", "stream-standby", "budget", "producer"}
SPARK_SERVICES = {"spark-master", "spark-worker"}
# The services that run Spark drivers: the stream job's, and every task's on a worker.
SPARK_DRIVERS = {"stream", "stream-standby", *AIRFLOW_WORKERS}
# The checkpoint and warehouse every Spark driver and executor shares (HDFS or an object store in production).
SHARED_VOLUME, SHARED_MOUNT = "adpipe-shared", "/opt/adpipe-shared"
HARNESS = PROJECT_ROOT / "tests" / "integration" / "test_airflow_hosts.py"
# Run once and exit: Compose waits on their exit code, not on a health state.
ONE_SHOT = {"airflow-init", "producer"}


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _env(service: dict) -> dict[str, str]:
    return {k: str(v) for k, v in service.get("environment", {}).items()}


def _settings(service: dict):  # noqa: ANN202 - adpipe.settings.Settings
    return load_settings(_env(service))


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _dockerfile_args() -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in _dockerfile_instructions() if i == "ARG" and "=" in a)


def _dockerfile_env() -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in _dockerfile_instructions() if i == "ENV")


def _dockerfile_run_commands() -> list[str]:
    """Each shell command of the RUN instructions (split on ``&&``)."""
    return [c.strip() for i, a in _dockerfile_instructions() if i == "RUN" for c in a.split("&&")]


# -- the Compose specification -------------------------------------------------


def _schema_errors(document: dict) -> list[str]:
    schema = get_builtin_schema("vendor.compose-spec")
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_file_is_valid_under_the_compose_specification() -> None:
    assert _schema_errors(_compose()) == []


def test_the_schema_check_refuses_what_compose_refuses() -> None:
    broken = copy.deepcopy(_compose())
    broken["services"]["kafka"]["healthcheck"]["interval"] = 10  # a duration is a string: "10s"
    broken["services"]["stream"]["depends_on"]["kafka"]["condition"] = "service_up"
    broken["services"]["budget"]["restarts"] = "always"
    errors = _schema_errors(broken)
    assert any("10 is not of type 'string'" in e for e in errors), errors
    assert any(e.startswith("services/stream/depends_on") for e in errors), errors
    assert any("'restarts' was unexpected" in e or "restarts" in e for e in errors), errors


# -- every variable set is one that is read -------------------------------------


def _read_by_settings() -> set[str]:
    """The ADPIPE_* variables include/adpipe/settings.py reads: the name in
    ``env.get("ADPIPE_X", ...)`` or in a helper called as ``_int(env, "ADPIPE_X", ...)``."""
    tree = ast.parse((PROJECT_ROOT / "include" / "adpipe" / "settings.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(func.value, ast.Name):
            candidates = node.args[:1] if func.value.id == "env" else []
        elif node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "env":
            candidates = node.args[1:2]
        else:
            candidates = []
        names |= {c.value for c in candidates if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return {n for n in names if n.startswith("ADPIPE_")}


def test_settings_reads_are_found_in_the_source() -> None:
    read = _read_by_settings()
    # The reading of the source finds the variables the contract names, and
    # no name that is only mentioned in a message.
    assert {"ADPIPE_KAFKA_BOOTSTRAP", "ADPIPE_HOME", "ADPIPE_BUDGET_DB", "ADPIPE_SPARK_MASTER"} <= read
    assert {"ADPIPE_PG_PORT", "ADPIPE_LOAD_START", "ADPIPE_MAX_FUTURE_SKEW_S"} <= read
    assert "ADPIPE_TEST_HOME" not in read


def test_every_adpipe_variable_set_is_one_settings_reads() -> None:
    read = _read_by_settings()
    compose = _compose()
    set_where = {("Dockerfile ENV", name) for name in _dockerfile_env() if name.startswith("ADPIPE_")}
    for name, service in compose["services"].items():
        set_where |= {(name, var) for var in _env(service) if var.startswith("ADPIPE_")}
    assert set_where, "no ADPIPE_ variable found: the file's shape changed"
    unread = sorted((where, var) for where, var in set_where if var not in read)
    assert unread == [], f"set but never read by adpipe.settings: {unread}"
    for service in compose["services"].values():
        if any(v.startswith("ADPIPE_") for v in _env(service)):
            _settings(service)  # and each service's values load


def _airflow_package() -> Path:
    """Where Airflow is installed, found without importing it: importing
    would configure Airflow in this process."""
    spec = importlib.util.find_spec("airflow")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def _provider_configs() -> dict[str, dict]:
    """The configuration each installed provider adds to Airflow's (the
    ``config`` of its ``get_provider_info()``, as Airflow loads it), by
    provider, read from the provider's get_provider_info.py alone: importing
    the provider's package would import Airflow."""
    configs = {}
    for path in sorted((_airflow_package() / "providers").rglob("get_provider_info.py")):
        spec = importlib.util.spec_from_file_location(f"_provider_info_{len(configs)}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        info = module.get_provider_info()
        configs[info["package-name"]] = info.get("config", {})
    return configs


def _airflow_options() -> dict[str, set[str]]:
    """Every option of Airflow's configuration, by section, from the
    description Airflow builds its configuration from: core's config.yml,
    then the sections of the installed providers (the CeleryExecutor's
    [celery] is the celery provider's)."""
    description = yaml.safe_load((_airflow_package() / "config_templates" / "config.yml").read_text())
    options = {section: set(body.get("options", {})) for section, body in description.items()}
    for config in _provider_configs().values():
        for section, body in config.items():
            options.setdefault(section, set()).update(body.get("options", {}))
    return options


def _airflow_reads_variable(name: str) -> bool:
    """An AIRFLOW_* variable (not an option) that Airflow's configuration reads."""
    return f'os.environ.get("{name}")' in (_airflow_package() / "configuration.py").read_text()


def test_every_airflow_variable_set_is_an_airflow_option() -> None:
    options = _airflow_options()
    assert "executor" in options["core"] and "not_an_option" not in options["core"]
    # The celery provider's options count (it is what the CeleryExecutor reads), and only its own.
    celery = _provider_configs()["apache-airflow-providers-celery"]["celery"]["options"]
    assert {"broker_url", "result_backend", "worker_concurrency"} <= set(celery) == options["celery"]
    for name, service in _compose()["services"].items():
        for var in _env(service):
            if not var.startswith("AIRFLOW__"):
                continue
            section, _, key = var.removeprefix("AIRFLOW__").lower().partition("__")
            assert key in options.get(section, set()), f"{name}: {var} is no option of Airflow's configuration"


# What Airflow's components take from their Connections, never from their
# environment (adpipe.orchestration.connections.REPLACES).
CONNECTION_SETTINGS = (
    "ADPIPE_KAFKA_", "ADPIPE_PG_", "ADPIPE_BUDGET_DB", "ADPIPE_METASTORE_DATABASE", "ADPIPE_SPARK_MASTER"
)


def test_airflow_connections_are_built_from_the_other_services_settings() -> None:
    services = _compose()["services"]
    # The stream, budget and producer services run with the settings of
    # x-adpipe-env: Airflow's Connections are the ones `make airflow` builds from them.
    expected = {k: json.loads(v) for k, v in connections_env(_settings(services["stream"])).items()}
    assert set(expected) == {
        "AIRFLOW_CONN_ADPIPE_SPARK", "AIRFLOW_CONN_ADPIPE_KAFKA", "AIRFLOW_CONN_ADPIPE_METASTORE_DB",
        "AIRFLOW_CONN_ADPIPE_BUDGET_DB",
    }
    for name, service in services.items():
        env = _env(service)
        conns = {k: json.loads(v) for k, v in env.items() if k.startswith("AIRFLOW_CONN_")}
        if name in AIRFLOW_SERVICES | {"airflow-init"}:
            assert conns == expected, name
        else:
            assert conns == {}, name


def test_airflow_components_have_no_address_or_credential_but_their_connections() -> None:
    services = _compose()["services"]
    for name in AIRFLOW_SERVICES:
        env = _env(services[name])
        assert not [v for v in env if v.startswith(CONNECTION_SETTINGS)], name
        assert {"ADPIPE_HOME", "ADPIPE_LOAD_START"} <= set(env), name
    # The public default password "adpipe" is not masked (it would mask every
    # "adpipe" in a log line), as `make airflow` sets it; longer secrets are.
    from adpipe.local.airflow import airflow_env

    made = airflow_env(_settings(services["stream"]), "sqlite://", base={})
    assert _env(services["airflow-scheduler"])["AIRFLOW__LOGGING__MIN_LENGTH_MASKED_SECRET"] == (
        made["AIRFLOW__LOGGING__MIN_LENGTH_MASKED_SECRET"]) == "7"
    assert "AIRFLOW__LOGGING__MIN_LENGTH_MASKED_SECRET" not in airflow_env(
        load_settings({"ADPIPE_PG_PASSWORD": "a-long-generated-one"}), "sqlite://", base={})
    # airflow-init alone has the PostgreSQL server's address, for `adpipe pg up`.
    init = _env(services["airflow-init"])
    assert [v for v in init if v.startswith(CONNECTION_SETTINGS)] == ["ADPIPE_PG_HOST", "ADPIPE_PG_PORT"]


def test_airflow_init_makes_the_pool_the_dags_use() -> None:
    from adpipe.local.airflow import TABLES_POOL_DESCRIPTION, TABLES_POOL_SLOTS
    from adpipe.settings import TABLES_POOL

    script = _compose()["services"]["airflow-init"]["command"][-1]
    lines = [shlex.split(line) for line in script.splitlines() if line.strip().startswith("airflow ")]
    assert ["airflow", "db", "migrate"] in lines
    pools = [line for line in lines if line[1:3] == ["pools", "set"]]
    assert pools == [["airflow", "pools", "set", TABLES_POOL, str(TABLES_POOL_SLOTS), TABLES_POOL_DESCRIPTION]]
    assert lines.index(pools[0]) > lines.index(["airflow", "db", "migrate"])


def _spark_reads_variable(name: str) -> bool:
    """A variable Spark's daemons read: named in pyspark's spark-class or the
    environment script it loads, or in the launcher's command builder (which
    reads SPARK_MASTER_OPTS, SPARK_DAEMON_MEMORY, ...)."""
    spark = spark_cluster.spark_home()
    scripts = "".join((spark / "bin" / script).read_text() for script in ("spark-class", "load-spark-env.sh"))
    [launcher] = (spark / "jars").glob("spark-launcher_*.jar")
    with zipfile.ZipFile(launcher) as jar:
        classes = b"".join(jar.read(n) for n in jar.namelist() if n.endswith(".class"))
    return name in scripts or name.encode() in classes


def test_every_variable_of_every_service_has_a_reader() -> None:
    """What is neither adpipe's nor Airflow's belongs to the image that reads it."""
    assert _spark_reads_variable("SPARK_WORKER_OPTS") and not _spark_reads_variable("SPARK_NOT_A_VARIABLE")
    image_variables = {
        "kafka": lambda v: v.startswith("KAFKA_"),  # the apache/kafka image: KAFKA_X_Y -> x.y
        "postgres": lambda v: v in {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"},
        "spark-master": _spark_reads_variable,
        "spark-worker": _spark_reads_variable,
        # dumb-init, the entrypoint of Airflow's image, as Airflow's compose file sets it for its workers.
        **{worker: lambda v: v == "DUMB_INIT_SETSID" for worker in AIRFLOW_WORKERS},
    }
    for name, service in _compose()["services"].items():
        for var in _env(service):
            known = (
                var.startswith(("ADPIPE_", "AIRFLOW__", "AIRFLOW_CONN_"))
                or (var.startswith("AIRFLOW_") and _airflow_reads_variable(var))
                or image_variables.get(name, lambda _v: False)(var)
            )
            assert known, f"{name}: nothing reads {var}"


# -- Kafka -------------------------------------------------------------------------


def _listeners(value: str) -> dict[str, tuple[str, int]]:
    found = {}
    for entry in value.split(","):
        name, address = entry.split("://", 1)
        host, port = address.rsplit(":", 1)
        found[name] = (host, int(port))
    return found


def test_compose_broker_matches_local_broker_settings() -> None:
    local = dict(
        line.split("=", 1)
        for line in server_properties(load_settings({"ADPIPE_HOME": "/tmp/x"})).splitlines()
        if line and not line.startswith("#")
    )
    env = _compose()["services"]["kafka"]["environment"]
    from_compose = {k.removeprefix("KAFKA_").lower().replace("_", "."): str(v) for k, v in env.items()}
    for key, value in local.items():
        if key in HOST_SPECIFIC:
            assert key in from_compose, key
        else:
            assert from_compose.get(key) == value, f"{key}: compose {from_compose.get(key)!r} != local {value!r}"


def test_kafka_is_advertised_to_the_containers_and_to_the_host() -> None:
    compose = _compose()
    kafka = compose["services"]["kafka"]
    env = kafka["environment"]
    listeners = _listeners(env["KAFKA_LISTENERS"])
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(protocols) == set(listeners) and set(protocols.values()) == {"PLAINTEXT"}
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "INTERNAL"
    assert set(advertised) == {"INTERNAL", "HOST"}
    # The containers: the service's name and the INTERNAL port, as every adpipe service's bootstrap.
    internal = f"{kafka['hostname']}:{listeners['INTERNAL'][1]}"
    assert advertised["INTERNAL"] == (kafka["hostname"], listeners["INTERNAL"][1])
    for name, service in compose["services"].items():
        if "ADPIPE_KAFKA_BOOTSTRAP" in _env(service):
            assert _settings(service).kafka_bootstrap == internal, name
    # The host: the HOST listener's port published on the loopback, and
    # advertised as that published address, which is the host's default bootstrap.
    host_ip, host_port, container_port = kafka["ports"][0].split(":")
    assert int(container_port) == listeners["HOST"][1]
    assert advertised["HOST"] == (host_ip, int(host_port)) == ("127.0.0.1", 9092)
    assert load_settings({}).kafka_bootstrap == f"{host_ip}:{host_port}"


# -- ports, PostgreSQL, Airflow's shape ----------------------------------------------


def test_compose_publishes_ports_on_the_hosts_loopback_only() -> None:
    compose = _compose()
    published = {name: [str(p) for p in s.get("ports", [])] for name, s in compose["services"].items()}
    for name, ports in published.items():
        for entry in ports:
            # HOST_IP:HOST_PORT:CONTAINER_PORT; "9092:9092" would listen on every interface.
            assert entry.count(":") == 2 and entry.startswith("127.0.0.1:"), f"{name} publishes {entry!r}"
    defaults = load_settings({})
    # The host's own defaults reach the stack: PostgreSQL, and the UI where `make airflow` has it.
    assert published["postgres"] == [f"127.0.0.1:{defaults.pg_port}:5432"]
    assert published["airflow-apiserver"] == [f"127.0.0.1:{defaults.airflow_port}:8080"]
    assert published["stream"] == [f"127.0.0.1:{defaults.stream_metrics_port}:{defaults.stream_metrics_port}"]
    assert published["budget"] == [f"127.0.0.1:{defaults.budget_metrics_port}:{defaults.budget_metrics_port}"]
    assert {name for name, ports in published.items() if ports} == {
        "kafka", "postgres", "airflow-apiserver", "stream", "budget"
    }


def test_postgres_service_is_the_one_the_settings_name() -> None:
    compose = _compose()
    pg_env = compose["services"]["postgres"]["environment"]
    airflow_env = _env(compose["services"]["airflow-scheduler"])
    metadata = urlsplit(airflow_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    budget_db = urlsplit(_settings(compose["services"]["budget"]).budget_db)
    for name, service in compose["services"].items():
        if "ADPIPE_PG_HOST" not in _env(service):
            continue
        s = _settings(service)
        assert (s.pg_host, s.pg_port) == ("postgres", 5432), name
        assert (s.pg_user, s.pg_password) == (pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"]), name
    for url in (metadata, budget_db):
        assert (url.hostname, url.port) == ("postgres", 5432)
        assert (url.username, url.password) == (pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"])
        # airflow-init's `adpipe pg up` creates it.
        assert url.path.lstrip("/") in postgres.DATABASES


def test_airflow_services_in_airflows_shape() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {
        "redis", "kafka", "postgres", "airflow-init", *AIRFLOW_SERVICES, *SPARK_SERVICES, *ADPIPE_SERVICES
    }
    image = services["airflow-init"]["image"]
    ours = {n for n in services if n.startswith("airflow-")} | ADPIPE_SERVICES | SPARK_SERVICES
    assert {services[n]["image"] for n in ours} == {image}
    assert all(services[n]["build"] == "." for n in ours)
    commands = {n: services[n]["command"] for n in AIRFLOW_SERVICES}
    assert commands == {
        "airflow-apiserver": "api-server",
        "airflow-scheduler": "scheduler",
        "airflow-dag-processor": "dag-processor",
        "airflow-triggerer": "triggerer",
        "airflow-worker-1": "celery worker",
        "airflow-worker-2": "celery worker",
    }
    init_only = {"ADPIPE_PG_HOST", "ADPIPE_PG_PORT"}  # `adpipe pg up`'s
    common = {k: v for k, v in _env(services["airflow-init"]).items() if k not in init_only}
    for name in AIRFLOW_SERVICES:
        depends = services[name]["depends_on"]
        assert depends["airflow-init"] == {"condition": "service_completed_successfully"}, name
        assert depends["postgres"] == depends["kafka"] == depends["redis"] == {"condition": "service_healthy"}, name
        assert services[name]["restart"] == "always", name
        env = _env(services[name])
        # Every Airflow component is configured alike; a worker adds only its
        # own address (its Spark drivers') and Airflow's worker entrypoint setting.
        own = {"ADPIPE_SPARK_DRIVER_HOST": services[name].get("hostname"), "DUMB_INIT_SETSID": "0"}
        assert env == (common | own if name in AIRFLOW_WORKERS else common), name
        # Config (with the generated secrets), logs and the shared checkpoint
        # and warehouse are mounted alike; the home is the control plane's on
        # its components, each worker's own on a worker.
        mounts = dict(reversed(volume.split(":")[:2]) for volume in services[name]["volumes"])
        init_mounts = dict(reversed(volume.split(":")[:2]) for volume in services["airflow-init"]["volumes"])
        home = str(_settings(services[name]).home)
        assert mounts.keys() == init_mounts.keys() and home in mounts, name
        assert {k: v for k, v in mounts.items() if k != home} == {k: v for k, v in init_mounts.items() if k != home}
        assert (mounts[home] != init_mounts[home]) == (name in AIRFLOW_WORKERS), name
    env = _env(services["airflow-scheduler"])
    # The scheduler's health server answers only when enabled; tasks reach the API server by its service name.
    assert env["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"] == "true"
    assert "http://localhost:8974/health" in services["airflow-scheduler"]["healthcheck"]["test"]
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
    assert services["airflow-apiserver"]["ports"][0].endswith(":8080")
    # One airflow.cfg, written by airflow-init with the secrets Airflow
    # generates (the JWT secret, the API secret key), on a volume every
    # component mounts, the workers included: their task tokens validate.
    for name in AIRFLOW_SERVICES | {"airflow-init"}:
        mounted = {volume.split(":")[1]: volume.split(":")[0] for volume in services[name]["volumes"]}
        assert mounted.get(Path(env["AIRFLOW_CONFIG"]).parent.as_posix()) == "airflow-config", name
        assert _env(services[name])["AIRFLOW_CONFIG"] == env["AIRFLOW_CONFIG"], name
    # Not set apart on any component: one that set its own would refuse the others' tokens.
    secrets = ("AIRFLOW__API_AUTH__JWT", "AIRFLOW__API__SECRET_KEY")
    assert not [(n, v) for n in AIRFLOW_SERVICES for v in _env(services[n]) if v.startswith(secrets)]
    # airflow-init makes the UI's password file where the API server reads it.
    password_file = admin_password_file(_settings(services["airflow-scheduler"]))
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == str(password_file)
    init_script = services["airflow-init"]["command"][-1]
    assert "adpipe pg up" in init_script and "ensure_admin_password" in init_script
    assert "airflow db migrate" in init_script


# -- the roles of the multi-host harness -------------------------------------------------


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
    services = _compose()["services"]
    harness = _harness_airflow_options()
    assert HARNESS_DIFFERS <= set(harness), "the harness's options changed: see HARNESS_DIFFERS"
    for name in AIRFLOW_SERVICES | {"airflow-init"}:
        env = _env(services[name])
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
    compose = _compose()
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
        assert _env(worker)["DUMB_INIT_SETSID"] == "0"
        assert worker["depends_on"]["spark-master"] == {"condition": "service_healthy"}
        # Its home: a volume of its own, neither the control plane's nor the other worker's.
        settings = _settings(worker)
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
    services = _compose()["services"]
    stream = _settings(services["stream"])
    assert stream.checkpoint_base_uri == f"file://{SHARED_MOUNT}/checkpoints"
    assert stream.warehouse_base_uri == f"file://{SHARED_MOUNT}/warehouse"
    for name, service in services.items():
        if not any(v.startswith("ADPIPE_") for v in _env(service)):
            continue
        settings = _settings(service)
        # Every adpipe process, Airflow's too, names the same ones, on the shared volume it mounts.
        assert (settings.checkpoint_uri, settings.warehouse_uri) == (stream.checkpoint_uri, stream.warehouse_uri), name
        assert f"{SHARED_VOLUME}:{SHARED_MOUNT}" in service["volumes"], name
    assert f"{SHARED_VOLUME}:{SHARED_MOUNT}" in services["spark-worker"]["volumes"]
    # Each driver has an address of its own its executors reach: its service's name or its alias.
    drivers = {n: _settings(s).spark_driver_host for n, s in services.items() if "ADPIPE_SPARK_DRIVER_HOST" in _env(s)}
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
    services = _compose()["services"]
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
    assert _settings(services["stream"]).spark_master == url
    assert json.loads(_env(services["airflow-worker-1"])["AIRFLOW_CONN_ADPIPE_SPARK"])["host"] == url
    for name, service in services.items():
        if "ADPIPE_SPARK_MASTER" in _env(service):
            assert _settings(service).spark_master == url, name
    assert worker["command"][:3] == ["spark-class", spark_cluster.WORKER_CLASS, url]
    worker_options = _options(worker["command"][3:])
    assert worker_options["--host"] == "spark-worker" and worker_options["--webui-port"] == "8082"
    # The local cluster's daemons' heap and properties.
    for service, variable, properties in ((master, "SPARK_MASTER_OPTS", spark_cluster.MASTER_PROPERTIES),
                                          (worker, "SPARK_WORKER_OPTS", spark_cluster.WORKER_PROPERTIES)):
        env = _env(service)
        assert env == {"SPARK_DAEMON_MEMORY": spark_cluster.DAEMON_MEMORY, variable: env[variable]}
        assert _java_properties(env[variable]) == properties
    # A core and an executor's heap for every application that may run at
    # once (the stream job, its standby, each worker's warm load driver),
    # each capped: one would take every core, and the next wait for one.
    drivers = [_settings(services[n]) for n in SPARK_DRIVERS]
    assert all(d.spark_cores_max >= 1 for d in drivers)
    assert int(worker_options["--cores"]) >= sum(d.spark_cores_max for d in drivers)
    assert _megabytes(worker_options["--memory"]) >= sum(_megabytes(d.spark_executor_memory) for d in drivers)
    # Health: each daemon's web UI; the drivers and the worker start once the master answers.
    assert master["healthcheck"]["test"] == ["CMD", "curl", "--fail", "http://localhost:8081/json/"]
    assert worker["healthcheck"]["test"] == ["CMD", "curl", "--fail", "http://localhost:8082/json/"]
    for name in SPARK_DRIVERS | {"spark-worker"}:
        assert services[name]["depends_on"]["spark-master"] == {"condition": "service_healthy"}, name


def test_the_image_makes_every_volume_the_project_image_mounts_its_users() -> None:
    """Docker makes a named volume from the image's folder: one it lacks
    would be root's, and the airflow user could not write to it."""
    compose = _compose()
    image = compose["services"]["airflow-init"]["image"]
    [chown] = [c for c in _dockerfile_run_commands() if c.startswith("chown airflow:0 ")]
    owned = set(chown.split()[2:])
    mounted = {
        volume.split(":")[1]
        for service in compose["services"].values()
        if service.get("image") == image
        for volume in service.get("volumes", [])
        if volume.split(":")[0] in compose["volumes"]
    }
    assert SHARED_MOUNT in mounted and mounted <= owned, mounted - owned


def test_every_long_running_service_has_a_healthcheck() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        if name in ONE_SHOT:
            assert "healthcheck" not in service and service.get("restart", "no") == "no", name
        else:
            test = service["healthcheck"]["test"]
            assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
            assert service["restart"] in ("always", "unless-stopped"), name
    for name in ("stream", "budget"):
        assert services[name]["healthcheck"]["test"][1:] == ["python", "-m", "adpipe.tools.container_health", name]
    # Whatever waits on a service waits for its health, or for a one-shot's success.
    for name, service in services.items():
        for target, condition in service.get("depends_on", {}).items():
            expected = "service_completed_successfully" if target in ONE_SHOT else "service_healthy"
            assert condition == {"condition": expected}, f"{name} -> {target}"


def test_adpipe_services_run_adpipe_commands() -> None:
    services = _compose()["services"]
    parser = build_parser()
    for name in ADPIPE_SERVICES:
        command = services[name]["command"]
        assert command[0] == "adpipe", name
        parser.parse_args(command[1:])  # exits (fails the test) on an unknown option
    assert services["stream"]["command"] == ["adpipe", "stream"]
    # The standby: the same job (the same environment), opt-in, after the active driver is up.
    standby = services["stream-standby"]
    assert standby["command"] == ["adpipe", "stream", "--standby"] and standby["profiles"] == ["standby"]
    stream_env = {k: v for k, v in _env(services["stream"]).items() if k != "ADPIPE_METRICS_HOST"}
    assert _env(standby) == {**stream_env, "ADPIPE_SPARK_DRIVER_HOST": "stream-standby"}
    assert standby["depends_on"]["stream"] == {"condition": "service_healthy"}
    assert services["budget"]["command"] == ["adpipe", "budget"]
    # The producer's hour is the one the load DAG starts from.
    produce = parser.parse_args(services["producer"]["command"][1:])
    start = parse_start(produce.start) if getattr(produce, "start", None) else ProduceSpec.start
    assert _settings(services["producer"]).load_start == start.replace(minute=0, second=0, microsecond=0)
    assert produce.minutes <= 60 and produce.rate > 0


# -- the image ------------------------------------------------------------------------


def test_the_image_is_airflows_with_the_pinned_airflow_and_python() -> None:
    args = _dockerfile_args()
    pins = dict(
        line.split("==", 1) for line in (PROJECT_ROOT / "requirements.txt").read_text().splitlines() if "==" in line
    )
    assert args["AIRFLOW_VERSION"] == pins["apache-airflow"]
    froms = [a for i, a in _dockerfile_instructions() if i == "FROM"]
    assert froms == ["apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}"]
    assert args["AIRFLOW_CONSTRAINTS"] == (
        "https://raw.githubusercontent.com/apache/airflow/constraints-${AIRFLOW_VERSION}/constraints-${PYTHON_VERSION}.txt"
    )
    assert re.fullmatch(r"3\.1[1-9]", args["PYTHON_VERSION"])


def test_the_dockerfile_installs_with_the_makefiles_steps() -> None:
    runs = _dockerfile_run_commands()
    # No install of its own: Python packages only through the Makefile's target.
    assert not [c for c in runs if re.search(r"\bpip3? install\b", c)], runs
    [make_run] = [c for c in runs if c.startswith("make python-packages ")]
    words = shlex.split(make_run)
    assert words[1] == "python-packages" and "AIRFLOW_CONSTRAINTS=${AIRFLOW_CONSTRAINTS}" in words
    docker_args = [w.replace("${AIRFLOW_CONSTRAINTS}", "https://example.invalid/constraints.txt") for w in words[2:]]
    in_image = make_dry_run("python-packages", *docker_args)
    # The venv's recipe calls the same target (a sub-make, which -n still runs, printing its commands).
    in_venv = make_dry_run("-W", "requirements.txt", ".venv/.installed")
    assert any("python-packages" in line for line in in_venv)

    def steps(lines: list[str], values: dict[str, str]) -> list[list[str]]:
        """The install commands, their words with each environment's own values named."""
        picked = (line for line in lines if "adpipe.tools.constraints" in line or " install " in line)
        return [[values.get(word, word) for word in shlex.split(line)] for line in picked]

    image_steps = steps(in_image, {"pip": "PIP", "python": "PYTHON", "https://example.invalid/constraints.txt": "C"})
    venv_steps = steps(in_venv, {".venv/bin/pip": "PIP", ".venv/bin/python": "PYTHON", "": "C"})
    assert len(image_steps) == 3, in_image
    assert image_steps == venv_steps
    # The JVM jars: the Makefile's jars target, with the image's adpipe.
    jars = [line for line in make_dry_run("-W", "requirements.txt", "jars") if line.endswith(" jars")]
    assert [j.replace(".venv/bin/", "") for j in jars] == ["adpipe jars"]
    assert "adpipe jars" in runs
    # The Data Docs' assets: the Makefile's target, which make venv runs too.
    assert [c for c in runs if c.startswith("make ") and c not in (make_run,)] == ["make data-docs-assets"]
    assert re.search(r"^venv:.*\bdata-docs-assets\b", MAKEFILE.read_text(), re.MULTILINE)


def test_the_image_has_the_makefiles_jvm_packages() -> None:
    makefile = MAKEFILE.read_text()
    jvm = re.search(r"^JVM_DEBIAN_PACKAGES\s*:=\s*(.+)$", makefile, re.MULTILINE)
    assert jvm and "$(JVM_DEBIAN_PACKAGES)" in makefile
    [apt] = [c for c in _dockerfile_run_commands() if c.startswith("apt-get install")]
    assert set(jvm.group(1).split()) <= set(apt.split()), apt


def test_dockerignore_keeps_everything_gitignore_lists_out_of_the_context() -> None:
    def patterns(path: Path) -> set[str]:
        lines = (line.strip() for line in path.read_text().splitlines())
        return {line.rstrip("/") for line in lines if line and not line.startswith("#")}

    ignored = patterns(PROJECT_ROOT / ".dockerignore")
    assert {".git", ".venv", ".cache"} <= ignored
    for pattern in patterns(PROJECT_ROOT / ".gitignore"):
        # .gitignore matches a bare name at any depth; .dockerignore from the context's root.
        assert pattern in ignored or f"**/{pattern}" in ignored, pattern
    # What the image copies is not ignored.
    copied = {w for i, a in _dockerfile_instructions() if i == "COPY" for w in a.split()[:-1] if w[:2] != "--"}
    assert {"requirements.txt", "include", "dags", "jobs"} <= copied and not copied & ignored


def test_dockerfile_env_is_the_composes() -> None:
    compose_env = _env(_compose()["services"]["stream"])
    assert _dockerfile_env() == {"ADPIPE_HOME": compose_env["ADPIPE_HOME"]}
