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
from tests.unit.local.compose_file import (
    ADPIPE_SERVICES,
    AIRFLOW_SERVICES,
    AIRFLOW_WORKERS,
    DOCKERFILE,
    HOST_SPECIFIC,
    MAKEFILE,
    ONE_SHOT,
    SHARED_MOUNT,
    SPARK_CONNECT,
    SPARK_SERVICES,
    load_compose,
    service_env,
    service_settings,
)


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
    assert _schema_errors(load_compose()) == []


def test_the_schema_check_refuses_what_compose_refuses() -> None:
    broken = copy.deepcopy(load_compose())
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
    compose = load_compose()
    set_where = {("Dockerfile ENV", name) for name in _dockerfile_env() if name.startswith("ADPIPE_")}
    for name, service in compose["services"].items():
        set_where |= {(name, var) for var in service_env(service) if var.startswith("ADPIPE_")}
    assert set_where, "no ADPIPE_ variable found: the file's shape changed"
    unread = sorted((where, var) for where, var in set_where if var not in read)
    assert unread == [], f"set but never read by adpipe.settings: {unread}"
    for service in compose["services"].values():
        if any(v.startswith("ADPIPE_") for v in service_env(service)):
            service_settings(service)  # and each service's values load


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
    for name, service in load_compose()["services"].items():
        for var in service_env(service):
            if not var.startswith("AIRFLOW__"):
                continue
            section, _, key = var.removeprefix("AIRFLOW__").lower().partition("__")
            assert key in options.get(section, set()), f"{name}: {var} is no option of Airflow's configuration"


# What Airflow's components take from their Connections, never from their
# environment (adpipe.orchestration.connections.REPLACES).
CONNECTION_SETTINGS = (
    "ADPIPE_KAFKA_", "ADPIPE_PG_", "ADPIPE_BUDGET_DB", "ADPIPE_METASTORE_DATABASE", "ADPIPE_SPARK_MASTER",
    "ADPIPE_SPARK_CONNECT",
)


def test_airflow_connections_are_built_from_the_other_services_settings() -> None:
    services = load_compose()["services"]
    # The stream, budget and producer services run with the settings of
    # x-adpipe-env: Airflow's Connections are the ones `make airflow` builds from them.
    expected = {k: json.loads(v) for k, v in connections_env(service_settings(services["stream"])).items()}
    assert set(expected) == {
        "AIRFLOW_CONN_ADPIPE_SPARK", "AIRFLOW_CONN_ADPIPE_KAFKA", "AIRFLOW_CONN_ADPIPE_METASTORE_DB",
        "AIRFLOW_CONN_ADPIPE_BUDGET_DB", "AIRFLOW_CONN_ADPIPE_SPARK_CONNECT",
    }
    for name, service in services.items():
        env = service_env(service)
        conns = {k: json.loads(v) for k, v in env.items() if k.startswith("AIRFLOW_CONN_")}
        if name in AIRFLOW_SERVICES | {"airflow-init"}:
            assert conns == expected, name
        else:
            assert conns == {}, name


def test_airflow_components_have_no_address_or_credential_but_their_connections() -> None:
    services = load_compose()["services"]
    for name in AIRFLOW_SERVICES:
        env = service_env(services[name])
        assert not [v for v in env if v.startswith(CONNECTION_SETTINGS)], name
        assert {"ADPIPE_HOME", "ADPIPE_LOAD_START"} <= set(env), name
    # The public default password "adpipe" is not masked (it would mask every
    # "adpipe" in a log line), as `make airflow` sets it; longer secrets are.
    from adpipe.local.airflow import airflow_env

    made = airflow_env(service_settings(services["stream"]), "sqlite://", base={})
    assert service_env(services["airflow-scheduler"])["AIRFLOW__LOGGING__MIN_LENGTH_MASKED_SECRET"] == (
        made["AIRFLOW__LOGGING__MIN_LENGTH_MASKED_SECRET"]) == "7"
    assert "AIRFLOW__LOGGING__MIN_LENGTH_MASKED_SECRET" not in airflow_env(
        load_settings({"ADPIPE_PG_PASSWORD": "a-long-generated-one"}), "sqlite://", base={})
    # airflow-init alone has the PostgreSQL server's address, for `adpipe pg up`.
    init = service_env(services["airflow-init"])
    assert [v for v in init if v.startswith(CONNECTION_SETTINGS)] == ["ADPIPE_PG_HOST", "ADPIPE_PG_PORT"]


def test_airflow_init_makes_the_pool_the_dags_use() -> None:
    from adpipe.local.airflow import TABLES_POOL_DESCRIPTION, TABLES_POOL_SLOTS
    from adpipe.settings import TABLES_POOL

    script = load_compose()["services"]["airflow-init"]["command"][-1]
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
    for name, service in load_compose()["services"].items():
        for var in service_env(service):
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
    env = load_compose()["services"]["kafka"]["environment"]
    from_compose = {k.removeprefix("KAFKA_").lower().replace("_", "."): str(v) for k, v in env.items()}
    for key, value in local.items():
        if key in HOST_SPECIFIC:
            assert key in from_compose, key
        else:
            assert from_compose.get(key) == value, f"{key}: compose {from_compose.get(key)!r} != local {value!r}"


def test_kafka_is_advertised_to_the_containers_and_to_the_host() -> None:
    compose = load_compose()
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
        if "ADPIPE_KAFKA_BOOTSTRAP" in service_env(service):
            assert service_settings(service).kafka_bootstrap == internal, name
    # The host: the HOST listener's port published on the loopback, and
    # advertised as that published address, which is the host's default bootstrap.
    host_ip, host_port, container_port = kafka["ports"][0].split(":")
    assert int(container_port) == listeners["HOST"][1]
    assert advertised["HOST"] == (host_ip, int(host_port)) == ("127.0.0.1", 9092)
    assert load_settings({}).kafka_bootstrap == f"{host_ip}:{host_port}"


# -- ports, PostgreSQL, Airflow's shape ----------------------------------------------


def test_compose_publishes_ports_on_the_hosts_loopback_only() -> None:
    compose = load_compose()
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
    compose = load_compose()
    pg_env = compose["services"]["postgres"]["environment"]
    airflow_env = service_env(compose["services"]["airflow-scheduler"])
    metadata = urlsplit(airflow_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    budget_db = urlsplit(service_settings(compose["services"]["budget"]).budget_db)
    for name, service in compose["services"].items():
        if "ADPIPE_PG_HOST" not in service_env(service):
            continue
        s = service_settings(service)
        assert (s.pg_host, s.pg_port) == ("postgres", 5432), name
        assert (s.pg_user, s.pg_password) == (pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"]), name
    for url in (metadata, budget_db):
        assert (url.hostname, url.port) == ("postgres", 5432)
        assert (url.username, url.password) == (pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"])
        # airflow-init's `adpipe pg up` creates it.
        assert url.path.lstrip("/") in postgres.DATABASES


def test_airflow_services_in_airflows_shape() -> None:
    compose = load_compose()
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
    common = {k: v for k, v in service_env(services["airflow-init"]).items() if k not in init_only}
    for name in AIRFLOW_SERVICES:
        depends = services[name]["depends_on"]
        assert depends["airflow-init"] == {"condition": "service_completed_successfully"}, name
        assert depends["postgres"] == depends["kafka"] == depends["redis"] == {"condition": "service_healthy"}, name
        assert services[name]["restart"] == "always", name
        env = service_env(services[name])
        # Every Airflow component is configured alike; a worker adds only its
        # own address (its Spark drivers') and Airflow's worker entrypoint setting.
        own = {"ADPIPE_SPARK_DRIVER_HOST": services[name].get("hostname"), "DUMB_INIT_SETSID": "0"}
        assert env == (common | own if name in AIRFLOW_WORKERS else common), name
        # Config (with the generated secrets), logs and the shared checkpoint
        # and warehouse are mounted alike; the home is the control plane's on
        # its components, each worker's own on a worker.
        mounts = dict(reversed(volume.split(":")[:2]) for volume in services[name]["volumes"])
        init_mounts = dict(reversed(volume.split(":")[:2]) for volume in services["airflow-init"]["volumes"])
        home = str(service_settings(services[name]).home)
        assert mounts.keys() == init_mounts.keys() and home in mounts, name
        assert {k: v for k, v in mounts.items() if k != home} == {k: v for k, v in init_mounts.items() if k != home}
        assert (mounts[home] != init_mounts[home]) == (name in AIRFLOW_WORKERS), name
    env = service_env(services["airflow-scheduler"])
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
        assert service_env(services[name])["AIRFLOW_CONFIG"] == env["AIRFLOW_CONFIG"], name
    # Not set apart on any component: one that set its own would refuse the others' tokens.
    secrets = ("AIRFLOW__API_AUTH__JWT", "AIRFLOW__API__SECRET_KEY")
    assert not [(n, v) for n in AIRFLOW_SERVICES for v in service_env(services[n]) if v.startswith(secrets)]
    # airflow-init makes the UI's password file where the API server reads it.
    password_file = admin_password_file(service_settings(services["airflow-scheduler"]))
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == str(password_file)
    init_script = services["airflow-init"]["command"][-1]
    assert "adpipe pg up" in init_script and "ensure_admin_password" in init_script
    assert "airflow db migrate" in init_script


# -- the roles of the multi-host harness -------------------------------------------------


def test_the_image_makes_every_volume_the_project_image_mounts_its_users() -> None:
    """Docker makes a named volume from the image's folder: one it lacks
    would be root's, and the airflow user could not write to it."""
    compose = load_compose()
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
    services = load_compose()["services"]
    for name, service in services.items():
        if name in ONE_SHOT:
            assert "healthcheck" not in service and service.get("restart", "no") == "no", name
        else:
            test = service["healthcheck"]["test"]
            assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
            assert service["restart"] in ("always", "unless-stopped"), name
    for name in ("stream", "budget"):
        assert services[name]["healthcheck"]["test"][1:] == ["python", "-m", "adpipe.tools.container_health", name]
    # The Spark Connect server: healthy once a server answers at its settings' address (its own).
    assert services[SPARK_CONNECT]["healthcheck"]["test"] == ["CMD", "adpipe", "connect", "status"]
    # Whatever waits on a service waits for its health, or for a one-shot's success.
    for name, service in services.items():
        for target, condition in service.get("depends_on", {}).items():
            expected = "service_completed_successfully" if target in ONE_SHOT else "service_healthy"
            assert condition == {"condition": expected}, f"{name} -> {target}"


def test_adpipe_services_run_adpipe_commands() -> None:
    services = load_compose()["services"]
    parser = build_parser()
    for name in ADPIPE_SERVICES:
        command = services[name]["command"]
        assert command[0] == "adpipe", name
        parser.parse_args(command[1:])  # exits (fails the test) on an unknown option
    assert services["stream"]["command"] == ["adpipe", "stream"]
    # The standby: the same job (the same environment), opt-in, after the active driver is up.
    standby = services["stream-standby"]
    assert standby["command"] == ["adpipe", "stream", "--standby"] and standby["profiles"] == ["standby"]
    stream_env = {k: v for k, v in service_env(services["stream"]).items() if k != "ADPIPE_METRICS_HOST"}
    assert service_env(standby) == {**stream_env, "ADPIPE_SPARK_DRIVER_HOST": "stream-standby"}
    assert standby["depends_on"]["stream"] == {"condition": "service_healthy"}
    assert services["budget"]["command"] == ["adpipe", "budget"]
    assert services[SPARK_CONNECT]["command"] == ["adpipe", "connect", "serve"]
    # The producer's hour is the one the load DAG starts from.
    produce = parser.parse_args(services["producer"]["command"][1:])
    start = parse_start(produce.start) if getattr(produce, "start", None) else ProduceSpec.start
    assert service_settings(services["producer"]).load_start == start.replace(minute=0, second=0, microsecond=0)
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
    compose_env = service_env(load_compose()["services"]["stream"])
    assert _dockerfile_env() == {"ADPIPE_HOME": compose_env["ADPIPE_HOME"]}
