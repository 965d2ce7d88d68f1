"""What every row of ``adpipe status`` is made of (:class:`Component`, its
states) and the small readers the rows share: a process's ``/proc`` files,
its stderr file, times as "12 s ago"."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UP, DEGRADED, DOWN, UNKNOWN = "up", "degraded", "down", "unknown"
# One network call of a probe (a metadata request, pg_isready, an HTTP GET).
CALL_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Component:
    """One row of the report."""

    name: str
    state: str
    address: str = ""
    detail: str = ""
    logs: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)  # the detail's numbers, for --json


def ago(seconds: float) -> str:
    """``12 s ago``, ``4 min ago``, ``3 h ago``, ``2 d ago``."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def utc_text(epoch_s: float) -> str:
    from adpipe.stream.job import iso_utc

    return iso_utc(int(epoch_s * 1000))


def existing(*paths: Path | str | None) -> tuple[str, ...]:
    return tuple(str(p) for p in paths if p and Path(p).exists())


def proc_text(pid: int, name: str) -> list[str]:
    """A ``/proc/<pid>`` file of NUL-separated strings (cmdline, environ)."""
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def stderr_file(pid: int) -> str | None:
    """The file a process writes its stderr to (None: a terminal, a pipe)."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return None
    return target if target.startswith("/") and not target.startswith("/dev/") and Path(target).is_file() else None


def at_text(epoch_s: float | None, now: float) -> str:
    return "" if epoch_s is None else f" at {utc_text(epoch_s)} ({ago(now - epoch_s)})"


def mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def reason(exc: Exception) -> str:
    text = str(exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else exc)
    return text.splitlines()[0] if text else type(exc).__name__
