"""Every verb describes itself; bad input gets a clear error, not a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from adpipe.cli import build_parser

VERBS = ["kafka", "pg", "jars", "produce", "stream", "load", "validate", "maintain", "budget", "verify", "demo"]


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


STORY_LOGGING = """
import logging, sys
from pathlib import Path
from adpipe.cli import _setup_logging
_setup_logging(sys.argv[1] == "-v", Path(sys.argv[2]))
logging.getLogger("adpipe.tools.demo").info("an info line")
logging.getLogger("adpipe.faults").warning("a warning line")
logging.getLogger("librdkafka").warning("a library's warning line")
logging.getLogger("librdkafka").error("a library's error line")
"""


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_a_verb_that_tells_a_story_logs_to_its_file_and_warns_on_the_console(verbose: bool, tmp_path) -> None:
    log_file = tmp_path / "logs" / "demo.log"
    proc = subprocess.run(
        [sys.executable, "-c", STORY_LOGGING, "-v" if verbose else "-", str(log_file)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "WARNING adpipe.faults: a warning line" in proc.stderr  # always seen
    assert "ERROR librdkafka: a library's error line" in proc.stderr
    if verbose:  # -v: everything on the console, as other verbs do
        assert "INFO adpipe.tools.demo: an info line" in proc.stderr
        assert "WARNING librdkafka: a library's warning line" in proc.stderr
        assert not log_file.exists()
    else:
        assert "an info line" not in proc.stderr and "a library's warning line" not in proc.stderr
        assert "WARNING librdkafka: a library's warning line" in log_file.read_text()
        assert "INFO adpipe.tools.demo: an info line" in log_file.read_text()
        assert "a warning line" in log_file.read_text()


def test_connect_status_asks_a_port_and_starts_no_postgresql(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]  # noqa: ANN001
) -> None:
    from adpipe.cli import main
    from adpipe.local import postgres

    started: list[str] = []
    monkeypatch.setattr(postgres, "serve_metastore", lambda settings: started.append(str(settings.home)))
    monkeypatch.setenv("ADPIPE_HOME", str(tmp_path))
    # A port nothing listens on: the test's own socket, closed again.
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    monkeypatch.setenv("ADPIPE_SPARK_CONNECT", f"sc://127.0.0.1:{free}")
    assert main(["connect", "status"]) == 3
    assert f"none of sc://127.0.0.1:{free} answers" in capsys.readouterr().out
    assert started == []
    # Something listening there answers.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("ADPIPE_SPARK_CONNECT", f"sc://127.0.0.1:{server.getsockname()[1]}")
        assert main(["connect", "status"]) == 0
    assert started == []
