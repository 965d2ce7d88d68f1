"""The Spark driver's own log lines (log4j) go to a file under
ADPIPE_HOME/logs, not to the console, errors excepted (ADPIPE_JVM_LOGS=file,
the default; `adpipe -v` sets console). A real local session in a process of
its own: the JVM reads its logging configuration once, at start."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import JVM_OPTIONS

PROBE = """
from adpipe.settings import load_settings
from adpipe.spark import build_spark

spark = build_spark(load_settings(), "adpipe-test-logs")
probe = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getLogger("org.apache.spark.AdpipeProbe")
probe.info("probe info 4710")
probe.warn("probe warning 4711")
probe.error("probe error 4712")
assert spark.range(3).count() == 3
spark.stop()
"""

# A log4j line as Spark's layout writes it ("26/11/24 20:42:05 WARN Utils: ...")
# or ours, to the millisecond as adpipe's own lines ("2026-11-24 20:42:05,123 WARN Utils: ...").
LOG4J_LINE = re.compile(
    r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (INFO|WARN|ERROR) ", re.MULTILINE
)


def test_a_spark_driver_logs_to_a_file_under_the_home_and_only_errors_to_stderr(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ADPIPE_")},
        "ADPIPE_HOME": str(tmp_path),
        "ADPIPE_JVM_OPTIONS": JVM_OPTIONS,
        "ADPIPE_SPARK_DRIVER_MEMORY": "512m",
    }
    proc = subprocess.run(  # noqa: S603
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    log = (tmp_path / "logs" / "adpipe-test-logs.log").read_text()
    # To the millisecond, as adpipe's own lines (a batch's phases are a few ms apart).
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARN AdpipeProbe: probe warning 4711$", log, re.MULTILINE)
    assert "ERROR AdpipeProbe: probe error 4712" in log
    assert "probe info 4710" not in log  # the driver's level, ADPIPE_SPARK_LOG_LEVEL (WARN)
    # On the console: the error, and no other log4j line, nor Spark's notes
    # about its default profile and level.
    assert [m.group(2) for m in LOG4J_LINE.finditer(proc.stderr)] == ["ERROR"], proc.stderr[-3000:]
    assert "ERROR AdpipeProbe: probe error 4712" in proc.stderr
    assert "Using Spark's default log4j profile" not in proc.stderr
    assert "Setting default log level" not in proc.stderr
