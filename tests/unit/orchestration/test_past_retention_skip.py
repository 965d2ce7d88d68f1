"""The load DAG's run of an hour past Kafka's retention (nothing of it ever
loaded): its checks and its publication end skipped, with the report as the
reason, never failed (adpipe.orchestration.load_tasks.past_retention_skip)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

HOUR = datetime(2026, 9, 14, 5, tzinfo=UTC)
LINE = "hour 2026-09-14T05 is past Kafka's retention: ... Kafka keeps eu/ad-events[0] from offset 20 (empty)"


def _audit(passed: list[str], past: dict[str, str]) -> dict:
    """The audit step's result (its XCom) with these hours passed and past retention."""
    return {"success": True, "describe": "", "passed": passed, "past_retention": past}


def test_an_hour_past_retention_with_nothing_to_publish_skips_with_its_line() -> None:
    from adpipe.orchestration.load_tasks import past_retention_skip

    assert past_retention_skip(HOUR, _audit([], {"2026-09-14T05": LINE})) == f"{LINE}: nothing to publish"


def test_nothing_is_skipped_without_the_audit_for_another_hour_or_with_hours_to_publish() -> None:
    from adpipe.orchestration.load_tasks import past_retention_skip

    assert past_retention_skip(HOUR, None) is None  # no audit: the step runs as ever
    assert past_retention_skip(HOUR, _audit([], {"2026-09-14T04": LINE})) is None
    assert past_retention_skip(HOUR, _audit(["2026-09-14T03"], {"2026-09-14T05": LINE})) is None


def test_validate_raises_airflows_skip_verify_reads_its_exit_status() -> None:
    from adpipe.orchestration import load_tasks
    from adpipe.tools import cli
    from airflow.sdk.exceptions import AirflowSkipException

    audit = _audit([], {"2026-09-14T05": LINE})
    with pytest.raises(AirflowSkipException, match="past Kafka's retention"):
        load_tasks._skip_after("validate", HOUR, audit)
    assert load_tasks._skip_after("publish", HOUR, audit) is audit  # only validate skips on it
    assert load_tasks.EXIT_PAST_RETENTION == cli.EXIT_PAST_RETENTION == 5


def test_publish_is_skipped_after_a_skipped_check_and_fails_after_a_failed_one(dagbag) -> None:  # noqa: ANN001
    dag = dagbag.dags["ad_union_and_load"]
    assert dag.get_task("publish").trigger_rule == "all_success"
