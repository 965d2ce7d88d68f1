"""Union & Load by arrival, write-audit-publish, on real parts: a broker,
a real stream job, Delta tables, ``adpipe load`` as real processes.

One scenario, in order (each step builds on the last):

0. A first load SIGKILLed before its audit, then one SIGKILLed after
   publishing one table of three: the rows of the hours it publishes for the
   first time are kept in memory, not staged, and the ledger moves the
   offsets only once they are published, so the next run reads them again.
1. The first load publishes the closed hours it read (09 and 10); the rows of
   the open hour 11 stay staged.
2. Late events produced after hour 09 was published reach its partitions
   with the next run, are counted as late corrections, and ``verify --hour``
   (plain Python on the raw Kafka records) agrees.
3. A load SIGKILLed after staging (before the ledger moves the offsets),
   then one SIGKILLed after publishing one table of three: the next run ends
   the job; every row once. The first is killed in the warm load driver
   (its client exits 137), the second in a process of its own.
4. A duplicate aggregate injected into Kafka fails the gate: the alert names
   the expectation, the published tables are unchanged, the row stays staged
   until an operator discards it.
5. ``--repair`` rebuilds an hour whose published rows were damaged, and a
   second repair changes nothing.

Expectations come from the producer's own summaries and verify's reading
of Kafka, never from the loader's code. The loads and ``verify --hour`` run
in the home's warm load driver (``ADPIPE_LOAD_WARM=on``) but where a step
says otherwise."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe.lakehouse import tables as T
from adpipe.lakehouse import warm
from adpipe.settings import Settings

from tests.integration.helpers import (
    SPARK_SQL,
    Pipeline,
    dump,
    hours,
    ids,
    inject_duplicate_aggregate,
    load,
    make_pipeline,
    ok,
    run,
    verify_hour,
    warm_env,
)

H09, H10, H11 = "2026-11-21T09", "2026-11-21T10", "2026-11-21T11"
# About sixteen minutes of Spark processes on two cores: make test-extended.
pytestmark = [pytest.mark.slow, pytest.mark.extended]


def _stream(p: Pipeline) -> None:
    run = p.stream(max_offsets=400)
    assert run.returncode == 0, run.log[-3000:]


@pytest.fixture(scope="module")
def scene(broker: Settings, pg: Settings, tmp_path_factory: pytest.TempPathFactory) -> tuple[Pipeline, dict]:
    workdir = tmp_path_factory.mktemp("arrival")
    # Tables of its own: a metastore database and warehouse of its own (in
    # PostgreSQL, so the dumps' session stays open beside the loads; Derby
    # admits one JVM: test_held_hours runs on it).
    # Late events are sent on purpose here: the late-share gate allows 5 % (the default 1 % is tested in unit tests).
    p = make_pipeline(
        workdir,
        warm_env({"ADPIPE_HOME": str(workdir / "home"),
                  "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{uuid.uuid4().hex[:8]}", "ADPIPE_MAX_LATE_SHARE": "0.05"}),
    )
    first = p.produce(events=500, seed=7101, ads=4, ad_offset=700, minutes=126,
                      start=datetime(2026, 11, 21, 9, 0, tzinfo=UTC), duplicate_rate=0.05, malformed_rate=0.02)
    _stream(p)
    return p, {"first": first}


def test_0_a_first_publication_killed_before_and_while_publishing_leaves_the_records_to_the_next_run(
    scene,  # noqa: ANN001
) -> None:
    p, _ = scene
    # Killed after the open hour's rows are staged, before the audit: the
    # closed hours' rows, kept to be published at once, are nowhere.
    killed = load({**p.env, "ADPIPE_FAULT": "load_after_stage"}, "--hour", H09)
    assert killed.returncode == warm.EXIT_DRIVER_DIED, (killed.stdout + killed.stderr)[-3000:]
    assert "fault injection: SIGKILL at load_after_stage" in killed.stderr
    data = dump(p.env)
    assert data["load_runs"] == []  # no run id taken, the offsets not moved
    assert all(data["rows"][table] == [] for table in T.TABLES)
    assert hours(data["staged"][T.RAW]) == {H11}
    assert not any(hours(data["staged"][table]) & {H09, H10} for table in T.TABLES)
    # Killed after publishing the first of the three tables (the raw events).
    killed = load({**p.env, "ADPIPE_FAULT": "load_after_publish", "ADPIPE_LOAD_WARM": "off"}, "--hour", H09)
    assert killed.returncode == -9, (killed.stdout + killed.stderr)[-3000:]
    half = dump(p.env)
    assert half["load_runs"] == []
    assert hours(half["rows"][T.RAW]) == {H09, H10}
    assert half["rows"][T.AGGREGATES] == half["rows"][T.QUARANTINE] == []
    assert not any(hours(half["staged"][table]) & {H09, H10} for table in T.TABLES)
    # A reader of the whole-hour views sees nothing of the unfinished run.
    assert all(half["whole"][table] == [] for table in T.TABLES)


def test_1_first_load_publishes_the_closed_hours_and_keeps_the_open_one_staged(scene) -> None:  # noqa: ANN001
    p, _ = scene
    out = ok(load(p.env, "--hour", H09))
    assert "hours 2026-11-21T09, 2026-11-21T10 audited and published" in out, out[-3000:]
    data = dump(p.env)
    for table in T.TABLES:
        assert hours(data["rows"][table]) <= {H09, H10}, table
    assert hours(data["rows"][T.AGGREGATES]) == {H09, H10}
    assert hours(data["staged"][T.RAW]) == {H11}  # 11:00..11:06 is open: staged, not published
    steps = [(r["run_id"], r["step"]) for r in data["load_runs"]]
    assert steps == [(1, "staged"), (1, "published")]
    assert data["late_corrections"] == []


def test_2_late_events_after_the_hour_was_published_land_in_it_with_the_next_run(
    scene, tmp_path: Path  # noqa: ANN001
) -> None:
    p, sent = scene
    # On time from 11:06 (the watermark moves on), plus three events of
    # 09:10..09:40, produced after hour 09 was published: late for the stream.
    second = p.produce(events=20, seed=7102, ads=4, ad_offset=700, minutes=2,
                       start=datetime(2026, 11, 21, 11, 6, tzinfo=UTC), late_rate=0.15, late_gap_minutes=86,
                       late_by_minutes=30)
    late_ids = sorted(e["event_id"] for e in second["late_events"])
    assert len(late_ids) == 3 and all(e["window_start"].startswith(H09) for e in second["late_events"])
    sent["late_09"] = late_ids
    _stream(p)
    listed = {json.loads(r.value)["event_id"] for r in p.read(p.settings.topics.late)}
    assert set(late_ids) <= listed, "the stream must list them as late"

    out = ok(load(p.env, "--hour", H10))
    assert "late corrections {'2026-11-21T09': 6}" in out, out[-3000:]  # 3 raw rows + 3 quarantine rows
    data = dump(p.env, H09)
    assert set(late_ids) <= set(ids(data["rows"][T.RAW]))
    quarantined = {r["event_key"] for r in data["rows"][T.QUARANTINE] if r["source"] == T.SOURCE_LATE}
    assert set(late_ids) <= quarantined
    corrections = {(r["table_name"], r["load_run"], r["final_run"]): r["rows"] for r in data["late_corrections"]}
    assert corrections == {(T.RAW, 2, 1): 3, (T.QUARANTINE, 2, 1): 3}
    published = [r for r in data["load_runs"] if r["step"] == "published"]
    assert json.loads(published[-1]["corrections"]) == {H09: 6}

    tables = verify_hour(p.env, H09, tmp_path)
    assert tables["ok"], json.dumps(tables)[:3000]
    on_time_09 = sum(c["events"] for c in sent["first"]["counts"] if c["window_start"].startswith(H09))
    assert tables["raw"]["rows"] == on_time_09 + 3
    assert tables["late"]["rows"] == 3
    assert tables["minutes"]["rows"] == tables["aggregates"]["rows"] > 0


def test_3_loads_killed_after_staging_and_between_two_published_tables_lose_and_double_nothing(
    scene, tmp_path: Path  # noqa: ANN001
) -> None:
    p, sent = scene
    third = p.produce(events=20, seed=7103, ads=4, ad_offset=700, minutes=2,
                      start=datetime(2026, 11, 21, 11, 8, tzinfo=UTC), late_rate=0.15, late_gap_minutes=60,
                      late_by_minutes=5)
    late_ids = {e["event_id"] for e in third["late_events"]}
    assert len(late_ids) == 3 and all(e["window_start"].startswith(H10) for e in third["late_events"])
    _stream(p)
    # An operator adds a column to a published table: loads go on, leaving it null.
    ok(run(p.env, "-c", SPARK_SQL + "s.sql('ALTER TABLE ads.ad_events_raw ADD COLUMNS (operator_note STRING)')\n"))
    # Killed once the rows are staged, before the ledger row that advances
    # the offsets: the next run reads the same records again.
    killed = load({**p.env, "ADPIPE_FAULT": "load_after_stage"}, "--hour", H10)
    assert killed.returncode == warm.EXIT_DRIVER_DIED, (killed.stdout + killed.stderr)[-3000:]
    assert "fault injection: SIGKILL at load_after_stage" in killed.stderr
    assert "the warm load driver (pid " in killed.stderr and "died before it answered" in killed.stderr
    staged_only = dump(p.env, H10)
    assert late_ids <= set(ids(staged_only["staged"][T.RAW])) and not late_ids & set(ids(staged_only["rows"][T.RAW]))
    assert not [r for r in staged_only["load_runs"] if r["run_id"] == 3]
    # Then killed after publishing the first of the three tables.
    killed = load({**p.env, "ADPIPE_FAULT": "load_after_publish", "ADPIPE_LOAD_WARM": "off"}, "--hour", H10)
    assert killed.returncode == -9, (killed.stdout + killed.stderr)[-3000:]
    half = dump(p.env, H10)
    assert late_ids <= set(ids(half["rows"][T.RAW]))  # the first table was published...
    assert not late_ids & {r["event_key"] for r in half["rows"][T.QUARANTINE]}  # ...the last was not
    # A reader of the whole-hour views sees the hour as it was before the run.
    assert half["whole"] == staged_only["whole"] and not late_ids & set(ids(half["whole"][T.RAW]))
    assert [r["step"] for r in half["load_runs"] if r["run_id"] == 3] == ["staged"]

    ok(load(p.env, "--hour", H10))
    data = dump(p.env, H10)
    for table, (_schema, keys) in T.TABLES.items():
        rows = [tuple(r[k] for k in keys) for r in data["rows"][table]]
        assert len(rows) == len(set(rows)), f"{table}: a key twice"
        assert not data["staged"][table], f"{table}: rows left in staging"
    assert late_ids <= {r["event_key"] for r in data["rows"][T.QUARANTINE]}
    assert data["whole"] == data["rows"]  # the run that completed it shows all of it
    new_raw = [r for r in data["rows"][T.RAW] if r["event_id"] in late_ids]
    assert len(new_raw) == 3 and all("operator_note" in r and r["operator_note"] is None for r in new_raw)
    # The killed run never committed its publication: the one that did is final for nothing new.
    assert [r["step"] for r in data["load_runs"] if r["run_id"] == 4] == ["staged", "published"]
    tables = verify_hour(p.env, H10, tmp_path)
    assert tables["ok"], json.dumps(tables)[:3000]


def test_4_a_failed_gate_publishes_nothing_keeps_the_rows_staged_and_names_the_expectation(scene) -> None:  # noqa: ANN001
    p, _ = scene
    _original, duplicate = inject_duplicate_aggregate(p.settings, H10)
    before = dump(p.env, H10)

    proc = load(p.env, "--hour", H10)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "expect_compound_columns_to_be_unique(column_list=['region', 'ad_id', 'window_start'])" in out, out[-4000:]
    assert "nothing was published" in out
    after = dump(p.env, H10)
    assert after["rows"] == before["rows"], "a failed gate must leave the published tables unchanged"
    assert after["versions"] == before["versions"]
    assert [r["record_uuid"] for r in after["staged"][T.AGGREGATES]] == [duplicate["record_uuid"]]
    failed = [r for r in after["load_runs"] if r["step"] == "failed"]
    assert failed and "expect_compound_columns_to_be_unique" in failed[-1]["message"]

    # Inspected and judged unpublishable: discarded, and the next load passes.
    assert "ads.ad_minute_aggregates': 1" in ok(load(p.env, "--hour", H10, "--discard-staged"))
    ok(load(p.env, "--hour", H10))
    cleared = dump(p.env, H10)
    assert cleared["staged"][T.AGGREGATES] == [] and cleared["rows"] == before["rows"]
    assert [r["step"] for r in cleared["load_runs"]][-3:] == ["discarded", "staged", "published"]


def test_5_repair_rebuilds_a_damaged_hour_from_kafka_and_a_second_repair_changes_nothing(
    scene, tmp_path: Path  # noqa: ANN001
) -> None:
    p, sent = scene
    damage = SPARK_SQL + (
        "s.sql(\"DELETE FROM ads.ad_events_raw WHERE event_hour = TIMESTAMP'2026-11-21 09:00:00' AND "
        "event_type = 'click'\")\n"
        "s.sql(\"UPDATE ads.ad_minute_aggregates SET impressions = impressions + 1 WHERE "
        "event_hour = TIMESTAMP'2026-11-21 09:00:00'\")\n"
    )
    ok(run({**p.env}, "-c", damage))
    assert not verify_hour(p.env, H09, tmp_path)["ok"]

    out = ok(load(p.env, "--hour", H09, "--repair"))
    assert "hours 2026-11-21T09" in out
    repaired = dump(p.env, H09)
    tables = verify_hour(p.env, H09, tmp_path)
    assert tables["ok"], json.dumps(tables)[:3000]
    assert set(sent["late_09"]) <= set(ids(repaired["rows"][T.RAW]))
    # The repair is the hour's final run now: test 2's corrections to it are gone (hour 10 keeps test 3's).
    assert [r for r in repaired["late_corrections"] if r["event_hour"].startswith(H09)] == []
    assert {r["event_hour"][:13] for r in repaired["late_corrections"]} == {H10}

    ok(load(p.env, "--hour", H09, "--repair"))
    again = dump(p.env, H09)
    assert again["rows"] == {t: [{**r, "load_run": r["load_run"] + 1} for r in rows]
                             for t, rows in repaired["rows"].items()}
