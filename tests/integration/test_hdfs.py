"""Checkpoints and Delta tables on a real HDFS (``adpipe hdfs up``: Apache
Hadoop's NameNode and DataNode from its jars, under the test home): the
stream job with ``ADPIPE_CHECKPOINT_URI=hdfs://...`` is SIGKILLed mid-batch
(its aggregates produced, its transaction not committed), restarted, and
its output is exactly once; Union & Load then loads the hour into tables
whose warehouse is on that HDFS.

Expected counts and ids come from the producer's own plan (its messages,
read as plain JSON) and summary; what lies on HDFS is listed through the
NameNode's WebHDFS REST API, not through Spark or adpipe."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe.faults import AFTER_PRODUCE
from adpipe.lakehouse import tables as T
from adpipe.local import hdfs
from adpipe.settings import Settings, load_settings
from adpipe.tools import produce

from tests.conftest import PORT_BASE
from tests.integration.helpers import (
    BROKER_ENV,
    NO_REVISIONS,
    assert_exactly_once,
    dump,
    expected_windows,
    load,
    make_pipeline,
    ok,
    outline,
)

pytestmark = [pytest.mark.slow, pytest.mark.extended]

# The NameNode's RPC port; its web UI (WebHDFS) is + 1, the DataNode's + 2..4.
HDFS_PORT = PORT_BASE + 80
HDFS_ENV = {"ADPIPE_HDFS_PORT": str(HDFS_PORT)}
# Events from 05:56 to 06:02, an hour of its own in the session's tables:
# the stream closes hour 05, which the load then loads. Late events (sent
# last) are timed 05:52 to 05:54.
HOUR = "2026-11-19T05"
START = datetime(2026, 11, 19, 5, 56, tzinfo=UTC)


@pytest.fixture(scope="module")
def cluster(broker: Settings) -> Iterator[Settings]:
    settings = load_settings({**BROKER_ENV, **HDFS_ENV})
    hdfs.down(settings)
    shutil.rmtree(hdfs.hdfs_dir(settings), ignore_errors=True)
    status = hdfs.up(settings)
    try:  # stopped even when a check below fails (the next session wipes the pid files)
        assert status.running and status.answering, status.describe()
        assert status.uri == f"hdfs://127.0.0.1:{HDFS_PORT}"
        listening = listening_addresses([pid for pid in status.pids.values() if pid])
        assert {f"127.0.0.1:{HDFS_PORT + k}" for k in range(5)} <= set(listening)
        assert [a for a in listening if not a.startswith("127.0.0.1:")] == []  # loopback only
        yield settings
    finally:
        stopped = hdfs.down(settings)
    assert stopped and not hdfs.status(settings).running


def listening_addresses(pids: list[int]) -> list[str]:
    """host:port of every TCP socket the processes ``pids`` listen on (from
    /proc: their socket inodes matched with the kernel's tables; an IPv4
    address mapped into IPv6 is shown as IPv4)."""
    inodes = {link[8:-1] for pid in pids for link in fd_links(pid) if link.startswith("socket:[")}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                host, port = fields[1].split(":")
                raw = bytes.fromhex(host)
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                address = ipaddress.ip_address(words)
                mapped = getattr(address, "ipv4_mapped", None)
                found.append(f"{mapped or address}:{int(port, 16)}")
    return found


def fd_links(pid: int) -> list[str]:
    """What the process's open descriptors point at (one closed while
    listed is skipped: the JVM opens and closes files all the time)."""
    links = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            links.append(os.readlink(fd))
        except FileNotFoundError:
            pass
    return links


def webhdfs_list(path: str) -> list[dict]:
    """The statuses in an HDFS folder, from the NameNode's REST API ([] when absent)."""
    url = f"http://127.0.0.1:{HDFS_PORT + 1}/webhdfs/v1{path}?op=LISTSTATUS"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback, our NameNode
            return json.loads(response.read())["FileStatuses"]["FileStatus"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise


def webhdfs_names(path: str) -> list[str]:
    return sorted(s["pathSuffix"] for s in webhdfs_list(path))


def event_hour(value: bytes) -> str:
    """The UTC hour of a raw event's event_time (ISO-8601 with a zone, or epoch ms)."""
    event_time = json.loads(value)["event_time"]
    if isinstance(event_time, int):
        moment = datetime.fromtimestamp(event_time / 1000, UTC)
    else:
        moment = datetime.fromisoformat(event_time).astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H")


def test_stream_killed_mid_batch_and_union_and_load_with_checkpoint_and_tables_on_hdfs(
    cluster: Settings, pg: Settings, tmp_path: Path
) -> None:
    base = f"hdfs://127.0.0.1:{HDFS_PORT}"
    name = f"/it-{tmp_path.name}"
    # HADOOP_CONF_DIR as `adpipe hdfs up` prints it: the jobs' block size.
    client = {**HDFS_ENV, "HADOOP_CONF_DIR": str(hdfs.client_conf_dir(cluster))}
    pipeline = make_pipeline(tmp_path, {**client, **NO_REVISIONS, "ADPIPE_CHECKPOINT_URI": f"{base}{name}/checkpoints"})
    job = pipeline.settings.job_id
    plan = produce.plan(produce.ProduceSpec(
        events=1500, seed=3101, ads=10, ad_offset=3100, minutes=6, start=START, duplicate_rate=0.04,
        malformed_rate=0.02, late_rate=0.02,
    ))  # fmt: skip
    produce.send(pipeline.settings.kafka_bootstrap, pipeline.settings.topics.events, plan)
    summary = plan.summary
    assert summary["duplicates"] > 30 and summary["malformed"] > 20 and summary["late"] == 30

    # Step 1: the driver SIGKILLed in batch 1 after producing its output,
    # before committing its transaction; its checkpoint is on HDFS only.
    killed = pipeline.stream(max_offsets=250, fault={"ADPIPE_FAULT": AFTER_PRODUCE, "ADPIPE_FAULT_BATCH": "1"})
    assert killed.returncode == -9, outline(killed.log)
    assert f"fault injection: SIGKILL at {AFTER_PRODUCE}" in killed.log
    assert {"commits", "offsets", "state"} <= set(webhdfs_names(f"{name}/checkpoints/{job}"))
    # Written with the client settings of HADOOP_CONF_DIR, not Hadoop's defaults.
    offsets = webhdfs_list(f"{name}/checkpoints/{job}/offsets")
    assert offsets and {(f["blockSize"], f["replication"]) for f in offsets} == {(16 * 2**20, 1)}
    assert not (pipeline.settings.home / "checkpoints" / job).exists()

    # Step 2: restarted on the same HDFS checkpoint, to the end of the topic.
    restarted = pipeline.stream(max_offsets=250)
    assert restarted.returncode == 0, outline(restarted.log)
    assert len(restarted.batch_lines()) >= 3 and "Spark dropped" not in restarted.log
    aggregates = assert_exactly_once(pipeline, [summary], min_windows=10 * 5)
    late = pipeline.read(pipeline.settings.topics.late)
    assert sorted(json.loads(r.value)["event_id"] for r in late) == sorted(
        e["event_id"] for e in summary["late_events"]
    )

    # Step 3: Union & Load of the hour into tables whose warehouse is on
    # HDFS (a home and metastore database of their own).
    tables_env = {
        **pipeline.env,
        "ADPIPE_HOME": str(tmp_path / "tables"),
        "ADPIPE_WAREHOUSE_URI": f"{base}{name}/warehouse",
        "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{job}".lower().replace("-", "_"),
    }
    ok(load({**tables_env, "ADPIPE_MAX_LATE_SHARE": "0.1"}, "--hour", HOUR))
    table_folder = f"{name}/warehouse/ads.db/{T.AGGREGATES.split('.', 1)[1]}"
    assert "_delta_log" in webhdfs_names(table_folder)
    assert not (tmp_path / "tables" / "warehouse").exists()

    # What the tables must hold, from the producer: its windows of the hour
    # (all closed: the stream's watermark passed 06:00), the distinct valid
    # events of the hour (on time and late) and the late ones.
    windows = {k: v for k, v in expected_windows(summary).items() if k[1].startswith(HOUR)}
    assert len(windows) >= 10 * 4
    valid = [m for m in plan.messages if m.kind in ("on_time", "late") and event_hour(m.value) == HOUR]
    raw_ids = {json.loads(m.value)["event_id"] for m in valid}
    late_ids = {json.loads(m.value)["event_id"] for m in valid if m.kind == "late"}
    assert len(late_ids) == 30

    rows = dump(tables_env, HOUR)["rows"]
    ours = {t: [r for r in table_rows if r["region"] == job] for t, table_rows in rows.items()}
    got = {(r["ad_id"], r["window_start"][:19] + "Z"): (r["impressions"], r["clicks"]) for r in ours[T.AGGREGATES]}
    assert got == windows and len(ours[T.AGGREGATES]) == len(windows)
    uuids = {a["record_uuid"] for a in aggregates if a["window_start"].startswith(HOUR)}
    assert {r["record_uuid"] for r in ours[T.AGGREGATES]} == uuids
    assert sorted(r["event_id"] for r in ours[T.RAW]) == sorted(raw_ids)
    late_keys = [r["event_key"] for r in ours[T.QUARANTINE] if r["source"] == T.SOURCE_LATE]
    assert sorted(late_keys) == sorted(late_ids)
