"""The load lock with Derby (one JVM, one host: a ``flock`` under
``ADPIPE_HOME``): taken once per process (``adpipe load`` takes it before
its Spark session, its steps again), exclusive between processes. The
PostgreSQL lock every host shares: tests/integration/test_load_lock.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from adpipe.lakehouse.ledger import load_lock
from adpipe.settings import load_settings

_PROBE = """
import fcntl, sys
with open(sys.argv[1], "a+") as f:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(1)
"""


def _free_for_another_process(path: Path) -> bool:
    return subprocess.run([sys.executable, "-c", _PROBE, str(path)], check=False, timeout=30).returncode == 0


def test_the_load_lock_is_reentrant_in_a_process_and_exclusive_between_processes(tmp_path: Path) -> None:
    settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_METASTORE": "derby"})
    path = tmp_path / "load.lock"
    with load_lock(settings):
        with load_lock(settings, wait_s=0):  # the same process: taken again at once
            assert not _free_for_another_process(path)
        assert not _free_for_another_process(path)  # the inner exit kept it
    assert _free_for_another_process(path)
