"""Revised windows in the tables, on real parts: a broker, a real stream job,
Delta tables on a PostgreSQL metastore, ``adpipe load`` and ``adpipe verify
--hour`` as processes, and a reader of the whole-hour views in a process of
its own.

One scenario, in order (hour 12 of 2026-11-17, the default allowed
lateness of 300 s and watermark delay of 30 s):

1. Events of 12:50..12:58, streamed; one more event for the last window the
   watermark closed, streamed: the window is emitted again (revision 1).
   Events of 12:58..13:03, streamed: the watermark is past 13:00, not past
   13:05: ``load --hour 12`` refuses the hour (exit 2), ``--allow-open``
   publishes it early: the revised window as its revision 1, both revisions
   in the history table.
2. One more event for the 12:59 window (closed, within its lateness):
   revision 1 of a window already published. Events to 13:09 close the
   hour; the load replaces the window's row (a late correction) and keeps
   its revision 0 in the history; the gate and ``verify --hour`` pass; a
   rerun writes no table version.
3. ``--repair`` of the hour, frozen (SIGSTOP) after its first table write,
   while another process polls the whole-hour views: every poll sees the
   hour whole, as it was until the switch and as repaired after it.
4. (Tables of their own.) Tables as the version before revisions created
   them are migrated in place by the next load.

Expectations come from the producer's summaries and the events the test
sends, counted in plain Python, never from the loader's code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe.lakehouse import tables as T
from adpipe.settings import Settings

from tests.integration.helpers import (
    Pipeline,
    closed_watermark_ms,
    dump,
    expected_windows,
    load,
    make_pipeline,
    ok,
    poll,
    run,
    send,
    verify_hour,
    warm_env,
)

HOUR = datetime(2026, 11, 17, 12, tzinfo=UTC)
H12 = "2026-11-17T12"
READER = Path(__file__).with_name("whole_hour_reader.py")
pytestmark = pytest.mark.slow


def _stream(p: Pipeline) -> int:
    """One stream run, each produce in one batch; the watermark after it."""
    run = p.stream(max_offsets=5000)
    assert run.returncode == 0, run.log[-3000:]
    return closed_watermark_ms(p)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _late_event(p: Pipeline, window: tuple[str, str], name: str) -> dict:
    """One more impression for ``window`` (ad_id, window_start), 30 s into it."""
    start = datetime.fromisoformat(window[1].replace("Z", "+00:00"))
    event = {"event_id": f"{name}-{uuid.uuid4().hex[:8]}", "ad_id": window[0], "event_type": "impression",
             "event_time": f"{start + timedelta(seconds=30):%Y-%m-%dT%H:%M:%SZ}"}
    send(p, [json.dumps(event).encode()])
    return event


def _last_closed_window(windows: dict, watermark_ms: int) -> tuple[str, str]:
    """A window with events whose end the watermark has passed, within its lateness."""
    end = watermark_ms // 60_000 * 60_000
    start = _iso(end - 60_000)
    assert end + 300_000 > watermark_ms
    return next(k for k in sorted(windows) if k[1] == start)


def _revisions(p: Pipeline, window: tuple[str, str]) -> dict[int, tuple[int, int]]:
    """The window's records in Kafka: revision -> (impressions, clicks)."""
    return {a.get("revision", 0): (a["impressions"], a["clicks"]) for a in p.aggregates()
            if (a["ad_id"], a["window_start"]) == window}


def _in_hour(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["event_hour"].startswith(H12)]


def _windows(rows: list[dict]) -> dict[tuple[str, str], tuple[int, int, int]]:
    return {(r["ad_id"], r["window_start"][:19] + "Z"): (r["impressions"], r["clicks"], r["revision"]) for r in rows}


@pytest.fixture(scope="module")
def scene(broker: Settings, pg: Settings, tmp_path_factory: pytest.TempPathFactory) -> tuple[Pipeline, dict]:
    workdir = tmp_path_factory.mktemp("revisions")
    p = make_pipeline(
        workdir,
        warm_env({"ADPIPE_HOME": str(workdir / "home"),
                  "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{uuid.uuid4().hex[:8]}"}),
    )
    return p, {}


def test_1_a_window_revised_before_its_hour_closes_is_published_as_its_latest_revision(
    scene, tmp_path: Path  # noqa: ANN001
) -> None:
    p, sent = scene
    first = p.produce(events=300, seed=9101, ads=4, ad_offset=980, minutes=8, start=HOUR + timedelta(minutes=50))
    revised = _last_closed_window(expected_windows(first), _stream(p))
    extra = _late_event(p, revised, "rev-a")
    _stream(p)
    before = expected_windows(first)[revised]
    assert _revisions(p, revised) == {0: before, 1: (before[0] + 1, before[1])}, "the stream must revise the window"
    second = p.produce(events=150, seed=9102, ads=4, ad_offset=980, minutes=5, start=HOUR + timedelta(minutes=58))
    watermark = _stream(p)
    sent.update(first=first, second=second, extra=[extra], revised=[revised])
    hour_end_ms = int((HOUR + timedelta(hours=1)).timestamp() * 1000)
    assert hour_end_ms <= watermark < hour_end_ms + 300_000, _iso(watermark)

    # Past its end, not past its end plus the allowed lateness: not closed.
    refused = load(p.env, "--hour", H12)
    assert refused.returncode == 2, (refused.stdout + refused.stderr)[-3000:]
    assert "not closed yet" in refused.stdout + refused.stderr and "allowed lateness" in refused.stdout + refused.stderr
    # Published early, by an operator's choice.
    ok(load(p.env, "--hour", H12, "--allow-open"))
    data = dump(p.env, H12)
    windows = _windows(data["rows"][T.AGGREGATES])
    assert len(windows) == len(data["rows"][T.AGGREGATES])  # one row per window
    assert windows.get(revised) == (before[0] + 1, before[1], 1), (revised, sorted(windows.items())[:40])
    assert {k: v[2] for k, v in windows.items() if k != revised} == dict.fromkeys(set(windows) - {revised}, 0)
    history = {(r["ad_id"], r["window_start"][:19] + "Z", r["revision"]): (r["impressions"], r["clicks"])
               for r in data["rows"][T.REVISIONS]}
    assert history[(*revised, 0)] == before and history[(*revised, 1)] == (before[0] + 1, before[1])
    assert len(history) == len(windows) + 1
    # The revisions in the tables are the records in Kafka, every one.
    kafka = {a["record_uuid"] for a in p.aggregates() if a["window_start"].startswith(H12)}
    assert {r["record_uuid"] for r in data["rows"][T.REVISIONS]} == kafka


def test_2_a_revision_of_a_published_window_is_a_late_correction_and_a_rerun_changes_nothing(
    scene, tmp_path: Path  # noqa: ANN001
) -> None:
    p, sent = scene
    # The 12:59 window closed at 13:00, within its lateness until 13:05 (the watermark is before that).
    late_window = next(k for k in sorted(expected_windows(sent["second"])) if k[1] == f"{H12}:59:00Z")
    extra = _late_event(p, late_window, "rev-b")
    _stream(p)
    before = expected_windows(sent["first"], sent["second"])[late_window]
    assert _revisions(p, late_window) == {0: before, 1: (before[0] + 1, before[1])}
    p.produce(events=150, seed=9103, ads=4, ad_offset=980, minutes=6, start=HOUR + timedelta(minutes=63))
    assert _stream(p) >= int((HOUR + timedelta(minutes=65)).timestamp() * 1000)  # final now

    out = ok(load(p.env, "--hour", H12))
    assert f"late corrections {{'{H12}': 2}}" in out, out[-3000:]  # the new raw event and the revised window
    data = dump(p.env, H12)
    # Independent expectation: the producers' counts and the two events sent, per window.
    expected = expected_windows(sent["first"], sent["second"])
    for event in (*sent["extra"], extra):
        key = (event["ad_id"], event["event_time"][:17] + "00Z")
        expected[key] = (expected[key][0] + 1, expected[key][1])
    published = _windows(_in_hour(data["rows"][T.AGGREGATES]))
    assert {k: v[:2] for k, v in published.items()} == {k: v for k, v in expected.items() if k[1].startswith(H12)}
    assert {k for k, v in published.items() if v[2]} == {sent["revised"][0], late_window}
    revision_0 = [r for r in data["rows"][T.REVISIONS] if (r["ad_id"], r["window_start"][:19] + "Z") == late_window]
    assert sorted((r["revision"], r["impressions"]) for r in revision_0) == [(0, before[0]), (1, before[0] + 1)]
    corrections = {(r["table_name"], r["rows"]) for r in data["late_corrections"]}
    assert corrections == {(T.RAW, 1), (T.AGGREGATES, 1)}
    assert data["whole"] == data["rows"]

    tables = verify_hour(p.env, H12, tmp_path)
    assert tables["ok"], json.dumps(tables)[:3000]
    assert tables["aggregates"]["rows"] == len(published) and tables["revisions"]["rows"] == len(published) + 2
    gate = [r for r in data["load_runs"] if r["step"] == "failed"]
    assert gate == []

    # A rerun finds nothing new: no table version anywhere.
    ok(load(p.env, "--hour", H12))
    again = dump(p.env, H12)
    assert again["versions"] == data["versions"] and again["rows"] == data["rows"]


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP: state T)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except FileNotFoundError:
        return False


def test_3_a_repair_is_seen_whole_or_not_at_all_by_a_reader_of_the_views(scene, tmp_path: Path) -> None:  # noqa: ANN001
    p, _sent = scene
    whole = dump(p.env, H12)["whole"]
    expected = {
        table: (len(whole[table]), sum(r.get("impressions") or 0 for r in whole[table]),
                sum(r.get("clicks") or 0 for r in whole[table]))
        for table in (T.RAW, T.QUARANTINE, T.AGGREGATES, T.REVISIONS)
    }
    assert expected[T.RAW][0] > 100 and expected[T.AGGREGATES][0] > 20
    out, stop = tmp_path / "reader.jsonl", tmp_path / "reader.stop"
    reader_log = (tmp_path / "reader.log").open("w")
    reader = subprocess.Popen(  # noqa: S603
        [sys.executable, str(READER), H12, str(out), str(stop)], env=p.env, stdout=reader_log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        poll("the reader's first poll", lambda: out.exists() and '"ready"' in out.read_text(), 300, proc=reader,
             log_path=tmp_path / "reader.log")
        env = {**p.env, "ADPIPE_LOAD_WARM": "off", "ADPIPE_FAULT": "repair_after_write", "ADPIPE_FAULT_SIGNAL": "STOP"}
        repair = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "adpipe", "load", "--hour", H12, "--repair"], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        deadline = time.monotonic() + 600
        while repair.poll() is None and not _stopped(repair.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        frozen = _stopped(repair.pid)
        if frozen:  # mid-repair: one table holds the rebuilt hour beside the old one
            polls = len(out.read_text().splitlines())
            poll("three polls of the reader while the repair is frozen",
                 lambda: len(out.read_text().splitlines()) >= polls + 3, 120, proc=reader)
            os.kill(repair.pid, signal.SIGCONT)
        output = repair.communicate(timeout=600)[0]
        assert repair.returncode == 0, output[-4000:]
        time.sleep(2)  # a poll or more of the repaired hour
    finally:
        stop.touch()
        reader.wait(timeout=120)
        reader_log.close()
    seen = [json.loads(line) for line in out.read_text().splitlines()][1:]
    assert len(seen) >= 5, seen

    def counts(view: dict) -> tuple:
        return (view["rows"], view["impressions"], view["clicks"])

    partial = [s for s in seen if any(counts(s["views"][t]) != expected[t] for t in expected)]
    assert partial == [], f"a reader saw the hour partly repaired or gone: {partial[:3]}"
    # Each view showed the rows of the runs before the repair, then the repair's own only, never both.
    ledger = dump(p.env, H12)["load_runs"]
    run = max(r["run_id"] for r in ledger if r["kind"] == "repair")
    assert [r["step"] for r in ledger if r["run_id"] == run] == ["repairing", "repaired", "cleared"]
    for table in expected:
        runs = [tuple(s["views"][table]["load_runs"]) for s in seen]
        old = runs[0]
        assert run not in old and runs[-1] == ((run,) if expected[table][0] else ()), (table, runs[0], runs[-1])
        assert set(runs) <= {old, runs[-1]}, (table, sorted(set(runs)))
    if frozen:
        assert "fault injection: SIGSTOP at repair_after_write" in output
    tables = verify_hour(p.env, H12, tmp_path)
    assert tables["ok"], json.dumps(tables)[:3000]


# The tables as the version before revisions created them: the aggregates
# without ``revision``, no revisions table; one window published by run 1.
OLD_TABLES = """
import json
from datetime import datetime
from adpipe.lakehouse import tables as T
from adpipe.lakehouse.metastore import ensure_schema, metastore_conf
from adpipe.settings import load_settings
from adpipe.spark import build_spark
from delta.tables import DeltaTable
from pyspark.sql.types import StructType
settings = load_settings()
ensure_schema(settings)
s = build_spark(settings, 'test-old-tables', metastore_conf(settings))
old = StructType([f for f in T.AGGREGATES_SCHEMA.fields if f.name != 'revision'])
for database in (T.DATABASE, T.STAGING_DATABASE):
    s.sql(f'CREATE DATABASE IF NOT EXISTS {database}')
for name, schema in ((T.RAW, T.RAW_SCHEMA), (T.AGGREGATES, old), (T.QUARANTINE, T.QUARANTINE_SCHEMA)):
    for table in (name, T.staged(name)):
        DeltaTable.create(s).tableName(table).addColumns(schema).partitionedBy('event_hour').execute()
DeltaTable.create(s).tableName(T.LOAD_RUNS).addColumns(T.LOAD_RUNS_SCHEMA).execute()
hour, loaded = datetime(2026, 11, 16, 12), datetime(2026, 11, 16, 13, 10)
row = ('old-uuid', 'ad-1', datetime(2026, 11, 16, 12, 7), datetime(2026, 11, 16, 12, 8), 4, 1, hour, 'old-region',
       'agg', 0, 3, loaded, 1)
s.createDataFrame([row], old).write.format('delta').mode('append').saveAsTable(T.AGGREGATES)
ledger = (1, 'published', 'load', hour, loaded, None, None, None, json.dumps(['2026-11-16T12']), None, None)
s.createDataFrame([ledger], T.LOAD_RUNS_SCHEMA).write.format('delta').mode('append').saveAsTable(T.LOAD_RUNS)
"""


@pytest.mark.extended  # three Spark applications of its own, about 3 minutes: make test-extended
def test_4_tables_of_the_version_before_revisions_are_migrated_in_place_by_the_load(
    broker: Settings, pg: Settings, tmp_path: Path  # noqa: ARG001 - the session's broker and database must be up
) -> None:
    p = make_pipeline(tmp_path, {"ADPIPE_HOME": str(tmp_path / "home"),
                                 "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{uuid.uuid4().hex[:8]}"})
    ok(run(p.env, "-c", OLD_TABLES))
    # A load of another hour (nothing in Kafka): its session migrates the tables.
    ok(load(p.env, "--hour", "2026-11-16T13", "--allow-open"))
    data = dump(p.env, "2026-11-16T12")
    (row,) = data["rows"][T.AGGREGATES]
    assert (row["record_uuid"], row["impressions"], row["revision"], row["load_run"]) == ("old-uuid", 4, 0, 1)
    (history,) = data["rows"][T.REVISIONS]
    assert {k: v for k, v in history.items()} == row
    assert data["whole"][T.AGGREGATES] == [row] and data["whole"][T.REVISIONS] == [history]
    assert all("revision" in r for r in data["staged"][T.AGGREGATES])  # the staging twin has the column too
    # A second session finds nothing to migrate: the same rows.
    ok(load(p.env, "--hour", "2026-11-16T13", "--allow-open"))
    again = dump(p.env, "2026-11-16T12")
    assert again["rows"] == data["rows"] and again["versions"][T.REVISIONS] == data["versions"][T.REVISIONS]
