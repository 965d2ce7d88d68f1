"""The demo's per-run hour."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path


def test_each_demo_run_in_a_home_gets_an_hour_of_its_own(tmp_path: Path) -> None:
    from adpipe.tools.demo import run_start

    runs = tmp_path / "demo"
    first = run_start(runs)
    assert first == datetime(2026, 11, 22, 12, tzinfo=UTC)
    (runs / "20261123162734").mkdir(parents=True)
    (runs / "notes.txt").write_text("not a run")
    second = run_start(runs)
    (runs / "20261123163240").mkdir()
    third = run_start(runs)
    assert (first - second, second - third) == (timedelta(days=1), timedelta(days=1))  # back in time
    assert len({first.replace(minute=0), second.replace(minute=0), third.replace(minute=0)}) == 3
