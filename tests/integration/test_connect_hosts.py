"""The load's Spark Connect servers across hosts (tests/hosts.py): one on
host ``spark-a``, a spare on ``spark-b``; the load's steps run on host
``worker`` as their clients (``ADPIPE_SPARK_CONNECT`` names both, a's
first), with Kafka and PostgreSQL on the services host and the warehouse
on a folder every host mounts. The hour is staged through a's server; then
host a is killed whole (every process of its namespaces, the server's JVM
included); the audit and publication, run again from the worker, go to b's
server, and the hour is in the tables whole and once: its raw rows are the
producer's on-time events, read back by the test's own Spark session.

Needs root (namespaces): elsewhere it skips, loudly."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe.lakehouse import tables as T

from tests.hosts import Host
from tests.integration.helpers import NO_REVISIONS, dump, ids, make_pipeline
from tests.integration.on_hosts import made_hosts, start_services

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CONNECT_PORT = 15002  # each host has its own ports
HOUR = datetime(2026, 11, 19, 8, tzinfo=UTC)


def _serve(host: Host, env: dict[str, str]) -> None:
    proc = host.start([sys.executable, "-m", "adpipe", "connect", "serve"], host.directory / "connect.log",
                      host.env(env))
    deadline = time.monotonic() + 300
    while "Spark Connect server on" not in proc.log():
        assert proc.poll() is None, proc.log()[-3000:]
        assert time.monotonic() < deadline, f"{host.name}'s server never became ready"
        time.sleep(0.5)


def test_a_load_s_steps_go_to_the_spare_server_when_the_first_one_s_host_dies(hosts_base: Path) -> None:
    with made_hosts(hosts_base, ["spark-a", "spark-b", "worker"]) as net:
        a, b, worker = net["spark-a"], net["spark-b"], net["worker"]
        servers = f"sc://{a.ip}:{CONNECT_PORT},sc://{b.ip}:{CONNECT_PORT}"
        cluster = {
            **start_services(net),
            "ADPIPE_CHECKPOINT_URI": f"file://{hosts_base / 'shared' / 'checkpoints'}",
            "ADPIPE_WAREHOUSE_URI": f"file://{hosts_base / 'shared' / 'warehouse'}",
            "ADPIPE_LOAD_WARM": "off",
            **NO_REVISIONS,
        }
        # The test's own clients (producing, the stream run, the tables' dump) in the root namespace.
        pipeline = make_pipeline(hosts_base, {**cluster, "ADPIPE_HOME": str(hosts_base / "client")})
        label = f"{HOUR:%Y-%m-%dT%H}"
        sent = pipeline.produce(events=300, seed=9101, ads=3, ad_offset=990, minutes=62, start=HOUR)
        assert pipeline.stream(max_offsets=5000).returncode == 0
        connect = {**pipeline.env, "ADPIPE_SPARK_CONNECT": servers}
        _serve(a, connect)
        _serve(b, connect)

        run_file = "/tmp/run.json"  # noqa: S108 - the worker's own /tmp

        def step(name: str) -> str:
            done = worker.run([sys.executable, "-m", "adpipe", "load", "--hour", label, "--step", name,
                               "--run-file", run_file], env=worker.env(connect), timeout=600)
            out = done.stdout + done.stderr
            assert done.returncode == 0, f"{name}: exit {done.returncode}\n{out[-4000:]}"
            return out

        assert f"Spark Connect session on sc://{a.ip}:{CONNECT_PORT}" in step("stage")
        a.kill()
        assert f"Spark Connect session on sc://{b.ip}:{CONNECT_PORT}" in step("audit")
        assert f"Spark Connect session on sc://{b.ip}:{CONNECT_PORT}" in step("publish")

        tables = dump(pipeline.env, label)
        raw = ids(tables["rows"][T.RAW])
        on_time = sum(c["events"] for c in sent["counts"] if c["window_start"][:13] == label)
        assert len(raw) == len(set(raw)) == on_time > 0
        published = [r for r in tables["load_runs"] if r["step"] == "published"]
        assert len(published) == 1, tables["load_runs"]
