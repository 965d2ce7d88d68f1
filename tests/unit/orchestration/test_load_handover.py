"""The load DAG's hand-over between steps: the staged run is the ``stage``
task's XCom, and ``validate``, ``verify`` and ``publish`` take it from there
(Airflow's metadata database), never from a file under ``ADPIPE_HOME``. Each
way a step runs (``ADPIPE_LOAD_SUBMIT``: ``in-process``, ``warm``,
``spark-submit``) is run here with the stage on one home and the later steps
on another, as on two workers; the lakehouse's functions are stood in for
(no Spark), the command line's own ``--step`` code runs where the warm load
driver or spark-submit would run it."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

HOUR = datetime(2026, 11, 22, 12, tzinfo=UTC)


@pytest.fixture
def lakehouse(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The lakehouse's stage, audit and publish stood in for: what each was
    given is recorded; the stage returns one run."""
    from adpipe.lakehouse import load
    from adpipe.orchestration import load_tasks

    seen = SimpleNamespace(audited=[], published=[], failed=[], run=load.StagedRun(
        7, "load", "2026-11-22T12", ["2026-11-22T11", "2026-11-22T12"], {"ads.ad_events_raw": 120},
        [{"region": "eu", "raw": {"topic": "ad-events", "start": {"0": 5}, "end": {"0": 125}}}], 0,
        asked=["2026-11-22T12"],
    ))
    monkeypatch.setattr(load_tasks, "_session", lambda *_args: object())
    monkeypatch.setattr(load, "stage", lambda settings, spark, hour, allow_open=False: seen.run)

    class Audited:  # load.audit's result: the gate's verdict on the hours asked
        def summary(self, asked: list[str]) -> dict:
            return {"success": not seen.failed, "describe": "gate: " + ("; ".join(seen.failed) or "passed"),
                    "passed": [] if seen.failed else list(asked), "past_retention": {}}

        def failed_asked(self, _asked: list[str]) -> list[str]:
            return list(seen.failed)

    monkeypatch.setattr(load, "audit", lambda settings, spark, run: seen.audited.append(run) or Audited())
    monkeypatch.setattr(load, "publish", lambda settings, spark, run: seen.published.append(run) or {
        "inserted": {"ads.ad_events_raw": 120}, "corrections": {}})
    return seen


def _worker(monkeypatch: pytest.MonkeyPatch, home: Path, submit: str) -> None:
    """This process as a worker with ``home`` and no Connections."""
    home.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("ADPIPE_HOME", str(home))
    monkeypatch.setenv("ADPIPE_LOAD_SUBMIT", submit)
    for conn in ("KAFKA", "METASTORE_DB", "BUDGET_DB", "SPARK"):
        monkeypatch.delenv(f"AIRFLOW_CONN_ADPIPE_{conn}", raising=False)


def _context() -> dict:
    return {"params": {"hour": "2026-11-22T12"}}


def _one_step(argv: list[str], homes: list[Path], ran: list[tuple[str, Path]]) -> int:
    """``adpipe load --step S --run-file F`` as the warm load driver or
    spark-submit's driver runs it: the command line's own step code. F must
    be a file of the task's own, under no worker's home."""
    from adpipe.lakehouse.cli import _one_step
    from adpipe.settings import load_settings

    step, path = argv[argv.index("--step") + 1], Path(argv[argv.index("--run-file") + 1])
    assert not [home for home in homes if path.is_relative_to(home)], path
    ran.append((step, path))
    return _one_step(step, load_settings(), object(), HOUR, path)


def _operators(submit: str) -> dict[str, Any]:
    """The load DAG's three Spark steps for ``submit``, wired as the DAG wires them."""
    from adpipe.orchestration.load_tasks import load_step
    from airflow.sdk import DAG

    with DAG("handover", schedule=None, start_date=HOUR):
        stage = load_step("stage", submit, task_id="stage")
        return {"stage": stage, **{step: load_step(step, submit, task_id=step, staged_run=stage.output)
                                   for step in ("validate", "publish")}}


@pytest.mark.parametrize("submit", ["in-process", "warm", "spark-submit"])
def test_stage_on_one_worker_and_the_later_steps_on_another_take_the_run_from_xcom(
    submit: str, lakehouse: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.orchestration.load_tasks import LoadStepOperator, LoadSubmitOperator

    homes = [tmp_path / "worker-a", tmp_path / "worker-b"]
    ran: list[tuple[str, Path]] = []
    monkeypatch.setattr(LoadStepOperator, "_delegate", lambda self, env, settings, argv, out, err: _one_step(
        argv, homes, ran))

    def submitted(self, context, overlay, settings, name, args) -> None:  # noqa: ANN001
        if _one_step(args, homes, ran) != 0:
            raise RuntimeError("spark-submit exited 1")

    monkeypatch.setattr(LoadSubmitOperator, "submit", submitted)
    operators = _operators(submit)

    _worker(monkeypatch, homes[0], submit)
    xcom = operators["stage"].execute(_context())
    assert xcom == lakehouse.run.to_dict() and json.loads(json.dumps(xcom)) == xcom  # JSON, as XCom stores it

    _worker(monkeypatch, homes[1], submit)
    for step in ("validate", "publish"):
        operators[step].staged_run = json.loads(json.dumps(xcom))  # what rendering the template pulls from XCom
        operators[step].execute(_context())
    assert lakehouse.audited == lakehouse.published == [lakehouse.run]
    # Only the task's own temporary files, gone with the step: nothing under either home.
    assert [step for step, _path in ran] == ([] if submit == "in-process" else ["stage", "audit", "publish"])
    assert not [path for _step, path in ran if path.parent.exists()]
    assert [p for home in homes for p in home.rglob("*")] == []


@pytest.mark.parametrize("submit", ["warm", "spark-submit"])
def test_a_failed_gate_elsewhere_fails_validate_naming_the_expectation(
    submit: str, lakehouse: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.lakehouse.quality import QualityError
    from adpipe.orchestration.load_tasks import LoadStepOperator, LoadSubmitOperator

    ran: list[tuple[str, Path]] = []
    monkeypatch.setattr(LoadStepOperator, "_delegate", lambda self, env, settings, argv, out, err: _one_step(
        argv, [tmp_path], ran))

    def submitted(self, context, overlay, settings, name, args) -> None:  # noqa: ANN001
        if _one_step(args, [tmp_path], ran) != 0:
            raise RuntimeError("spark-submit exited 1")

    monkeypatch.setattr(LoadSubmitOperator, "submit", submitted)
    _worker(monkeypatch, tmp_path / "home", submit)
    lakehouse.failed = ["aggregates_unique_ad_window"]
    validate = _operators(submit)["validate"]
    validate.staged_run = lakehouse.run.to_dict()
    with pytest.raises(QualityError, match="gate: aggregates_unique_ad_window"):
        validate.execute(_context())


def test_the_later_steps_read_stages_xcom_when_they_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the DAG: validate's and publish's ``staged_run`` and verify's
    argument are stage's return value, pulled from XCom when the task's
    templates are rendered (on the worker that runs it)."""
    from adpipe.orchestration.load_tasks import LoadStepOperator
    from airflow.sdk.definitions.xcom_arg import XComArg

    from tests.unit.orchestration.test_dags import _parsed

    for submit in ("warm", "in-process", "spark-submit"):
        monkeypatch.setenv("ADPIPE_LOAD_SUBMIT", submit)
        dag = _parsed("ad_union_and_load")
        assert dag.get_task("stage").staged_run is None
        for task_id in ("validate", "publish"):
            handed = dag.get_task(task_id).staged_run
            assert isinstance(handed, XComArg) and (handed.operator.task_id, handed.key) == ("stage", "return_value")
            assert "staged_run" in dag.get_task(task_id).template_fields
        [handed] = dag.get_task("verify").op_args
        assert isinstance(handed, XComArg) and (handed.operator.task_id, handed.key) == ("stage", "return_value")

    run = {"run_id": 7, "hours": ["2026-11-22T12"]}
    pulled = []

    def xcom_pull(task_ids: str, key: str, **_kwargs: object) -> dict:
        pulled.append((task_ids, key))
        return run

    operators = _operators("warm")
    validate: LoadStepOperator = operators["validate"]
    ti = SimpleNamespace(xcom_pull=xcom_pull, dag_id="handover", get_relevant_upstream_map_indexes=lambda **_k: None)
    validate.render_template_fields({"ti": ti})
    assert validate.staged_run == run and pulled == [("stage", "return_value")]


def test_a_step_is_refused_without_the_run_it_reads(
    lakehouse: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.orchestration.load_tasks import LoadStepOperator, NoStagedRun

    with pytest.raises(ValueError, match="step 'load'"):
        LoadStepOperator(task_id="x", step="load")
    with pytest.raises(ValueError, match="step 'publish': reads the staged run"):
        LoadStepOperator(task_id="x", step="publish")
    with pytest.raises(ValueError, match="step 'stage': stages the run"):
        LoadStepOperator(task_id="x", step="stage", staged_run={"run_id": 1})
    _worker(monkeypatch, tmp_path, "in-process")
    publish = LoadStepOperator(task_id="publish", step="publish", staged_run={"run_id": 1})
    publish.staged_run = None  # stage's XCom was empty
    with pytest.raises(NoStagedRun, match="the stage task of this DAG run returned none"):
        publish.execute(_context())
    assert lakehouse.published == []


def test_the_staged_run_in_xcom_is_small() -> None:
    """The XCom's size is bounded by what a run reads, not by its rows: one
    entry per region (four topics, a start and an end offset per
    partition), and one label per hour it audits, holds or was asked for.
    A large case, three regions of 48 partitions and a day of hours, is
    under 64 KB."""
    from adpipe.lakehouse import load
    from adpipe.lakehouse.ranges import RegionRanges, TopicRange

    def topic(name: str) -> TopicRange:
        return TopicRange(name, dict.fromkeys(range(48), 10**9), dict.fromkeys(range(48), 2 * 10**9))

    read = [
        asdict(RegionRanges(f"region-{r}", "broker-1.example.org:9092,broker-2.example.org:9092", 1795000000000,
                            topic("ad-events"), topic("ad-aggregates"), topic("ad-events-late"),
                            topic("ad-events-dlq")))
        for r in range(3)
    ]
    hours = [f"2026-11-22T{h:02d}" for h in range(24)]
    run = load.StagedRun(10**6, "load", hours[-1], hours, {"ads.ad_events_raw": 10**9} , read, 0,
                         asked=[hours[-1]], held=hours[:2])
    size = len(json.dumps(run.to_dict()))
    assert size < 64 * 1024, size
    assert load.StagedRun.from_dict(json.loads(json.dumps(run.to_dict()))) == load.StagedRun.from_dict(run.to_dict())
