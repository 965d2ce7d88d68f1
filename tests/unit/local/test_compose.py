"""docker-compose.yaml cannot run here (no Docker engine); keep it valid and
in step with the local broker's configuration."""

from __future__ import annotations

import yaml
from adpipe.local.kafka_broker import server_properties
from adpipe.settings import PROJECT_ROOT, load_settings

# Properties whose value depends on the host (addresses, paths) differ on purpose.
HOST_SPECIFIC = {"listeners", "advertised.listeners", "controller.quorum.voters", "log.dirs"}


def _compose() -> dict:
    return yaml.safe_load((PROJECT_ROOT / "docker-compose.yaml").read_text())


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


def test_compose_services_and_stream_configuration() -> None:
    compose = _compose()
    assert set(compose["services"]) == {"kafka", "postgres", "init", "stream", "budget", "airflow"}
    for name in ("init", "stream", "budget", "airflow"):
        env = {k: str(v) for k, v in compose["services"][name]["environment"].items()}
        # Every container reads the same settings, and they load cleanly.
        settings = load_settings(env)
        assert settings.kafka_bootstrap == "kafka:9092"
        assert (settings.pg_host, settings.pg_port) == ("postgres", 5432)
        assert settings.budget_db.startswith("postgresql+psycopg2://") and "@postgres:5432/" in settings.budget_db
    airflow = compose["services"]["airflow"]
    port = load_settings({k: str(v) for k, v in airflow["environment"].items()}).airflow_port
    assert f"127.0.0.1:{port}:{port}" in airflow["ports"]
    assert compose["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"
    assert set(compose["volumes"]) == {"kafka-data", "pg-data", "adpipe-home"}


def test_compose_publishes_ports_on_the_hosts_loopback_only() -> None:
    published = {
        name: [str(p) for p in service.get("ports", [])] for name, service in _compose()["services"].items()
    }
    assert published["kafka"] == ["127.0.0.1:9092:9092"]
    assert published["postgres"] == ["127.0.0.1:5433:5432"]
    for name, ports in published.items():
        for entry in ports:
            # HOST_IP:HOST_PORT:CONTAINER_PORT; "9092:9092" would listen on every interface.
            assert entry.count(":") == 2 and entry.startswith("127.0.0.1:"), f"{name} publishes {entry!r}"
