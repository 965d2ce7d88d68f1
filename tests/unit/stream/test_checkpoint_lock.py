"""One driver per checkpoint (adpipe.stream.checkpoint_lock): a second
holder is refused at once with the first one's pid, a SIGKILLed holder
leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from adpipe.settings import load_settings
from adpipe.stream.checkpoint_lock import CheckpointInUseError, checkpoint_lock, lock_path


def _settings(tmp_path: Path, uri: str = ""):  # noqa: ANN202
    env = {"ADPIPE_HOME": str(tmp_path / "home"), "ADPIPE_JOB_ID": "region-x"}
    if uri:
        env["ADPIPE_CHECKPOINT_URI"] = uri
    return load_settings(env)


def test_a_local_checkpoint_is_locked_beside_it_and_a_remote_one_under_the_home(tmp_path: Path) -> None:
    assert lock_path(_settings(tmp_path, f"file://{tmp_path}/ck")) == tmp_path / "ck" / "region-x.lock"
    remote = _settings(tmp_path, "s3a://bucket/checkpoints")
    assert lock_path(remote) == tmp_path / "home" / "stream" / "region-x" / "checkpoint.lock"


def test_a_second_driver_is_refused_while_the_first_holds_it(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    with checkpoint_lock(settings):
        with pytest.raises(CheckpointInUseError, match=f"pid {os.getpid()}"), checkpoint_lock(settings):
            pass
    with checkpoint_lock(settings):  # released at the end of the block
        pass


def test_a_sigkilled_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from adpipe.settings import load_settings\n"
            "from adpipe.stream.checkpoint_lock import checkpoint_lock\n"
            f"with checkpoint_lock(load_settings({{'ADPIPE_HOME': {str(tmp_path / 'home')!r}, "
            "'ADPIPE_JOB_ID': 'region-x'})):\n"
            "    print('locked', flush=True)\n"
            "    sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(CheckpointInUseError, match=f"pid {holder.pid}"), checkpoint_lock(settings):
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        deadline = time.monotonic() + 5
        while True:
            try:
                with checkpoint_lock(settings):
                    break
            except CheckpointInUseError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        holder.kill()
        holder.wait()


def test_the_holder_is_read_from_the_kernels_lock_table_without_taking_the_lock(tmp_path: Path) -> None:
    from adpipe.stream.checkpoint_lock import holder

    settings = _settings(tmp_path)
    assert holder(settings) is None  # no lock file yet
    with checkpoint_lock(settings):
        assert holder(settings) == os.getpid()
        assert holder(settings) == os.getpid()  # reading it twice took nothing
    assert holder(settings) is None


def test_flock_holder_skips_other_files_posix_locks_and_waiting_requests() -> None:
    from adpipe.stream.checkpoint_lock import flock_holder

    table = (
        "1: POSIX  ADVISORY  WRITE 19924 fe:00:398607 0 EOF\n"
        "2: FLOCK  ADVISORY  WRITE 23077 fe:00:9986091 0 EOF\n"
        "2: -> FLOCK  ADVISORY  WRITE 31000 fe:00:10944805 0 EOF\n"
        "3: FLOCK  ADVISORY  WRITE 23643 fe:00:10944805 0 EOF\n"
    )
    assert flock_holder(table, "fe:00:10944805") == 23643
    assert flock_holder(table, "fe:00:398607") is None  # a POSIX lock is not the driver's flock
    assert flock_holder(table, "fe:01:10944805") is None


def test_flock_waiters_lists_only_the_waiting_requests_of_that_file() -> None:
    from adpipe.stream.checkpoint_lock import flock_waiters

    table = (
        "2: FLOCK  ADVISORY  WRITE 23077 fe:00:10944805 0 EOF\n"
        "2: -> FLOCK  ADVISORY  WRITE 31000 fe:00:10944805 0 EOF\n"
        "2: -> FLOCK  ADVISORY  WRITE 31001 fe:00:9986091 0 EOF\n"
        "2: -> POSIX  ADVISORY  WRITE 31002 fe:00:10944805 0 EOF\n"
        "2: -> FLOCK  ADVISORY  WRITE 31003 fe:00:10944805 0 EOF\n"
    )
    assert flock_waiters(table, "fe:00:10944805") == [31000, 31003]
    assert flock_waiters(table, "fe:00:398607") == []


def test_a_standby_waits_in_the_kernels_table_and_takes_the_lock_when_the_holder_is_sigkilled(tmp_path: Path) -> None:
    from adpipe.stream.checkpoint_lock import holder, waiters

    settings = _settings(tmp_path)
    env = {**os.environ, "ADPIPE_HOME": str(tmp_path / "home"), "ADPIPE_JOB_ID": "region-x"}
    code = (
        "import sys\n"
        "from adpipe.settings import load_settings\n"
        "from adpipe.stream.checkpoint_lock import checkpoint_lock\n"
        "with checkpoint_lock(load_settings(), standby=len(sys.argv) > 1):\n"
        "    print('locked', flush=True)\n"
        "    sys.stdin.read()\n"
    )
    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=env)

    active = start()
    procs = [active]
    try:
        assert active.stdout.readline().strip() == "locked"
        standby = start("standby")
        procs.append(standby)
        deadline = time.monotonic() + 30
        while waiters(settings) != [standby.pid]:
            assert time.monotonic() < deadline, "the standby never waited for the lock"
            time.sleep(0.05)
        assert holder(settings) == active.pid
        active.send_signal(signal.SIGKILL)
        assert standby.stdout.readline().strip() == "locked"  # handed over by the kernel
        assert holder(settings) == standby.pid and waiters(settings) == []
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


_HOLD = (
    "import sys\n"
    "from adpipe.settings import load_settings\n"
    "from adpipe.stream.checkpoint_lock import checkpoint_lock\n"
    "with checkpoint_lock(load_settings(), standby=len(sys.argv) > 1) as took_over:\n"
    "    print('locked', took_over, flush=True)\n"
    "    sys.stdin.read()\n"
)


def _lease_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ADPIPE_HOME": str(tmp_path / "home"), "ADPIPE_JOB_ID": "region-x",
            "ADPIPE_STREAM_LEASE_S": "2"}


def _start_holder(env: dict[str, str], *args: str) -> subprocess.Popen:
    """A process that holds the checkpoint (``standby``: waits for it) and prints ``locked <why>``."""
    return subprocess.Popen([sys.executable, "-c", _HOLD, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)


def test_a_standby_takes_over_from_a_paused_holder_whose_lease_expired_and_the_holder_resumed_exits_fenced(
    tmp_path: Path,
) -> None:
    from adpipe.stream.checkpoint_lock import EXIT_FENCED, holder, read_lease

    env = _lease_env(tmp_path)
    settings = load_settings(env)

    def start(*args: str) -> subprocess.Popen:
        return _start_holder(env, *args)

    active = start()
    standby = None
    try:
        assert active.stdout.readline().strip() == "locked None"
        first = read_lease(settings)
        assert first is not None and first.pid == active.pid and first.epoch == 1
        time.sleep(1.2)
        renewed = read_lease(settings)
        assert renewed is not None and renewed.at > first.at  # renewed twice a second
        standby = start("standby")
        time.sleep(3)  # waits: the active driver renews its lease
        assert standby.poll() is None and read_lease(settings).pid == active.pid
        active.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        line = standby.stdout.readline().strip()
        assert line.startswith("locked the active driver (pid ") and "has not renewed its lease" in line, line
        assert 2 - 0.5 <= time.monotonic() - stopped_at < 6  # the lease age, less the renewal interval
        taken = read_lease(settings)
        assert taken is not None and taken.pid == standby.pid and taken.epoch == 2
        assert holder(settings) == active.pid  # the paused one still holds the flock...
        active.send_signal(signal.SIGCONT)
        assert active.wait(timeout=10) == EXIT_FENCED  # ...until it reads the higher epoch and stops
        deadline = time.monotonic() + 5
        while holder(settings) != standby.pid:  # then the standby's waiting flock gets it
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1)
        assert standby.poll() is None and read_lease(settings).pid == standby.pid
    finally:
        for proc in (active, standby):
            if proc is not None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


def test_a_standby_given_the_lock_waits_while_a_driver_that_took_over_through_the_lease_runs(tmp_path: Path) -> None:
    """A driver that took over through the lease runs without the lock until
    the paused holder ends; when the lock comes to a second standby instead,
    that one waits for the running driver to end (or stop renewing)."""
    import threading

    from adpipe.files import write_json
    from adpipe.stream.checkpoint_lock import lease_path, waiters

    env = _lease_env(tmp_path)
    settings = load_settings(env)

    def start(*args: str) -> subprocess.Popen:
        return _start_holder(env, *args)

    holder_proc = start()
    runner = subprocess.Popen(["sleep", "60"])  # the driver that took over through the lease
    renewing = threading.Event()
    renewing.set()

    def renew() -> None:
        while renewing.is_set():
            write_json(lease_path(settings), {"pid": runner.pid, "host": os.uname().nodename, "epoch": 9,
                                              "at": time.time()})
            time.sleep(0.2)

    standby = None
    try:
        assert holder_proc.stdout.readline().strip() == "locked None"
        renewer = threading.Thread(target=renew, daemon=True)
        renewer.start()
        standby = start("standby")
        deadline = time.monotonic() + 30
        while waiters(settings) != [standby.pid]:
            assert time.monotonic() < deadline, "the standby never waited for the lock"
            time.sleep(0.05)
        holder_proc.send_signal(signal.SIGKILL)  # the paused holder ends: the lock comes to this standby
        holder_proc.wait()
        time.sleep(2.5)
        assert standby.poll() is None and waiters(settings) == []  # it has the lock, and still waits
        runner.kill()  # the running driver ends (its lease still fresh)
        runner.wait()
        started = time.monotonic()
        line = standby.stdout.readline().strip()
        assert line == f"locked the active driver (pid {runner.pid} on {os.uname().nodename}) ended or stopped " \
                       "renewing its lease", line
        assert time.monotonic() - started < 2
    finally:
        renewing.clear()
        for proc in (holder_proc, standby, runner):
            if proc is not None:
                proc.kill()
                proc.wait()
