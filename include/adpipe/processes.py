"""Starting a process that outlives its caller's signals, with its log.

Every long-lived process adpipe starts (a Kafka node, a Spark master or
worker, the stream job from Airflow or the demo, the parts of a chaos run,
the benchmark's engines) starts the same way: in a session of its own (a
Ctrl-C or a task's end in the caller's process group does not reach it,
and its own group can be signalled whole, as when its machine dies), stdin
from /dev/null, stdout and stderr together in one log file."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def start_detached(
    command: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    append: bool = True,
) -> subprocess.Popen:
    """Start ``command`` detached (see the module doc), its output appended
    to ``log_path`` (or written anew with ``append=False``). ``env``: the
    whole environment (default: the caller's)."""
    with log_path.open("ab" if append else "wb") as out:
        return subprocess.Popen(  # noqa: S603 - commands adpipe builds, never a shell
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a child its parent has not
    reaped yet still has a /proc entry)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
