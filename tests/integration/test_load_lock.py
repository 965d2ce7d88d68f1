"""The deployment's load lock in PostgreSQL: loads from two homes (two
workers, two hosts) into the same tables take turns, whoever holds it is
named, a holder killed with SIGKILL frees it at once, and a holder whose
session the server ended (as for a host cut off past its keepalives) finds
it lost before its next write. Real processes
against the session's real PostgreSQL; the loads' own steps are covered by
the load tests, this is the lock they all take."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from adpipe.lakehouse.errors import LoadError
from adpipe.lakehouse.ledger import LOAD_LOCK_KEY, load_lock, lock_still_held
from adpipe.settings import Settings, load_settings

from tests.integration.helpers import BROKER_ENV

# Takes the lock of its environment's deployment, says so, then holds it
# until its stdin closes (or it is killed).
_HOLD = """
import sys
from adpipe.lakehouse.ledger import LOAD_LOCK_KEY, load_lock, lock_still_held
from adpipe.settings import load_settings
with load_lock(load_settings(), wait_s=float(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
print("released", flush=True)
"""


def _env(home: Path, database: str) -> dict[str, str]:
    return {**os.environ, **BROKER_ENV, "ADPIPE_HOME": str(home), "ADPIPE_METASTORE_DATABASE": database}


@contextmanager
def _holder(env: dict[str, str], wait_s: float = 60.0) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", _HOLD, str(wait_s)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _wait_held(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "held", line + proc.stdout.read()


def test_loads_from_two_homes_take_turns_and_a_killed_holder_frees_the_lock(pg: Settings, tmp_path: Path) -> None:
    database = f"adpipe_ms_{uuid.uuid4().hex[:8]}"
    first, second = _env(tmp_path / "host-a", database), _env(tmp_path / "host-b", database)
    with _holder(first) as holding:
        _wait_held(holding)
        # Another home, the same tables: refused after its wait, naming the holder.
        with pytest.raises(LoadError, match=rf"adpipe load, pid {holding.pid} on "):
            with load_lock(load_settings(second), wait_s=2):
                pass
        # Another deployment (its own metastore database) is not held back.
        with load_lock(load_settings(_env(tmp_path / "host-c", f"{database}_other")), wait_s=0):
            pass
        # A second holder waits; the first is SIGKILLed mid-hold: the
        # server ends its session and the waiting one takes the lock.
        with _holder(second) as waiting:
            time.sleep(2)
            assert waiting.poll() is None
            os.killpg(holding.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            _wait_held(waiting)
            assert time.monotonic() - killed_at < 10
            # Held again across homes: the first home's next load waits in turn.
            with pytest.raises(LoadError, match=rf"adpipe load, pid {waiting.pid} on "):
                with load_lock(load_settings(first), wait_s=1):
                    pass
            waiting.stdin.close()
            assert waiting.stdout.read().strip() == "released"
    # Free again, and reentrant within one process.
    with load_lock(load_settings(first), wait_s=0), load_lock(load_settings(first), wait_s=0):
        pass


def test_a_holder_whose_session_the_server_ended_has_lost_the_lock_and_writes_nothing_more(
    pg: Settings, tmp_path: Path
) -> None:
    """The server ends a silent holder's session (its keepalives unanswered:
    a host cut off); another host takes the lock. The old holder, running
    on (a healed host, a resumed process), must not write: its check before
    each write fails."""
    from adpipe import pg as pg_client

    database = f"adpipe_ms_{uuid.uuid4().hex[:8]}"
    mine = load_settings(_env(tmp_path / "host-a", database))
    theirs = load_settings(_env(tmp_path / "host-b", database))
    with load_lock(mine, wait_s=0):
        lock_still_held(mine)  # held: writes go ahead
        admin = pg_client.connect(mine, database)
        try:
            with admin.cursor() as cur:
                cur.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                            "AND objid = (hashtext(%s)::bigint & 4294967295)::oid", (LOAD_LOCK_KEY,))
                (holder,) = [row[0] for row in cur.fetchall()]
                cur.execute("SELECT pg_terminate_backend(%s)", (holder,))
        finally:
            admin.close()
        with load_lock(theirs, wait_s=10):  # another host's load takes it
            with pytest.raises(LoadError, match="lost the load lock: its PostgreSQL session ended"):
                lock_still_held(mine)
    lock_still_held(mine)  # released: nothing held, nothing to check
