"""Table maintenance's parts that need no tables: the retention setting,
the ``adpipe maintain`` command line, table names, and reading what
OPTIMIZE and DESCRIBE HISTORY return. (OPTIMIZE and VACUUM on real tables:
tests/integration/test_maintenance.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest
from adpipe.cli import build_parser
from adpipe.lakehouse import maintenance
from adpipe.lakehouse import tables as T
from adpipe.settings import SettingsError, load_settings
from pyspark.sql import Row, SparkSession

# --- the retention setting ----------------------------------------------------


def test_retention_defaults_to_seven_days_and_may_be_longer() -> None:
    assert load_settings({}).vacuum_retention_h == 168
    assert load_settings({"ADPIPE_VACUUM_RETENTION_H": ""}).vacuum_retention_h == 168
    assert load_settings({"ADPIPE_VACUUM_RETENTION_H": "720"}).vacuum_retention_h == 720


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("167", "ADPIPE_VACUUM_RETENTION_H=167 must be >= 168"),
        ("0", "ADPIPE_VACUUM_RETENTION_H=0 must be >= 168"),
        ("7d", "ADPIPE_VACUUM_RETENTION_H='7d' is not an integer"),
    ],
)
def test_retention_below_seven_days_is_refused(raw: str, message: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({"ADPIPE_VACUUM_RETENTION_H": raw})
    assert str(info.value) == message


def test_maintain_with_a_short_retention_stops_before_spark() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "adpipe", "maintain"],
        env={"ADPIPE_VACUUM_RETENTION_H": "24", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "ADPIPE_VACUUM_RETENTION_H=24 must be >= 168" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- the command line -----------------------------------------------------------


def test_maintain_help_names_the_default_tables_and_the_retention(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["maintain", "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "adpipe maintain" in out and "--tables TABLE [TABLE ...]" in out
    assert "OPTIMIZE" in out and "VACUUM" in out and "ADPIPE_VACUUM_RETENTION_H (168" in out
    assert ("(default: the published ads tables, the aggregates' revisions included, their ads_staging twins and "
            "ads.load_runs)") in out
    assert maintenance.DEFAULT_TABLES == (
        T.RAW, T.AGGREGATES, T.QUARANTINE, T.REVISIONS, T.staged(T.RAW), T.staged(T.AGGREGATES),
        T.staged(T.QUARANTINE), T.LOAD_RUNS,
    )


def test_maintain_takes_table_names_and_needs_the_metastore() -> None:
    from adpipe.lakehouse.cli import cmd_maintain

    args = build_parser().parse_args(["maintain", "--tables", "ads.ad_events_raw", "other"])
    assert args.tables == ["ads.ad_events_raw", "other"]
    assert (args.func, args.needs_metastore) == (cmd_maintain, True)
    assert build_parser().parse_args(["maintain"]).tables is None


@pytest.mark.parametrize("name", ["ads.ad_events_raw", "ad_events_raw", "_x.T1"])
def test_plain_table_names_pass(name: str) -> None:
    assert maintenance.check_table_name(name) == name


@pytest.mark.parametrize("name", ["", "ads.", "a.b.c", "ads.x; DROP TABLE ads.y", "ads.`x`", "1ads.x", "ads x"])
def test_other_table_names_are_refused_before_any_sql(name: str) -> None:
    with pytest.raises(ValueError, match="is not a table name"):
        maintenance.check_table_name(name)
    with pytest.raises(ValueError, match="is not a table name"):
        maintenance.optimize_and_vacuum(load_settings({}), None, ["ads.ad_events_raw", name])  # type: ignore[arg-type]


# --- reading Delta's answers ----------------------------------------------------


def test_optimize_counts_read_the_metrics_row() -> None:
    rows = [Row(path="file:/w/ads.db/t", metrics=Row(numFilesAdded=2, numFilesRemoved=9, partitionsOptimized=2))]
    assert maintenance.optimize_counts(rows) == (2, 9)
    assert maintenance.optimize_counts([Row(path="p", metrics=Row(numFilesAdded=0, numFilesRemoved=0))]) == (0, 0)


def _history(*entries: tuple[int, str, dict[str, str] | None]) -> list[Row]:
    # DESCRIBE HISTORY: newest first.
    return [Row(version=v, operation=op, operationMetrics=m) for v, op, m in sorted(entries, reverse=True)]


def test_files_deleted_come_from_the_vacuum_end_after_the_given_version() -> None:
    history = _history(
        (3, "VACUUM END", {"numDeletedFiles": "7", "numVacuumedDirectories": "2"}),  # yesterday's
        (4, "OPTIMIZE", {"numRemovedFiles": "3", "numAddedFiles": "1"}),
        (5, "VACUUM START", {"numFilesToDelete": "2"}),
        (6, "VACUUM END", {"numDeletedFiles": "2", "numVacuumedDirectories": "1"}),
        (7, "MERGE", {"numTargetRowsInserted": "5"}),  # a load right after
    )
    assert maintenance.vacuum_deleted_files(history, after_version=4) == 2
    assert maintenance.vacuum_deleted_files(history, after_version=6) is None  # not logged this time
    assert maintenance.vacuum_deleted_files(_history((1, "WRITE", None)), after_version=0) is None


def test_a_missing_table_is_skipped(spark: SparkSession) -> None:
    result = maintenance.optimize_and_vacuum(load_settings({}), spark, ["ads.no_such_table"])
    assert result == [maintenance.TableMaintenance("ads.no_such_table", skipped=True)]
    assert result[0].describe() == "ads.no_such_table: skipped, no such table yet"
