"""Helpers of the integration tests that drive Union & Load as real
processes (``adpipe load``, ``adpipe verify --hour``, the tables dumped by
``tables_dump.py``): one place, for every test module that needs them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

DUMP = Path(__file__).with_name("tables_dump.py")
# A script prefix: a Spark session on this home's metastore, as ``s``.
SPARK_SQL = (
    "from adpipe.lakehouse.metastore import metastore_session\n"
    "from adpipe.settings import load_settings\n"
    "s = metastore_session(load_settings(), 'test-sql')\n"
)


def run(env: dict[str, str], *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``env``; its whole output is kept under
    ``$ADPIPE_HOME/test-logs`` for a post-mortem (an assertion shows its end only)."""
    done = subprocess.run(  # noqa: S603
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True
    )
    logs = Path(env["ADPIPE_HOME"]) / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}.log").write_text(
        " ".join(args) + "\n" + done.stdout + done.stderr
    )
    return done


def load(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return run(env, "-m", "adpipe", "load", *args)


def ok(proc: subprocess.CompletedProcess) -> str:
    """The output of a process that must have exited 0 (else its adpipe lines and tail)."""
    out = proc.stdout + proc.stderr
    ours = [line for line in out.splitlines() if " adpipe" in line or "Error" in line or "Exception" in line]
    assert proc.returncode == 0, f"exit {proc.returncode}:\n" + "\n".join(ours[-40:]) + f"\n--- tail ---\n{out[-3000:]}"
    return out


def dump(env: dict[str, str], hour: str | None = None) -> dict:
    """The tables, staging and ledger as ``tables_dump.py`` prints them."""
    out = run(env, str(DUMP), *([hour] if hour else []))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def verify_hour(env: dict[str, str], hour: str, tmp: Path) -> dict:
    """``adpipe verify --hour``'s tables section."""
    report = tmp / f"verify-{hour}-{uuid.uuid4().hex[:6]}.json"
    proc = run(env, "-m", "adpipe", "verify", "--hour", hour, "--report", str(report))
    assert report.exists(), (proc.stdout + proc.stderr)[-4000:]
    return json.loads(report.read_text())["tables"]


def ids(rows: list[dict], key: str = "event_id") -> list[str]:
    return [r[key] for r in rows]


def hours(rows: list[dict]) -> set[str]:
    return {r["event_hour"][:13] for r in rows}
