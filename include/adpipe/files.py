"""Small state files written whole or not at all: a reader (another
process, ``adpipe status``) never sees half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: Path, body: dict, indent: int | None = 2) -> Path:
    """Write ``body`` to ``path`` through a temporary file of this process
    (two processes may write the same file: a driver and its standby)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=indent, default=str) + "\n")
    tmp.replace(path)
    return path
