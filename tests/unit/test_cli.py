"""Every verb describes itself; bad input gets a clear error, not a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from adpipe.cli import build_parser

VERBS = [
    "kafka", "pg", "jars", "produce", "stream", "load", "validate", "maintain", "budget", "verify", "bench", "demo"
]


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([verb, "--help"])
    assert exit_info.value.code == 0
    assert f"adpipe {verb}" in capsys.readouterr().out


def test_bad_settings_are_a_clear_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "adpipe", "kafka", "status"],
        env={"ADPIPE_KAFKA_BOOTSTRAP": "no-port-here", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "ADPIPE_KAFKA_BOOTSTRAP='no-port-here' must be host:port" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_produce_rejects_a_naive_start() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "adpipe", "produce", "--events", "1", "--start", "2026-11-22T12:00:00"],
        env={"ADPIPE_KAFKA_BOOTSTRAP": "127.0.0.1:1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "needs a zone" in proc.stderr
    assert "Traceback" not in proc.stderr
