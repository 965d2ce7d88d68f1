"""The ``ad_hour_repair`` DAG: its trigger form's params as Airflow checks
them, the task's dispatch to the command line's own actions (the same
``adpipe.lakehouse.repair.hour_action`` as ``adpipe load --repair`` /
``--discard-staged``), and what the task says when the hour is not held or
the action fails. No Spark here: the lakehouse's functions are stood in for
where named."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from adpipe.settings import load_settings

DAG_ID = "ad_hour_repair"
HOUR = datetime(2026, 11, 22, 12, tzinfo=UTC)


def _form(dagbag, **values: object) -> dict:  # noqa: ANN001
    """The run's params as Airflow resolves a trigger form's values (each
    set value is checked against its Param's schema, then every param)."""
    params = copy.deepcopy(dagbag.dags[DAG_ID].params)
    params.update(values)
    return params.validate()


def test_the_form_takes_a_held_hour_and_one_of_two_actions(dagbag) -> None:  # noqa: ANN001
    assert _form(dagbag, hour="2026-11-22T12") == {"hour": "2026-11-22T12", "action": "repair"}
    assert _form(dagbag, hour="2026-11-22T12", action="discard_staged")["action"] == "discard_staged"
    dag = dagbag.dags[DAG_ID]
    assert dag.schedule is None and dag.max_active_runs == 1
    assert dag.params.get_param("action").schema["enum"] == ["repair", "discard_staged"]


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({}, "Invalid input for param hour: No value passed and Param has no default value"),
        ({"hour": "2026-11-22 12:00"}, "Invalid input for param hour: '2026-11-22 12:00' does not match"),
        ({"hour": "2026-11-22T12:30"}, "Invalid input for param hour"),
        ({"hour": "2026-11-22T12", "action": "load"}, "Invalid input for param action: 'load' is not one of"),
        ({"hour": "2026-11-22T12", "action": "discard-staged"}, "Invalid input for param action"),
    ],
)
def test_bad_params_are_refused_with_the_params_name(dagbag, values: dict, error: str) -> None:  # noqa: ANN001
    from airflow.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=error.replace("(", r"\(")):
        _form(dagbag, **values)


def test_a_run_made_without_the_form_is_checked_when_it_runs() -> None:
    from adpipe.orchestration.hour_actions import ActionError, action_args, hour_and_action

    assert hour_and_action({"hour": "2026-11-22T12", "action": "discard_staged"}) == (HOUR, "discard_staged")
    for params, error in (
        (None, "param hour=None"),
        ({"hour": "2026-11-22", "action": "repair"}, "param hour='2026-11-22': give the held hour as YYYY-MM-DDTHH"),
        ({"hour": "2026-11-22T12", "action": "publish"}, "param action='publish': expected one of repair, "
         "discard_staged"),
    ):
        with pytest.raises(ActionError, match=error):
            hour_and_action(params)
    assert action_args(HOUR, "repair") == ["--hour", "2026-11-22T12", "--repair", "--held-only"]
    assert action_args(HOUR, "discard_staged") == ["--hour", "2026-11-22T12", "--discard-staged", "--held-only"]


def test_the_actions_are_the_command_lines_own() -> None:
    """Each form action is a flag of ``adpipe load`` (the spark-submit job
    and the warm load driver parse these very arguments), and the
    lakehouse's dispatcher knows the same names."""
    from adpipe.cli import build_parser
    from adpipe.lakehouse import repair
    from adpipe.orchestration.hour_actions import ACTIONS, action_args

    assert tuple(ACTIONS) == repair.HOUR_ACTIONS
    for action in ACTIONS:
        args = build_parser().parse_args(["load", *action_args(HOUR, action)])
        assert (args.hour, args.repair, args.discard_staged, args.held_only) == (
            "2026-11-22T12", action == "repair", action == "discard_staged", True)


def _operator_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, submit: str) -> None:
    monkeypatch.setenv("ADPIPE_HOME", str(tmp_path))
    monkeypatch.setenv("ADPIPE_LOAD_SUBMIT", submit)
    for conn in ("KAFKA", "METASTORE_DB", "BUDGET_DB", "SPARK"):
        monkeypatch.delenv(f"AIRFLOW_CONN_ADPIPE_{conn}", raising=False)


class _Events(dict):
    """A task context's ``outlet_events``: one recorder per alias."""

    def __missing__(self, key: object) -> SimpleNamespace:
        added: list = []
        self[key] = SimpleNamespace(add=lambda asset, extra=None: added.append((asset.name, extra)), added=added)
        return self[key]


def _context(action: str) -> dict:
    return {"params": {"hour": "2026-11-22T12", "action": action}, "outlet_events": _Events()}


@pytest.mark.parametrize("action", ["repair", "discard_staged"])
def test_in_process_the_task_calls_the_lakehouses_action_on_held_hours_only(
    action: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.lakehouse import repair
    from adpipe.orchestration.assets import REPAIRED_TABLES
    from adpipe.orchestration.hour_actions import HourActionOperator

    _operator_env(monkeypatch, tmp_path, "in-process")
    calls = []

    def hour_action(settings, hour, asked, spark=None, held_only=False) -> str:  # noqa: ANN001
        calls.append((settings.home, hour, asked, held_only))
        return f"{asked} done; hour 2026-11-22T12 published: ads.ad_minute_aggregates 150"

    monkeypatch.setattr(repair, "hour_action", hour_action)
    context = _context(action)
    result = HourActionOperator(task_id="act_on_held_hour").execute(context)
    assert calls == [(tmp_path, HOUR, action, True)]
    assert result == {"hour": "2026-11-22T12", "action": action,
                      "result": f"{action} done; hour 2026-11-22T12 published: ads.ad_minute_aggregates 150"}
    # Only a repair changes the published tables: their Assets get an event through the alias.
    events = context["outlet_events"]
    if action == "repair":
        assert events[REPAIRED_TABLES].added == [
            (table, {"hour": "2026-11-22T12", "action": "repair"})
            for table in ("ads.ad_events_raw", "ads.ad_minute_aggregates", "ads.ad_events_quarantine",
                          "ads.ad_minute_aggregate_revisions")
        ]
    else:
        assert REPAIRED_TABLES not in events


NOT_HELD = (
    "hour 2026-11-22T12 is not held by a failed gate (its last step: discarded by run 7 at "
    "2026-11-22T15:04:05Z): nothing to repair. Hours held now: none"
)


@pytest.mark.parametrize(
    ("code", "err", "raised", "message"),
    [
        (4, [f"2026-11-29 04:00:00,000 ERROR adpipe.lakehouse: {NOT_HELD}"], "HourNotHeld", NOT_HELD),
        (1, ["2026-11-29 04:00:00,000 INFO adpipe.lakehouse.load: reading",
             "2026-11-29 04:00:00,000 ERROR adpipe.lakehouse.quality: GE: hour 2026-11-22T12 FAILED:",
             "2026-11-29 04:00:00,000 ERROR adpipe.lakehouse: the gate failed for 2026-11-22T12: nothing was "
             "published; the failed hours' rows stay staged", "expect_compound_columns_to_be_unique(...)"],
         "HourActionFailed",
         "adpipe load --hour 2026-11-22T12 --repair --held-only exited 1: the gate failed for 2026-11-22T12: "
         "nothing was published; the failed hours' rows stay staged\nexpect_compound_columns_to_be_unique(...)"),
    ],
)
def test_in_the_warm_driver_a_refusal_or_a_failure_fails_the_task_saying_why(
    code: int, err: list[str], raised: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.orchestration import hour_actions
    from adpipe.orchestration.hour_actions import HourActionOperator

    _operator_env(monkeypatch, tmp_path, "warm")
    operator = HourActionOperator(task_id="act_on_held_hour")
    sent = []

    def delegate(env, settings, argv, out, errs) -> int:  # noqa: ANN001
        sent.append(argv)
        for line in err:
            errs.write(line + "\n")
        return code

    monkeypatch.setattr(operator, "_delegate", delegate)
    context = _context("repair")
    with pytest.raises(getattr(hour_actions, raised)) as failed:
        operator.execute(context)
    assert str(failed.value) == message
    assert sent == [["load", "--hour", "2026-11-22T12", "--repair", "--held-only"]]
    assert not context["outlet_events"]  # nothing repaired, no Asset event


def test_in_the_warm_driver_the_result_is_the_commands_last_line_and_without_one_it_runs_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.lakehouse import repair
    from adpipe.orchestration.hour_actions import HourActionOperator

    _operator_env(monkeypatch, tmp_path, "warm")
    operator = HourActionOperator(task_id="act_on_held_hour")
    said = "discarded the staged rows of 2026-11-22T12: {'ads.ad_minute_aggregates': 1}; hour 2026-11-22T12 " \
        "published: ads.ad_minute_aggregates 150"

    def delegate(env, settings, argv, out, err) -> int:  # noqa: ANN001
        out.write(said + "\n")
        return 0

    monkeypatch.setattr(operator, "_delegate", delegate)
    assert operator.execute(_context("discard_staged"))["result"] == said

    # No warm load driver could take it: the same action in this process.
    monkeypatch.setattr(operator, "_delegate", lambda *args: None)
    monkeypatch.setattr(repair, "hour_action", lambda settings, hour, action, held_only=False: f"{action} {held_only}")
    assert operator.execute(_context("discard_staged"))["result"] == "discard_staged True"


def test_an_hour_not_held_is_refused_naming_its_last_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from adpipe.lakehouse import repair
    from adpipe.lakehouse.ledger import HourStep

    at = datetime(2026, 11, 22, 15, 4, 5, tzinfo=UTC)
    steps = {
        "2026-11-22T12": HourStep("published", 3, at, ""),
        "2026-11-22T13": HourStep("failed", 4, at, "expect_column_values_to_be_between"),
        "2026-11-22T14": HourStep("failed", 5, at, "is_late"),
    }
    monkeypatch.setattr(repair, "last_steps", lambda _spark: steps)
    repair.require_held(None, datetime(2026, 11, 22, 13, tzinfo=UTC), "repair")  # held: no error
    with pytest.raises(repair.HourNotHeld) as refused:
        repair.require_held(None, HOUR, "discard_staged")
    assert str(refused.value) == (
        "hour 2026-11-22T12 is not held by a failed gate (its last step: published by run 3 at 2026-11-22T15:04:05Z): "
        "nothing to discard staged. Hours held now: 2026-11-22T13, 2026-11-22T14"
    )
    with pytest.raises(repair.HourNotHeld, match=r"2026-11-22T11 is not held by a failed gate \(no load has audited "):
        repair.require_held(None, datetime(2026, 11, 22, 11, tzinfo=UTC), "repair")


def test_the_lakehouse_dispatcher_runs_the_clis_functions_and_says_what_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.lakehouse import repair

    settings = load_settings({"ADPIPE_HOME": str(tmp_path)})
    calls = []
    monkeypatch.setattr(repair, "repair_hour", lambda s, hour, spark, held_only: calls.append(("repair", held_only))
                        or repair.LoadResult(hour="2026-11-22T12", run_id=9, hours=["2026-11-22T12"]))
    monkeypatch.setattr(repair, "discard_staged", lambda s, hour, spark, held_only: calls.append(("discard", held_only))
                        or {"ads.ad_minute_aggregates": 1})
    monkeypatch.setattr(repair, "published_rows", lambda spark, hour: {"ads.ad_events_raw": 230,
                                                                     "ads.ad_minute_aggregates": 150})
    spark = object()
    repaired = repair.hour_action(settings, HOUR, "repair", spark, held_only=True)
    assert repaired.startswith("run 9: hours 2026-11-22T12 audited and published in ")
    assert repaired.endswith("; hour 2026-11-22T12 published: ads.ad_events_raw 230, ads.ad_minute_aggregates 150")
    discarded = repair.hour_action(settings, HOUR, "discard_staged", spark)
    assert discarded == ("discarded the staged rows of 2026-11-22T12: {'ads.ad_minute_aggregates': 1}; hour "
                         "2026-11-22T12 published: ads.ad_events_raw 230, ads.ad_minute_aggregates 150")
    assert calls == [("repair", True), ("discard", False)]
    with pytest.raises(ValueError, match="action 'load': expected one of repair, discard_staged"):
        repair.hour_action(settings, HOUR, "load", spark)


def test_the_command_line_refuses_an_hour_not_held_with_exit_4(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from adpipe.lakehouse import cli, metastore, repair

    settings = load_settings({"ADPIPE_HOME": str(tmp_path)})
    monkeypatch.setattr(metastore, "metastore_session", lambda *_args: object())

    def not_held(*_args: object, **kwargs: object) -> str:
        assert kwargs == {"held_only": True}
        raise repair.HourNotHeld("hour 2026-11-22T12 is not held by a failed gate")

    monkeypatch.setattr(repair, "hour_action", not_held)
    args = cli_args("--hour", "2026-11-22T12", "--discard-staged", "--held-only")
    with caplog.at_level("ERROR", logger="adpipe.lakehouse"):
        assert cli.cmd_load(args, settings) == cli.EXIT_NOT_HELD == 4
        assert cli.cmd_load(cli_args("--hour", "2026-11-22T12", "--held-only"), settings) == 2  # no action named
    assert [r.getMessage() for r in caplog.records] == [
        "hour 2026-11-22T12 is not held by a failed gate", "--held-only goes with --repair or --discard-staged"]


def cli_args(*argv: str):  # noqa: ANN201
    from adpipe.cli import build_parser

    return build_parser().parse_args(["load", *argv])
