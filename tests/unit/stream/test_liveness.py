"""When a live stream job counts as stalled (the supervisor restarts it)."""

from __future__ import annotations

import pytest
from adpipe.settings import Settings, load_settings
from adpipe.stream import liveness

STALL_S = 300.0
NOW = 1_800_000_000.0


@pytest.fixture
def settings(tmp_path) -> Settings:  # noqa: ANN001
    return load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_JOB_ID": "job-a"})


def test_a_job_idle_for_hours_is_not_stalled_by_input_that_has_just_arrived() -> None:
    # Last batch 3 h ago, but Spark reported the query idle 4 s ago.
    assert not liveness.input_stalled(500, NOW, STALL_S, heartbeat_at=NOW - 3 * 3600, polled_at=NOW - 4)


def test_input_waiting_with_no_batch_and_no_poll_for_the_stall_time_is_stalled() -> None:
    assert liveness.input_stalled(500, NOW, STALL_S, heartbeat_at=NOW - 3 * 3600, polled_at=NOW - STALL_S - 1)
    # A job that never polled (an older job, or stuck from its first batch) falls back to its heartbeat.
    assert liveness.input_stalled(1, NOW, STALL_S, heartbeat_at=NOW - STALL_S - 1, polled_at=None)
    assert not liveness.input_stalled(1, NOW, STALL_S, heartbeat_at=NOW - STALL_S + 1, polled_at=None)


def test_no_input_waiting_is_never_stalled_and_a_fresh_start_counts() -> None:
    assert not liveness.input_stalled(0, NOW, STALL_S, heartbeat_at=None, polled_at=None)
    assert not liveness.input_stalled(7, NOW, STALL_S, heartbeat_at=None, polled_at=None, started_at=NOW - 10)
    assert liveness.input_stalled(7, NOW, STALL_S, heartbeat_at=None, polled_at=None, started_at=NOW - STALL_S - 1)


def test_the_poll_mark_is_written_atomically_and_read_back(settings: Settings) -> None:
    assert liveness.polled_at(settings) is None
    liveness.mark_polled(settings, now=NOW)
    assert liveness.polled_at(settings) == NOW
    assert liveness.polled_path(settings).parent == liveness.stream_dir(settings)
    assert not liveness.polled_path(settings).with_suffix(".tmp").exists()
    liveness.polled_path(settings).write_text("not json")
    assert liveness.polled_at(settings) is None
