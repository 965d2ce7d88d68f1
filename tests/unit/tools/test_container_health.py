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
