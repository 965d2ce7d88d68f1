"""The load DAG's run of an hour past Kafka's retention (nothing of it ever
loaded): its checks and its publication end skipped, with the report as the
reason, never failed; a run whose audit passed other hours still publishes
them (adpipe.orchestration.load_tasks.past_retention_skip)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe.lakehouse.load import step_file

HOUR = datetime(2026, 9, 14, 5, tzinfo=UTC)
LINE = "hour 2026-09-14T05 is past Kafka's retention: ... Kafka keeps eu/ad-events[0] from offset 20 (empty)"


def _audited(tmp_path: Path, passed: list[str], past: dict[str, str]) -> Path:
    """A run file whose audit step wrote this summary beside it."""
    path = tmp_path / "run.json"
    path.write_text("{}")
    step_file(path, "audit").write_text(json.dumps({"success": True, "describe": "", "passed": passed,
                                                     "past_retention": past}))
    return path


def test_an_hour_past_retention_with_nothing_to_publish_skips_with_its_line(tmp_path: Path) -> None:
    from adpipe.orchestration.load_tasks import past_retention_skip

    path = _audited(tmp_path, [], {"2026-09-14T05": LINE})
    assert past_retention_skip(HOUR, path) == f"{LINE}: nothing to publish"


def test_nothing_is_skipped_without_the_audit_for_another_hour_or_with_hours_to_publish(tmp_path: Path) -> None:
    from adpipe.orchestration.load_tasks import past_retention_skip

    bare = tmp_path / "bare.json"
    assert past_retention_skip(HOUR, bare) is None  # no audit yet: the step runs as ever
    other = tmp_path / "other"
    other.mkdir()
    assert past_retention_skip(HOUR, _audited(other, [], {"2026-09-14T04": LINE})) is None
    assert past_retention_skip(HOUR, _audited(tmp_path, ["2026-09-14T03"], {"2026-09-14T05": LINE})) is None


def test_validate_and_publish_raise_airflows_skip_verify_reads_its_exit_status(tmp_path: Path) -> None:
    from adpipe.orchestration import load_tasks
    from adpipe.tools import cli
    from airflow.sdk.exceptions import AirflowSkipException

    path = _audited(tmp_path, [], {"2026-09-14T05": LINE})
    with pytest.raises(AirflowSkipException, match="past Kafka's retention"):
        load_tasks._skip_after("validate", HOUR, path)
    with pytest.raises(AirflowSkipException, match="nothing to publish"):
        load_tasks._skip_before("publish", HOUR, path)
    load_tasks._skip_before("validate", HOUR, path)  # validate runs, then skips
    load_tasks._skip_after("publish", HOUR, path)
    assert load_tasks.EXIT_PAST_RETENTION == cli.EXIT_PAST_RETENTION == 5


def test_publish_runs_when_a_check_was_skipped_not_when_one_failed(dagbag) -> None:  # noqa: ANN001
    dag = dagbag.dags["ad_union_and_load"]
    assert dag.get_task("publish").trigger_rule == "none_failed"
