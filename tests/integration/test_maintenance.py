"""``adpipe maintain`` on real Delta tables in the Hive metastore (the
session's PostgreSQL): OPTIMIZE compacts a partition's small files, VACUUM
deletes only files older than ADPIPE_VACUUM_RETENTION_H, rows and time
travel stay. The retention is 240 hours here, not the default 168, with
unreferenced files 9 and 11 days old: only the 11-day one may go, so the
test fails if the setting does not reach VACUUM (Delta 4 ignores the RETAIN
clause; the table property decides).

One Spark application of the test's own (tests/integration/maintenance_probe.py)
writes the probe table before and reads it after the ``adpipe maintain``
process, staying up in between."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

from adpipe.lakehouse import tables as T
from adpipe.settings import Settings

from tests.integration.helpers import BROKER_ENV, reaped

log = logging.getLogger(__name__)

PROBE = Path(__file__).with_name("maintenance_probe.py")
DAY_S = 86_400


def _json_line(proc: subprocess.Popen, log: Path) -> dict:
    line = proc.stdout.readline()
    assert line, f"the probe ended (exit {proc.poll()}):\n{log.read_text()[-3000:]}"
    return json.loads(line)


def _orphan(folder: Path, name: str, age_s: float) -> Path:
    """A file in the table's folder that no Delta commit added, last
    modified ``age_s`` ago (what a failed write leaves behind)."""
    path = folder / name
    path.write_bytes(b"not referenced by any version")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_maintain_compacts_vacuums_past_the_retention_and_keeps_rows(pg: Settings, tmp_path: Path) -> None:
    name = uuid.uuid4().hex[:8]
    probe_table, missing = f"{T.DATABASE}.maintenance_probe_{name}", f"{T.DATABASE}.no_such_table_{name}"
    env = {**os.environ, **BROKER_ENV, "ADPIPE_SPARK_DRIVER_MEMORY": "1g", "ADPIPE_VACUUM_RETENTION_H": "240"}
    probe_log = tmp_path / "probe.log"
    with probe_log.open("w") as probe_stderr:
        probe = subprocess.Popen(
            [sys.executable, str(PROBE), probe_table, T.RAW],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=probe_stderr, text=True,
            start_new_session=True,
        )
    with reaped(probe):
        before = _json_line(probe, probe_log)
        assert [r[0] for r in before["rows"]] == [f"p{i}" for i in range(6)]
        folder = Path(urlparse(before["location"]).path)
        old = _orphan(folder, "orphan-11-days-old.parquet", 11 * DAY_S)
        recent = _orphan(folder, "orphan-9-days-old.parquet", 9 * DAY_S)

        started = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "adpipe", "maintain", "--tables", probe_table, T.RAW, missing],
            env=env, capture_output=True, text=True, timeout=600, check=False,
        )
        maintain_s = time.monotonic() - started
        assert run.returncode == 0, f"exit {run.returncode}:\n{run.stderr[-4000:]}"
        # One line per table (Delta's VACUUM prints lines of its own).
        lines = [line for line in run.stdout.splitlines() if line.startswith(f"{T.DATABASE}.")]
        assert len(lines) == 3, run.stdout
        # Three small files of one partition became one; of the two orphans,
        # only the one older than 240 hours was deleted.
        assert lines[0].startswith(f"{probe_table}: OPTIMIZE removed 3 files and added 1; VACUUM deleted 1 files; ")
        assert lines[1].startswith(f"{T.RAW}: OPTIMIZE removed ")
        assert lines[2] == f"{missing}: skipped, no such table yet"
        assert not old.exists()
        assert recent.exists()

        probe.stdin.write("\n")
        probe.stdin.flush()
        after = _json_line(probe, probe_log)
        probe.wait(timeout=120)

    assert after["rows"] == before["rows"]
    # The version before OPTIMIZE still reads: VACUUM kept the files it replaced.
    assert after["rows_then"] == before["rows"]
    new = [entry for entry in after["history"][probe_table] if entry[0] > before["versions"][probe_table]]
    assert [operation for _v, operation, _m in new] == ["SET TBLPROPERTIES", "OPTIMIZE", "VACUUM START", "VACUUM END"]
    optimize, vacuum_end = new[1][2], new[3][2]
    assert (optimize["numRemovedFiles"], optimize["numAddedFiles"]) == ("3", "1")
    assert vacuum_end["numDeletedFiles"] == "1"
    raw_new = [op for v, op, _m in after["history"][T.RAW] if v > before["versions"][T.RAW]]
    assert raw_new[-2:] == ["VACUUM START", "VACUUM END"], raw_new
    for table in (probe_table, T.RAW):
        assert after["properties"][table]["delta.deletedFileRetentionDuration"] == "interval 240 hours"
    log.info("adpipe maintain of 3 tables (one missing): %.1f s", maintain_s)
