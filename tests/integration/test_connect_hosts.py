"""The load's Spark Connect servers across hosts (adpipe.tools.hosts): one runs
on host ``spark-a``; the load's steps run on host ``worker`` as its
clients, ``ADPIPE_SPARK_CONNECT`` naming spark-a's server first and the
worker's own second, ``ADPIPE_LOAD_WARM=on`` (a client starts its host's
server when none answers, as it would a warm load driver). Kafka and
PostgreSQL run on the services host, the warehouse is on a folder every
host mounts. The hour is staged through spark-a's server; then host
spark-a is killed whole (every process of its namespaces, the server's JVM
included); the audit, run again from the worker, finds no server
answering and starts the worker's own, and the audit and the publication
run there: the hour is in the tables whole and once, its raw rows the
producer's on-time events, read back by the test's own Spark session.

Needs root (namespaces): elsewhere it skips, loudly."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe.lakehouse import tables as T
from adpipe.tools.hosts import Host

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


def test_a_load_s_steps_start_a_server_on_their_own_host_when_the_first_one_s_host_dies(hosts_base: Path) -> None:
    with made_hosts(hosts_base, ["spark-a", "worker"]) as net:
        a, worker = net["spark-a"], net["worker"]
        servers = f"sc://{a.ip}:{CONNECT_PORT},sc://{worker.ip}:{CONNECT_PORT}"
        cluster = {
            **start_services(net),
            "ADPIPE_CHECKPOINT_URI": f"file://{hosts_base / 'shared' / 'checkpoints'}",
            "ADPIPE_WAREHOUSE_URI": f"file://{hosts_base / 'shared' / 'warehouse'}",
            "ADPIPE_LOAD_WARM": "on",
            **NO_REVISIONS,
        }
        # The test's own clients (producing, the stream run, the tables' dump) in the root namespace.
        pipeline = make_pipeline(hosts_base, {**cluster, "ADPIPE_HOME": str(hosts_base / "client")})
        label = f"{HOUR:%Y-%m-%dT%H}"
        sent = pipeline.produce(events=300, seed=9101, ads=3, ad_offset=990, minutes=62, start=HOUR)
        assert pipeline.stream(max_offsets=5000).returncode == 0
        connect = {**pipeline.env, "ADPIPE_SPARK_CONNECT": servers}
        _serve(a, connect)

        run_file = "/tmp/run.json"  # noqa: S108 - the worker's own /tmp

        def step(name: str) -> str:
            done = worker.run([sys.executable, "-m", "adpipe", "load", "--hour", label, "--step", name,
                               "--run-file", run_file], env=worker.env(connect), timeout=600)
            out = done.stdout + done.stderr
            assert done.returncode == 0, f"{name}: exit {done.returncode}\n{out[-4000:]}"
            return out

        staged = step("stage")
        assert f"Spark Connect session on sc://{a.ip}:{CONNECT_PORT}" in staged and "starting this host's" not in staged
        a.kill()
        audited = step("audit")
        assert f"no Spark Connect server answers: starting this host's on sc://{worker.ip}:{CONNECT_PORT}" in audited
        assert f"Spark Connect session on sc://{worker.ip}:{CONNECT_PORT}" in audited
        published = step("publish")
        assert f"Spark Connect session on sc://{worker.ip}:{CONNECT_PORT}" in published
        assert "starting this host's" not in published  # the one the audit started, still up

        tables = dump(pipeline.env, label)
        raw = ids(tables["rows"][T.RAW])
        on_time = sum(c["events"] for c in sent["counts"] if c["window_start"][:13] == label)
        assert len(raw) == len(set(raw)) == on_time > 0
        ledger = [r for r in tables["load_runs"] if r["step"] == "published"]
        assert len(ledger) == 1, tables["load_runs"]
