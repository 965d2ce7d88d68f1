"""Fixtures of the tools' unit tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from adpipe.settings import load_settings
from adpipe.tools import chaos


@pytest.fixture
def chaos_run(tmp_path: Path) -> Iterator[chaos.ChaosRun]:
    """A chaos run on nothing (no cluster reached): its books, parts and
    hands, its clock started; every part it started killed after the test."""
    run = chaos.ChaosRun(load_settings({"ADPIPE_HOME": str(tmp_path)}), chaos.ChaosSpec(events=10))
    run.clock.t0 = time.monotonic()
    yield run
    run.crew.kill(run.loads.load)
