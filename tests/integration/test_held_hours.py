"""One hour never holds back another, and a retry after the dedupe
retention is harmless downstream: a real broker, a real stream job, Delta
tables, ``adpipe load`` and ``adpipe verify --hour`` as real processes.

One scenario (hours A to D of 2026-11-19, dedupe retention 60 s):

1. Hour A is published.
2. Four of A's events are sent again long after A closed (producer
   retries past the retention: the stream lists them late again), and 40
   new events of hour B arrive after B closed (a late-share spike).
3. ``load --hour C``: A's relisted retries are no late events (the gate
   passes and they are kept as ``late_repeat``), B fails its gate and is
   held (its rows stay staged, one alert names it and the expectation),
   C is published.
4. ``load --hour D``: published; B is neither audited nor alerted again.
5. An operator repairs B with a higher late-share bound: published.

Expected counts come from the producer's summaries and a plain json reading
of the raw records; verify --hour reads Kafka in plain Python. The loads and
verify --hour run in the home's warm load driver; the tables (a metastore
database of their own in PostgreSQL) are dumped by a session beside it."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe.alerting import alerts_file
from adpipe.lakehouse import tables as T
from adpipe.settings import Settings, load_settings

from tests.integration.helpers import (
    NO_REVISIONS,
    Pipeline,
    dump,
    hours,
    ids,
    load,
    make_pipeline,
    ok,
    send,
    verify_hour,
    warm_env,
)

A, B, C, D = (datetime(2026, 11, 19, h, tzinfo=UTC) for h in (10, 11, 12, 13))
LABEL = {h: f"{h:%Y-%m-%dT%H}" for h in (A, B, C, D)}
pytestmark = pytest.mark.slow


def _stream(p: Pipeline) -> None:
    run = p.stream(max_offsets=5000)  # each produce in one batch: no event is late by a partition running ahead
    assert run.returncode == 0, run.log[-3000:]


def _event_ms(value: bytes) -> int:
    at = json.loads(value)["event_time"]
    return at if isinstance(at, int) else int(datetime.fromisoformat(at).timestamp() * 1000)


def _alerts(p: Pipeline) -> list[dict]:
    path = alerts_file(load_settings(p.env))
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_held_hour_holds_back_no_other_and_retries_past_the_retention_count_once(
    broker: Settings, pg: Settings, tmp_path: Path  # noqa: ARG001 - the session's broker and database must be up
) -> None:
    p = make_pipeline(
        tmp_path, warm_env({"ADPIPE_HOME": str(tmp_path / "home"),
                            "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{uuid.uuid4().hex[:8]}",
                            "ADPIPE_LATE_DEDUPE_RETENTION_S": "60", **NO_REVISIONS}),
    )
    first = p.produce(events=300, seed=8101, ads=4, ad_offset=800, minutes=62, start=A)
    _stream(p)
    ok(load(p.env, "--hour", LABEL[A]))

    # Hours B and C on time, then (after the stream has closed them) four
    # retries of A's counted events and a spike of 40 late events of B.
    second = p.produce(events=900, seed=8102, ads=4, ad_offset=800, minutes=123, start=A + timedelta(minutes=62))
    _stream(p)
    a_ms, b_ms = A.timestamp() * 1000, B.timestamp() * 1000
    in_a = [r.value for r in p.read(p.settings.topics.events) if a_ms <= _event_ms(r.value) < b_ms]
    retries = list(dict.fromkeys(in_a))[:4]
    spike = [
        json.dumps({"event_id": f"spike-{n}", "ad_id": "ad-000800", "event_type": "impression",
                    "event_time": f"{B + timedelta(minutes=20, seconds=n):%Y-%m-%dT%H:%M:%SZ}"}).encode()
        for n in range(40)
    ]
    send(p, [*retries, *spike])
    _stream(p)
    retry_ids = {json.loads(v)["event_id"] for v in retries}
    listed = [r.header("adpipe.event_id") for r in p.read(p.settings.topics.late)]
    assert sorted(listed) == sorted(retry_ids | {f"spike-{n}" for n in range(40)})  # each once

    # C is asked for: A's relisted retries pass A's gate, B fails its own and is held, C is published.
    out = ok(load(p.env, "--hour", LABEL[C]))
    assert f"held by a failed gate (not published): {LABEL[B]}" in out, out[-3000:]
    data = dump(p.env)
    assert hours(data["rows"][T.AGGREGATES]) == {LABEL[A], LABEL[C]}
    assert {f"spike-{n}" for n in range(40)} <= set(ids(data["staged"][T.RAW]))  # B waits, staged
    repeats = [r for r in data["rows"][T.QUARANTINE] if r["source"] == T.SOURCE_LATE_REPEAT]
    assert {r["event_key"] for r in repeats} == retry_ids and hours(repeats) == {LABEL[A]}
    assert not [r for r in data["rows"][T.QUARANTINE] if r["source"] == T.SOURCE_LATE and r["event_key"] in retry_ids]
    corrections = {(r["event_hour"][:13], r["table_name"]): r["rows"] for r in data["late_corrections"]}
    assert corrections == {(LABEL[A], T.QUARANTINE): 4}
    failed = [r for r in data["load_runs"] if r["step"] == "failed"]
    assert [json.loads(r["hours"]) for r in failed] == [[LABEL[B]]]
    assert "is_late" in failed[0]["message"], failed[0]["message"]
    (alert,) = _alerts(p)
    assert alert["hour"] == LABEL[B] and "is_late" in alert["message"], alert

    tables_a = verify_hour(p.env, LABEL[A], tmp_path)
    assert tables_a["ok"], json.dumps(tables_a)[:3000]
    on_time_a = sum(c["events"] for c in first["counts"] if c["window_start"].startswith(LABEL[A]))
    assert tables_a["raw"]["rows"] == on_time_a and tables_a["late"]["rows"] == 0

    # D: published; B, still held, is not audited nor alerted again.
    p.produce(events=300, seed=8103, ads=4, ad_offset=800, minutes=62, start=D + timedelta(minutes=5))
    _stream(p)
    out = ok(load(p.env, "--hour", LABEL[D]))
    assert f"held by a failed gate (not published): {LABEL[B]}" in out, out[-3000:]
    data = dump(p.env)
    assert hours(data["rows"][T.AGGREGATES]) == {LABEL[A], LABEL[C], LABEL[D]}
    assert len(_alerts(p)) == 1
    assert [r["step"] for r in data["load_runs"] if r["run_id"] == data["load_runs"][-1]["run_id"]] == [
        "staged", "published"]

    # The operator judges the spike real: a repair with a higher bound publishes B.
    ok(load({**p.env, "ADPIPE_MAX_LATE_SHARE": "0.5"}, "--hour", LABEL[B], "--repair"))
    tables_b = verify_hour(p.env, LABEL[B], tmp_path)
    assert tables_b["ok"], json.dumps(tables_b)[:3000]
    assert tables_b["late"]["rows"] == 40
    on_time_b = sum(c["events"] for s in (first, second) for c in s["counts"] if c["window_start"].startswith(LABEL[B]))
    assert tables_b["raw"]["rows"] == on_time_b + 40
