"""The warm load driver's protocol (adpipe.lakehouse.warm) with a real
driver process whose verbs are stand-ins (no Spark: what a verb does in it
is the integration tests' business): output and exit status come back, a
request's ADPIPE_* environment is its own, one driver per home, a session
of other settings is refused, SIGTERM waits for the running request, and a
driver SIGKILLed mid-request gives the client 137."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from adpipe import cli
from adpipe.lakehouse import warm
from adpipe.settings import Settings, load_settings

# A driver whose "verbs" are: echo TEXT, env NAME, exit N, sleep S, die (SIGKILL itself).
FAKE_DRIVER = textwrap.dedent(
    """
    import logging, os, signal, sys, time
    from adpipe.lakehouse import warm
    from adpipe.settings import load_settings

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("adpipe.fake")

    def run(argv):
        verb, *rest = argv
        if verb == "echo":
            print(" ".join(rest))
            log.warning("logged %s", rest[0])
            return 0
        if verb == "env":
            print(os.environ.get(rest[0], "<unset>"))
            return 0
        if verb == "exit":
            raise SystemExit(int(rest[0]))
        if verb == "sleep":
            time.sleep(float(rest[0]))
            print("slept")
            return 0
        if verb == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        raise ValueError(verb)

    sys.exit(warm.serve(load_settings(), run, warm_up=lambda settings: None))
    """
)


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "ADPIPE_HOME": str(home), "ADPIPE_LOAD_WARM": "auto", **extra}


def _start(home: Path, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", FAKE_DRIVER], env=_env(home, **extra),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _ready(settings: Settings, proc: subprocess.Popen, timeout: float = 60) -> warm.Driver:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        driver = warm.ping(settings)
        if driver is not None:
            return driver
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    raise AssertionError("the fake driver never became ready")


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[tuple[Settings, subprocess.Popen]]:
    settings = load_settings(_env(tmp_path))
    proc = _start(tmp_path, ADPIPE_SECRET_OF_THE_DRIVER="driver's")
    _ready(settings, proc)
    yield settings, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _delegate(settings: Settings, *argv: str, env: dict[str, str] | None = None) -> tuple[int | None, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = warm.delegate(settings, list(argv), env=env or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_a_request_gets_its_output_log_and_exit_status_back(driver: tuple[Settings, subprocess.Popen]) -> None:
    settings, proc = driver
    info = json.loads(warm.info_file(settings).read_text())
    assert info["pid"] == proc.pid and oct(warm.info_file(settings).stat().st_mode & 0o777) == "0o600"
    assert _delegate(settings, "echo", "hello", "there")[:2] == (0, "hello there\n")
    assert "WARNING adpipe.fake: logged hello" in _delegate(settings, "echo", "hello")[2]
    assert _delegate(settings, "exit", "3")[0] == 3
    assert _delegate(settings, "no-such-verb")[0] == 1  # an exception is exit 1, and the driver lives on
    assert _delegate(settings, "echo", "still")[:2] == (0, "still\n")


def test_a_request_runs_with_its_own_adpipe_environment_only(driver: tuple[Settings, subprocess.Popen]) -> None:
    settings, _ = driver
    assert _delegate(settings, "env", "ADPIPE_X", env={"ADPIPE_X": "mine"})[1] == "mine\n"
    # Not the previous request's, nor the driver's own ADPIPE_ variables; its other variables stay.
    assert _delegate(settings, "env", "ADPIPE_X")[1] == "<unset>\n"
    assert _delegate(settings, "env", "ADPIPE_SECRET_OF_THE_DRIVER")[1] == "<unset>\n"
    assert _delegate(settings, "env", "PATH")[1] == os.environ["PATH"] + "\n"


def test_one_driver_per_home_and_a_session_of_other_settings_is_refused(
    driver: tuple[Settings, subprocess.Popen], tmp_path: Path
) -> None:
    settings, proc = driver
    second = _start(tmp_path)
    assert second.wait(timeout=60) == warm.EXIT_ANOTHER_DRIVER, second.stdout.read()
    assert warm.ping(settings).pid == proc.pid
    # Another warehouse: another session, so the client runs the verb itself.
    other = load_settings(_env(tmp_path, ADPIPE_WAREHOUSE_URI=(tmp_path / "elsewhere").as_uri()))
    assert _delegate(other, "echo", "x") == (None, "", "")


def test_sigterm_lets_the_running_request_finish_then_the_driver_is_gone(
    driver: tuple[Settings, subprocess.Popen],
) -> None:
    settings, proc = driver
    client = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", "import sys; from adpipe.lakehouse import warm; from adpipe.settings import "
         "load_settings; sys.exit(warm.delegate(load_settings(), ['sleep', '2'], env={}))"],
        env=_env(Path(settings.home)), stdout=subprocess.PIPE, text=True,
    )
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == 0 and client.stdout.read().endswith("slept\n")
    assert proc.wait(timeout=30) == 0
    assert not warm.info_file(settings).exists() and warm.ping(settings) is None
    assert _delegate(settings, "echo", "x")[0] is None  # none runs: the client runs it


def test_a_driver_killed_mid_request_gives_the_client_137(driver: tuple[Settings, subprocess.Popen]) -> None:
    settings, proc = driver
    code, _, _ = _delegate(settings, "die")
    assert code == warm.EXIT_DRIVER_DIED
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert warm.ping(settings) is None  # its file stays, nobody answers it
    assert warm.stop_driver(settings) is None and not warm.info_file(settings).exists()


def test_the_cli_hands_a_warm_verb_to_the_driver_unless_told_off(
    driver: tuple[Settings, subprocess.Popen], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings, _ = driver
    for name, value in _env(Path(settings.home)).items():
        monkeypatch.setenv(name, value)
    # The fake's run does not know "validate": exit 1 from the driver.
    with caplog.at_level("INFO", logger="adpipe.lakehouse.warm"):
        assert cli.main(["validate", "--hour", "2026-11-22T12"]) == 1
    assert "in the warm load driver" in caplog.text
    assert "ValueError: validate" in capsys.readouterr().err  # the driver's log line of it, on this stderr
    # verify without --hour reads no table: never delegated.
    assert cli._in_warm_driver(cli.build_parser().parse_args(["verify"]), ["verify"], settings) is None
    monkeypatch.setenv("ADPIPE_LOAD_WARM", "off")
    off = load_settings()
    args = cli.build_parser().parse_args(["validate", "--hour", "2026-11-22T12"])
    assert cli._in_warm_driver(args, ["validate", "--hour", "2026-11-22T12"], off) is None


def test_status_shows_the_driver_up_then_gone(driver: tuple[Settings, subprocess.Popen]) -> None:
    from adpipe.tools import status

    settings, proc = driver
    row = status.load_component(settings)
    assert (row.state, row.facts["pid"]) == ("up", proc.pid)
    assert row.address == f"127.0.0.1:{warm.read_driver(settings).port}"
    proc.kill()
    proc.wait()
    gone = status.load_component(settings)
    assert gone.state == "down" and f"pid {proc.pid} is gone" in gone.detail
    warm.info_file(settings).unlink()
    assert "no warm load driver" in status.load_component(settings).detail


def test_a_driver_gone_before_it_took_the_request_lets_the_client_run_it(tmp_path: Path) -> None:
    """A driver that ends idle between the client's ping and its request:
    nothing ran there, so the client runs the command itself (None), never
    reports a failure (137)."""
    import socket
    import threading

    settings = load_settings(_env(tmp_path))
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_the_ping_then_hang_up() -> None:
        for ping_only in (True, False):
            conn, _ = listener.accept()
            with conn:
                conn.makefile().readline()
                if ping_only:
                    conn.sendall((json.dumps({"pong": os.getpid()}) + "\n").encode())

    threading.Thread(target=answer_the_ping_then_hang_up, daemon=True).start()
    fingerprint = warm.session_fingerprint(settings)
    warm.info_file(settings).parent.mkdir(parents=True)
    warm.info_file(settings).write_text(json.dumps(
        {"pid": os.getpid(), "port": listener.getsockname()[1], "token": "t", "fingerprint": fingerprint,
         "started_at": "now"}))
    with listener:
        assert _delegate(settings, "echo", "x") == (None, "", "")
