"""docker-compose.yaml cannot run here (no Docker engine); keep it valid and
in step with the local broker's configuration."""

from __future__ import annotations

import yaml
from adpipe.kafka_broker import server_properties
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
    assert set(compose["services"]) == {"kafka", "postgres", "stream"}
    stream_env = compose["services"]["stream"]["environment"]
    assert stream_env["ADPIPE_KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert compose["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"
    assert set(compose["volumes"]) == {"kafka-data", "pg-data", "adpipe-home"}
