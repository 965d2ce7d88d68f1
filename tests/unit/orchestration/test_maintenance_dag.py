"""The daily table-maintenance DAG: it loads, runs once a day at 03:30 UTC
without catchup, retries its task once, and
its task body hands the lakehouse's summaries to XCom as plain dicts."""

from __future__ import annotations

import json

import pytest
from adpipe.settings import load_settings

DAG_ID = "ad_table_maintenance"


@pytest.fixture(scope="module")
def dag(dagbag):  # noqa: ANN001, ANN201 - airflow's DAG
    assert dagbag.import_errors == {}
    return dagbag.dags[DAG_ID]


def test_the_dag_loads_with_its_doc_tags_and_two_independent_tasks(dag) -> None:  # noqa: ANN001
    assert dag.dag_id == DAG_ID
    assert "adpipe" in dag.tags and "maintenance" in dag.tags
    for words in (
        "OPTIMIZE",
        "VACUUM",
        "ADPIPE_VACUUM_RETENTION_H",
        "168",
        "03:30 UTC",
        "ADPIPE_BUDGET_LEDGER_MARGIN_H",
    ):
        assert words in dag.doc_md
    assert sorted(t.task_id for t in dag.tasks) == ["optimize_and_vacuum", "prune_budget_ledger"]
    assert all(t.downstream_task_ids == set() and t.upstream_task_ids == set() for t in dag.tasks)


def test_daily_at_0330_utc_without_catchup(dag) -> None:  # noqa: ANN001
    import pendulum
    from airflow.serialization.encoders import coerce_to_core_timetable
    from airflow.timetables.base import TimeRestriction

    assert dag.catchup is False
    assert dag.max_active_runs == 1
    timetable = coerce_to_core_timetable(dag.timetable)
    restriction = TimeRestriction(earliest=pendulum.datetime(2026, 11, 22, 5, 0), latest=None, catchup=True)
    first = timetable.next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
    assert first.run_after == pendulum.datetime(2026, 11, 23, 3, 30)
    following = timetable.next_dagrun_info(last_automated_data_interval=first.data_interval, restriction=restriction)
    assert following.run_after == pendulum.datetime(2026, 11, 24, 3, 30)


def test_the_task_retries_once(dag) -> None:  # noqa: ANN001
    # (One alert per failure, from the task level: tests/unit/orchestration/test_dags.py, for every DAG.)
    assert [task.retries for task in dag.tasks] == [1, 1]


def test_the_task_body_returns_one_plain_summary_per_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from adpipe.lakehouse import maintenance, metastore
    from adpipe.orchestration import maintenance_tasks

    settings = load_settings({"ADPIPE_VACUUM_RETENTION_H": "200"})
    calls = []

    def fake_optimize_and_vacuum(given, spark):  # noqa: ANN001, ANN202
        calls.append((given, spark))
        return [
            maintenance.TableMaintenance("ads.ad_events_raw", False, 1, 4, 2, 1.5),
            maintenance.TableMaintenance("ads.ad_minute_aggregates", skipped=True),
        ]

    monkeypatch.setattr(metastore, "metastore_session", lambda s, app: f"session of {app}")
    monkeypatch.setattr(maintenance, "optimize_and_vacuum", fake_optimize_and_vacuum)
    out = maintenance_tasks.optimize_and_vacuum(settings)
    assert calls == [(settings, "session of adpipe-maintenance")]
    assert out == [
        {
            "table": "ads.ad_events_raw",
            "skipped": False,
            "files_added": 1,
            "files_removed": 4,
            "files_deleted": 2,
            "seconds": 1.5,
        },
        {
            "table": "ads.ad_minute_aggregates",
            "skipped": True,
            "files_added": 0,
            "files_removed": 0,
            "files_deleted": None,
            "seconds": 0.0,
        },
    ]
    json.dumps(out)  # XCom stores JSON


def test_prune_task_skips_without_a_budget_database_and_prunes_with_one(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    from adpipe.budget import db, retention, schema
    from adpipe.orchestration import maintenance_tasks

    settings = load_settings({"ADPIPE_HOME": str(tmp_path)})
    assert "skipped" in maintenance_tasks.prune_budget_ledger(settings)
    assert not (tmp_path / "budget.db").exists()
    engine = db.make_engine(settings)
    schema.ensure_schema(engine, settings)
    engine.dispose()
    monkeypatch.setattr(retention, "topic_retention_ms", lambda _s, _t: 3_600_000)
    out = maintenance_tasks.prune_budget_ledger(settings)
    assert out["rows"] == 0 and out["cutoff"] is not None
    json.dumps(out)  # XCom-friendly
