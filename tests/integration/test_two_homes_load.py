"""Loads from two homes into one deployment's tables: two workers, each
with its own ``ADPIPE_HOME`` and warm load driver, sharing the metastore's
PostgreSQL database and the warehouse, as two hosts of a cluster do. Real
processes on the session's broker and PostgreSQL:

1. Two whole loads of one hour started at once, one from each home: one
   waits for the other (the deployment's load lock in PostgreSQL names its
   holder), both exit 0, the hour is published once, whole, and each run's
   ledger rows are together, not interleaved with the other's.
2. The steps of two runs of one hour interleaved across the homes, as
   Airflow's workers may run them (a stage retried on one worker while
   another runs the hour): stage on A, stage on B, audit and publish B,
   then audit and publish A. After each publication the hour is whole in
   the views, and A's late publication adds and changes nothing.

Expected rows come from the producer's own summary."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe.lakehouse import tables as T
from adpipe.lakehouse import warm
from adpipe.settings import Settings, load_settings
from adpipe.tools import produce

from tests.integration.helpers import NO_REVISIONS, Pipeline, dump, ids, load, make_pipeline, ok, verify_hour, warm_env

H1, H2 = datetime(2026, 11, 17, 9, tzinfo=UTC), datetime(2026, 11, 17, 10, tzinfo=UTC)
L1, L2 = f"{H1:%Y-%m-%dT%H}", f"{H2:%Y-%m-%dT%H}"
# The first test's events: to 10:05, so that the stream closes 09 (some fall in 10).
FIRST = {"events": 300, "seed": 7501, "ads": 3, "ad_offset": 950, "minutes": 65, "start": H1}
# make test-extended: test_load_lock (make test) shows the lock two whole loads take
# turns on, and test_connect_load (make test) interleaves three runs' steps across two homes.
pytestmark = [pytest.mark.slow, pytest.mark.extended]


@pytest.fixture(scope="module")
def homes(broker: Settings, pg: Settings, tmp_path_factory: pytest.TempPathFactory) -> tuple[Pipeline, dict]:
    work = tmp_path_factory.mktemp("two-homes")
    shared = {
        "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{uuid.uuid4().hex[:8]}",
        "ADPIPE_WAREHOUSE_URI": f"file://{work / 'warehouse'}",
        **NO_REVISIONS,
    }
    p = make_pipeline(work, warm_env({"ADPIPE_HOME": str(work / "a"), **shared}))
    return p, warm_env({**p.env, "ADPIPE_HOME": str(work / "b")})


def _stream(p: Pipeline) -> None:
    run = p.stream(max_offsets=5000)
    assert run.returncode == 0, run.log[-3000:]


def _on_time(summary: dict, label: str) -> int:
    return sum(c["events"] for c in summary["counts"] if c["window_start"].startswith(label))


def _whole_and_once(data: dict, label: str, events: int) -> None:
    raw = ids(data["rows"][T.RAW])
    assert len(raw) == len(set(raw)) == events, (len(raw), len(set(raw)), events)
    assert {r["event_hour"][:13] for r in data["rows"][T.RAW]} == {label}
    assert data["whole"] == {t: rows for t, rows in data["rows"].items() if t in data["whole"]}
    assert not any(data["staged"][t] for t in data["staged"]), "rows left staged"


def _steps_by_run(data: dict) -> list[int]:
    """The run id of each ledger row, in the order they were written."""
    return [r["run_id"] for r in sorted(data["load_runs"], key=lambda r: (r["at"], r["run_id"]))]


def test_two_whole_loads_at_once_from_two_homes_take_turns(homes: tuple[Pipeline, dict]) -> None:
    p, env_b = homes
    sent = p.produce(**FIRST)
    _stream(p)
    procs = [
        subprocess.Popen([sys.executable, "-m", "adpipe", "load", "--hour", L1], env=env,  # noqa: S603
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for env in (p.env, env_b)
    ]
    outs = [proc.communicate(timeout=900)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], "\n---\n".join(o[-3000:] for o in outs)
    data = dump(p.env, L1)
    _whole_and_once(data, L1, _on_time(sent, L1))
    runs = _steps_by_run(data)
    assert runs == sorted(runs), f"two runs' ledger rows interleaved: {runs}"
    published = [r["run_id"] for r in data["load_runs"] if r["step"] == "published"]
    assert len(published) == len(set(published)) >= 1
    # Whichever started second waited for the first, which it names.
    served = [warm.log_file(load_settings(env)) for env in (p.env, env_b)]
    logs = "".join(path.read_text() for path in served if path.exists()) + "".join(outs)
    assert "waiting for the load lock" in logs and "held by adpipe load, pid " in logs, "neither load waited"


def test_two_runs_steps_interleaved_across_homes_publish_the_hour_whole_once(
    homes: tuple[Pipeline, dict], tmp_path: Path
) -> None:
    p, env_b = homes
    # From 10:06 on: the first test's events ran to 10:05, so earlier ones would be late.
    sent = p.produce(events=200, seed=7502, ads=3, ad_offset=950, minutes=56, start=H2 + timedelta(minutes=6))
    _stream(p)
    run_a, run_b = tmp_path / "a-run.json", tmp_path / "b-run.json"
    ok(load(p.env, "--hour", L2, "--step", "stage", "--run-file", str(run_a)))
    ok(load(env_b, "--hour", L2, "--step", "stage", "--run-file", str(run_b)))
    ok(load(env_b, "--hour", L2, "--step", "audit", "--run-file", str(run_b)))
    ok(load(env_b, "--hour", L2, "--step", "publish", "--run-file", str(run_b)))
    first = dump(p.env, L2)
    events = _on_time(sent, L2) + _on_time(produce.plan(produce.ProduceSpec(**FIRST)).summary, L2)
    _whole_and_once(first, L2, events)

    ok(load(p.env, "--hour", L2, "--step", "audit", "--run-file", str(run_a)))
    ok(load(p.env, "--hour", L2, "--step", "publish", "--run-file", str(run_a)))
    second = dump(p.env, L2)
    _whole_and_once(second, L2, events)
    assert second["rows"] == first["rows"] and second["whole"] == first["whole"]
    tables = verify_hour(p.env, L2, tmp_path)
    assert tables["ok"], str(tables)[:3000]
    assert Counter(r["step"] for r in second["load_runs"] if r["hour"] and r["hour"][:13] == L2)["published"] >= 1
