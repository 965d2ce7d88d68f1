"""Files a load's steps hand over: the staged run a DAG's ``stage`` task
writes and the later steps read, each step's result beside it, and the
runs' manifests. Written whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(path: Path, body: dict) -> Path:
    """Write ``body`` whole or not at all (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def step_file(run_file: Path, step: str) -> Path:
    """Where a step of the run handed over in ``run_file`` writes its result."""
    return run_file.with_name(f"{run_file.stem}.{step}.json")
