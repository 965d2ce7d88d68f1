"""The load's verbs as clients of the load's Spark Connect server (``adpipe
connect serve``), from two homes of their own, as workers on other hosts
run them: no JVM in the clients, every Delta write (MERGE, DELETE, the
tables' creation) done by the server's session. Real processes against the
session's broker and PostgreSQL, the steps of three runs of one hour
interleaved across the homes:

1. run 1 staged from home A (a stage retried on one worker);
2. run 2, a whole load from home B, frozen mid-publication (one published
   table written, the others and the ledger not, the load lock held); the
   server SIGKILLed, then the client;
3. a new server; run 3 from home B publishes the hour whole, once (its raw
   rows the producer's on-time events, read back by the test's own Spark
   session, not the server's); its validation and ``verify --hour``,
   through the server, pass;
4. run 1's audit and publication, from home B, last: the hour unchanged.

Expected rows come from the producer's own summary."""


from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe.faults import wait_group_gone
from adpipe.lakehouse import tables as T
from adpipe.settings import Settings, load_settings
from adpipe.spark import answering_server

from tests.conftest import PORT_BASE
from tests.integration.helpers import (
    NO_REVISIONS,
    Pipeline,
    dump,
    ids,
    load,
    make_pipeline,
    ok,
    run,
    start_adpipe,
    verify_hour,
)

CONNECT = f"sc://127.0.0.1:{PORT_BASE + 87}"
HOUR = datetime(2026, 11, 18, 9, tzinfo=UTC)
LABEL = f"{HOUR:%Y-%m-%dT%H}"


class Server:
    """``adpipe connect serve`` in ``env``, as its own process group."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.proc, self.log_path = start_adpipe(workdir, "connect", ("serve",), env)
        deadline = time.monotonic() + 240
        while "Spark Connect server on" not in self.log_path.read_text():
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        wait_group_gone(self.proc.pid)


@pytest.fixture(scope="module")
def connected(broker: Settings, pg: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    work = tmp_path_factory.mktemp("connect")
    shared = {
        "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{uuid.uuid4().hex[:8]}",
        "ADPIPE_WAREHOUSE_URI": f"file://{work / 'warehouse'}",
        "ADPIPE_LOAD_WARM": "off",
        **NO_REVISIONS,
    }
    p = make_pipeline(work, {"ADPIPE_HOME": str(work / "server"), **shared})
    server_env = {**p.env, "ADPIPE_SPARK_CONNECT": CONNECT}
    client_env = {**server_env, "ADPIPE_HOME": str(work / "client")}
    state = {"p": p, "work": work, "server_env": server_env, "client": client_env}
    state["server"] = Server(work, server_env)
    try:
        yield state
    finally:
        state["server"].kill()


def _on_time(summary: dict, label: str) -> int:
    return sum(c["events"] for c in summary["counts"] if c["window_start"].startswith(label))


def _whole_and_once(p: Pipeline, label: str, events: int) -> dict:
    data = dump(p.env, label)  # the test's own session, not the server's
    raw = ids(data["rows"][T.RAW])
    assert len(raw) == len(set(raw)) == events, (len(raw), len(set(raw)), events)
    assert {r["event_hour"][:13] for r in data["rows"][T.RAW]} == {label}
    assert data["whole"] == {t: rows for t, rows in data["rows"].items() if t in data["whole"]}
    assert not any(data["staged"][t] for t in data["staged"]), "rows left staged"
    return data


def test_a_server_killed_mid_publication_leaves_the_hour_to_the_next_load_whole_once(
    connected: dict, tmp_path: Path
) -> None:
    p, client, work = connected["p"], connected["client"], connected["work"]
    assert answering_server(load_settings(client)) == CONNECT
    sent = p.produce(events=300, seed=8802, ads=3, ad_offset=970, minutes=62, start=HOUR)
    assert p.stream(max_offsets=5000).returncode == 0
    # A run staged from the other home first (a stage retried on one worker
    # while another runs the hour): its audit and publication come last.
    early_run = tmp_path / "early-run.json"
    ok(load(connected["server_env"], "--hour", LABEL, "--step", "stage", "--run-file", str(early_run)))
    frozen, frozen_log = start_adpipe(
        work, "load", ("--hour", LABEL),
        {**client, "ADPIPE_FAULT": "load_after_publish", "ADPIPE_FAULT_SIGNAL": "STOP", "ADPIPE_FAULT_BATCH": "1"},
    )
    deadline = time.monotonic() + 300
    while "fault injection: SIGSTOP at load_after_publish" not in frozen_log.read_text():
        assert frozen.poll() is None, frozen_log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the load never reached its publication"
        time.sleep(0.5)
    half = dump(p.env, LABEL)
    assert sum(len(rows) for rows in half["rows"].values()) > 0, "no table written before the fault"
    assert "published" not in {r["step"] for r in half["load_runs"] if (r["hour"] or "")[:13] == LABEL}
    connected["server"].kill()
    os.killpg(frozen.pid, signal.SIGKILL)
    frozen.wait()
    connected["server"] = Server(work, connected["server_env"])
    out = ok(load(client, "--hour", LABEL))
    assert f"Spark Connect session on {CONNECT}" in out
    assert "Spark application" not in out, "the client started a Spark session of its own"
    data = _whole_and_once(p, LABEL, _on_time(sent, LABEL))
    published = [r for r in data["load_runs"] if r["step"] == "published" and (r["hour"] or "")[:13] == LABEL]
    assert len(published) == 1, data["load_runs"]
    ok(run(client, "-m", "adpipe", "validate", "--hour", LABEL))
    tables = verify_hour(client, LABEL, tmp_path)
    assert tables["ok"], str(tables)[:3000]
    ok(load(client, "--hour", LABEL, "--step", "audit", "--run-file", str(early_run)))
    ok(load(client, "--hour", LABEL, "--step", "publish", "--run-file", str(early_run)))
    late = _whole_and_once(p, LABEL, _on_time(sent, LABEL))
    assert late["rows"] == data["rows"] and late["whole"] == data["whole"], "the early run's publication changed it"
