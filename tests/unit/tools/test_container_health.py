"""adpipe.tools.container_health: the stream container is healthy while a
driver holds its checkpoint, and only then."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from adpipe.settings import load_settings
from adpipe.stream.checkpoint_lock import checkpoint_lock
from adpipe.tools.container_health import budget_health, main, stream_health


def test_stream_is_healthy_while_its_checkpoint_is_held(tmp_path: Path) -> None:
    settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_JOB_ID": "health-test"})
    assert stream_health(settings)[0] is False  # no lock file yet
    with checkpoint_lock(settings):
        healthy, why = stream_health(settings)
        assert healthy and "holds the checkpoint" in why
    healthy, why = stream_health(settings)
    assert not healthy and "no driver" in why


def test_a_driver_in_another_process_counts(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    env = {"ADPIPE_HOME": str(tmp_path), "ADPIPE_JOB_ID": "health-test"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    holder = subprocess.Popen(  # holds the lock as a driver would, until killed
        [
            sys.executable,
            "-c",
            "import signal; from adpipe.settings import load_settings; "
            "from adpipe.stream.checkpoint_lock import checkpoint_lock\n"
            "with checkpoint_lock(load_settings()):\n    print('held', flush=True); signal.pause()",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert main(["stream"]) == 0
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while main(["stream"]) != 1:  # the kernel drops the lock with the process
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_budget_is_unhealthy_when_the_broker_does_not_answer() -> None:
    settings = load_settings({"ADPIPE_KAFKA_BOOTSTRAP": "127.0.0.1:1"})  # nothing listens on port 1
    started = time.monotonic()
    healthy, why = budget_health(settings, timeout_s=2.0)
    assert not healthy and "adpipe-budget" in why
    assert time.monotonic() - started < 10  # within the healthcheck's own timeout


def test_the_standby_is_healthy_while_it_waits_for_the_checkpoint_or_holds_it(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from adpipe.stream.checkpoint_lock import waiters
    from adpipe.tools.container_health import standby_health

    env = {"ADPIPE_HOME": str(tmp_path), "ADPIPE_JOB_ID": "health-test"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(env)
    assert standby_health(settings)[0] is False  # neither waiting nor holding
    with checkpoint_lock(settings):  # the active driver
        standby = subprocess.Popen(
            [sys.executable, "-c", "from adpipe.settings import load_settings; "
             "from adpipe.stream.checkpoint_lock import checkpoint_lock\n"
             "with checkpoint_lock(load_settings(), standby=True):\n    print('took over', flush=True); input()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        try:
            deadline = time.monotonic() + 10
            while not waiters(settings):
                assert time.monotonic() < deadline, "the standby never waited"
                time.sleep(0.05)
            assert f"standby pid {standby.pid} waits" in standby_health(settings)[1]
        except BaseException:
            standby.kill()
            raise
    try:
        assert standby.stdout is not None and standby.stdout.readline().strip() == "took over"
        healthy, why = standby_health(settings)
        assert healthy and f"pid {standby.pid} holds the checkpoint" in why
    finally:
        standby.kill()
        standby.wait()
