"""Union & Load against real parts: two regions (two stream jobs writing two
aggregate topics on the broker), a Hive metastore in a real PostgreSQL, and
Delta tables written by separate Spark applications at the same time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe.alerting import alerts_file
from adpipe.faults import wait_group_gone
from adpipe.lakehouse import tables as T
from adpipe.settings import Settings, load_settings
from adpipe.tools import verify

from tests.integration.helpers import Pipeline, dump, in_hour, latest_revisions, make_pipeline, send, warm_env

HOUR = "2026-11-22T12"


@dataclass
class Regions:
    a: Pipeline
    b: Pipeline
    env: dict[str, str]  # the loader's: both regions in ADPIPE_REGIONS

    @property
    def names(self) -> set[str]:
        return {self.a.settings.job_id, self.b.settings.job_id}


def _streams(*pipelines: Pipeline) -> None:
    """Both regions' stream jobs at once, each to the end of its topic, in
    micro-batches small enough that the watermark passes 13:00 before the
    late events (sent last) are read."""
    procs = [p.start_stream("--available-now", "--max-offsets-per-trigger", "300") for p in pipelines]
    for proc, log_path in procs:
        assert proc.wait(timeout=600) == 0, log_path.read_text()[-3000:]
        wait_group_gone(proc.pid)


def _first_events(p: Pipeline, n: int = 3) -> list[bytes]:
    """The raw values of the ``n`` earliest valid events of ``p``'s raw topic
    (12:58: sent first to another region, they move its watermark past none
    of its own events)."""
    valid = {e.event_id: (e.event_ms, r.value) for r in p.read(p.settings.topics.events)
             if not isinstance(e := verify.classify(r.value), str)}  # a retry repeats its event
    return [value for _ms, value in sorted(valid.values())[:n]]


def _cross_region_ids(regions: Regions) -> set[str]:
    """The events both regions' raw topics hold (a plain json reading)."""
    ids = [{json.loads(v)["event_id"] for v in (r.value for r in p.read(p.settings.topics.events))
            if not isinstance(verify.classify(v), str)} for p in (regions.a, regions.b)]
    return ids[0] & ids[1]


@pytest.fixture(scope="module")
def regions(broker: Settings, pg: Settings, tmp_path_factory: pytest.TempPathFactory) -> Regions:
    a, b = make_pipeline(tmp_path_factory.mktemp("a")), make_pipeline(tmp_path_factory.mktemp("b"))
    # Seeds and ads no other test uses: the tables are shared by the session.
    # 12:58..13:02 on time, then 13:02..13:08 (the watermark past 13:05:
    # hour 12 closed for good) with late events timed 12:51..12:55 at the
    # end: one stream run per region covers both.
    for p, seed, offset in ((a, 4101, 500), (b, 4102, 600)):
        p.produce(events=700, seed=seed, ads=8, ad_offset=offset, minutes=4,
                  start=datetime(2026, 11, 22, 12, 58, tzinfo=UTC), duplicate_rate=0.05, malformed_rate=0.02)
        if p is a:
            # Three of region a's first events reach region b as well, on time there too (a retry routed to
            # another region): both streams count them.
            send(b, _first_events(a))
    for p, seed, offset in ((a, 4201, 500), (b, 4202, 600)):
        p.produce(events=200, seed=seed, ads=8, ad_offset=offset, minutes=6,
                  start=datetime(2026, 11, 22, 13, 2, tzinfo=UTC), late_rate=0.1, late_by_minutes=4)
    _streams(a, b)
    regions_json = json.dumps(
        [
            {"job_id": p.settings.job_id, "events": p.settings.topics.events,
             "aggregates": p.settings.topics.aggregates, "dlq": p.settings.topics.dlq,
             "late": p.settings.topics.late}
            for p in (a, b)
        ]
    )
    # The scenario sends late events on purpose (about 5 % of hour 12): the
    # load's gate allows 10 % here; the default 1 % is tested in unit tests.
    return Regions(a, b, {**a.env, "ADPIPE_REGIONS": regions_json, "ADPIPE_MAX_LATE_SHARE": "0.1"})


def _adpipe(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "adpipe", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )


def _tail(output: str) -> str:
    """A failed run's Python log lines first (Spark's WARN lines bury them)."""
    ours = [line for line in output.splitlines() if " adpipe" in line or "Error" in line or "Exception" in line]
    return "\n".join(ours[-40:]) + "\n--- tail ---\n" + output[-3000:]


def _dump(env: dict[str, str], names: set[str]) -> dict:
    data = dump(env, HOUR)
    data["rows"] = {t: [r for r in rows if r["region"] in names] for t, rows in data["rows"].items()}
    return data


def _expected(regions: Regions) -> dict[str, set]:
    """What the tables must hold for the hour, from plain Kafka reads and
    verify's own (Python) reading of the raw events."""
    aggregates, raw, late = set(), set(), set()
    for p in (regions.a, regions.b):
        for rec in latest_revisions(p.aggregates()).values():  # the table keeps each window's latest
            if rec["window_start"].startswith(HOUR):
                aggregates.add((rec["record_uuid"], rec["ad_id"], rec["window_start"], rec["impressions"],
                                rec["clicks"]))
        for rec in p.read(p.settings.topics.events):
            event = verify.classify(rec.value)
            if not isinstance(event, str) and in_hour(event.event_ms, HOUR):
                raw.add(event.event_id)
        for rec in p.read(p.settings.topics.late):
            event = verify.classify(rec.value)
            if not isinstance(event, str) and in_hour(event.event_ms, HOUR):
                late.add(event.event_id)
    return {"aggregates": aggregates, "raw": raw, "late": late}


def test_two_concurrent_loads_of_overlapping_hours_union_both_regions_once(regions: Regions) -> None:
    # Two Spark applications on the same metastore and tables at once: the
    # hour alone, in the home's warm load driver (which it starts; the tests
    # below reuse it), and a two-hour backfill that includes it, in a
    # process of its own.
    one = _adpipe(warm_env(regions.env), "load", "--hour", HOUR)
    two = _adpipe(regions.env, "load", "--hour", "2026-11-22T11", "--to-hour", HOUR)
    out_one, out_two = one.communicate(timeout=900)[0], two.communicate(timeout=900)[0]
    assert one.returncode == 0, f"exit {one.returncode}:\n{_tail(out_one)}"
    assert two.returncode == 0, f"exit {two.returncode}:\n{_tail(out_two)}"

    expected = _expected(regions)
    assert len(expected["aggregates"]) > 20 and expected["late"], "the scenario must have windows and late events"
    rows = _dump(regions.env, regions.names)["rows"]

    aggregates = rows[T.AGGREGATES]
    got = {(r["record_uuid"], r["ad_id"], r["window_start"][:19] + "Z", r["impressions"],
            r["clicks"]) for r in aggregates}
    assert got == expected["aggregates"]
    assert len(aggregates) == len(got), "a record_uuid landed twice"
    assert {r["region"] for r in aggregates} == regions.names
    # One aggregate per region, ad and minute (the cross-region copies give region b windows of a's ads).
    assert max(Counter((r["region"], r["ad_id"], r["window_start"]) for r in aggregates).values()) == 1

    raw_ids = [r["event_id"] for r in rows[T.RAW]]
    assert len(raw_ids) == len(set(raw_ids))
    assert set(raw_ids) == expected["raw"]

    quarantine = rows[T.QUARANTINE]
    keys = [(r["source"], r["event_key"]) for r in quarantine]
    assert len(keys) == len(set(keys))
    assert {k for s, k in keys if s == T.SOURCE_LATE} == expected["late"]
    # The events that reached both regions: one raw row each, and the other
    # region's copy listed (both streams counted them); one alert says so.
    both = _cross_region_ids(regions)
    assert len(both) == 3 and both <= set(raw_ids)
    copies = [r for r in quarantine if r["source"] == T.SOURCE_CROSS_REGION]
    raw_region = {r["event_id"]: r["region"] for r in rows[T.RAW]}
    assert sorted(r["event_id"] for r in copies) == sorted(both)
    assert all(r["region"] != raw_region[r["event_id"]] for r in copies)
    alerts = [json.loads(line) for line in alerts_file(load_settings(regions.env)).read_text().splitlines()]
    (alert,) = [a for a in alerts if a.get("cross_region_duplicates") and set(a["regions"]) == regions.names]
    assert alert["cross_region_duplicates"] == 3 and alert["hours"] == [HOUR]
    assert all(r["reason"] for r in quarantine)
    # Every late event is a valid raw event of the hour too.
    assert expected["late"] <= set(raw_ids)


def _commits(regions: Regions) -> dict[str, list[str]]:
    """Each table's Delta commit files: a table changes only by a new one."""
    warehouse = load_settings(regions.env).warehouse_dir
    commits = {}
    for name in T.PUBLISHED:
        log_dir = warehouse / f"{name.replace('.', '.db/', 1)}" / "_delta_log"
        commits[name] = sorted(p.name for p in log_dir.glob("*.json"))
        assert commits[name], f"no Delta log at {log_dir}"
    return commits


def test_rerun_changes_nothing(regions: Regions) -> None:
    before = _commits(regions)
    # In the warm load driver (the DAG's default), which verify --hour below uses too.
    proc = _adpipe(warm_env(regions.env), "load", "--hour", HOUR)
    out = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, out[-4000:]
    inserted = [int(n) for n in re.findall(r"\+(\d+) of", out)]
    assert inserted == [0, 0, 0], out[-2000:]
    # No new commit means every table is still at the version the first
    # load wrote: the same rows, by Delta's definition of a version.
    assert _commits(regions) == before, "a rerun must not write a table version"


def test_an_hour_the_stream_has_not_closed_is_refused(regions: Regions) -> None:
    proc = _adpipe(regions.env, "load", "--hour", "2026-11-22T13")
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2, out
    assert "not closed yet" in out


def test_a_bad_hour_is_a_clear_error(regions: Regions) -> None:
    proc = _adpipe({**os.environ, **regions.env}, "load", "--hour", "2026-11-22 12:30")
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode != 0
    assert "not the start of an hour" in out


def test_verify_hour_checks_the_tables_against_kafka(regions: Regions, tmp_path: Path) -> None:
    # (That verify names missing, unexpected, duplicated and wrong rows is
    # tested on the comparison itself in tests/unit/test_load.py.)
    report_path = tmp_path / "verify.json"
    proc = _adpipe(warm_env(regions.env), "verify", "--hour", HOUR, "--report", str(report_path))
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, out[-4000:]
    tables = json.loads(report_path.read_text())["tables"]
    assert tables["ok"] and tables["regions"] == [regions.a.settings.job_id, regions.b.settings.job_id]
    expected = _expected(regions)
    assert tables["aggregates"]["rows"] == len(expected["aggregates"])
    assert tables["raw"]["rows"] == len(expected["raw"])
    assert tables["late"]["rows"] == len(expected["late"])
    assert tables["cross_region"]["rows"] == tables["cross_region"]["expected"] == 3
