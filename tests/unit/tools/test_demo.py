"""The demo's per-run hour."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path


def test_each_demo_run_in_a_home_gets_an_hour_of_its_own(tmp_path: Path) -> None:
    from adpipe.tools.demo import run_start

    runs = tmp_path / "demo"
    first = run_start(runs)
    assert first == datetime(2026, 11, 22, 12, tzinfo=UTC)
    (runs / "20261123162734").mkdir(parents=True)
    (runs / "notes.txt").write_text("not a run")
    second = run_start(runs)
    (runs / "20261123163240").mkdir()
    third = run_start(runs)
    assert (first - second, second - third) == (timedelta(days=1), timedelta(days=1))  # back in time
    assert len({first.replace(minute=0), second.replace(minute=0), third.replace(minute=0)}) == 3


# What the demo prints: the stream runs read from their logs, and the closing
# table built from the producer's summaries and the verify report.

STREAM_LOG = """\
2026-11-24 18:09:27,215 INFO adpipe.spark: Spark application adpipe-stream-demo-1 on local[2]
2026-11-24 18:09:48,306 INFO adpipe.stream: batch 0: input offsets 999, windows emitted 0, dlq 8, late 0 (repeats \
skipped 0), watermark 1970-01-01T00:00:00Z, transaction adpipe-agg-demo-1 committed in 3087 ms (batch 8537 ms)
2026-11-24 18:09:55,001 INFO adpipe.stream: batch 1: input offsets 998, windows emitted 20, dlq 9, late 2 (repeats \
skipped 0), watermark 2026-11-22T12:02:50Z, transaction adpipe-agg-demo-1 skipped (already committed) in \
3 ms (batch 5846 ms)
2026-11-24 18:10:24,303 INFO adpipe.stream: batch 2: input offsets 182, windows emitted 40, dlq 3, late 1 (repeats \
skipped 0), watermark 2026-11-22T12:04:14Z, transaction adpipe-agg-demo-1 committed in 3022 ms (batch 5846 ms)
2026-11-24 18:09:56,319 WARNING adpipe.faults: fault injection: SIGKILL at after_produce
"""


def test_a_stream_run_is_read_from_its_log_lines(tmp_path: Path) -> None:
    from adpipe.tools.demo import read_stream_log

    run = read_stream_log(STREAM_LOG, -9, tmp_path / "stream-1.log")
    assert run.batches == (0, 2)  # batch 1 was skipped, not committed by this run
    assert (run.records, run.windows, run.dlq, run.late, run.skipped) == (999 + 182, 40, 11, 1, 1)
    assert run.fault == "SIGKILL at after_produce" and run.killed
    assert run.where_killed() == "stream job SIGKILL at after_produce, after committing batch 2"
    assert run.describe().startswith("batches 0-2 committed: 1,181 records, 40 windows, 11 to the DLQ, 1 late")
    empty = read_stream_log("Spark starting\n", 1, tmp_path / "x.log")
    assert (empty.batches, empty.records, empty.fault, empty.killed) == ((), 0, "", False)
    assert empty.describe() == "no batch committed"


def _report(ok: bool = True, missing: int = 0) -> dict:
    """The parts of verify.json the table reads, as the demo writes them."""
    return {
        "ok": ok,
        "aggregates": {
            "records": 160 - missing, "expected_windows": 160, "missing_count": missing, "duplicated_count": 0,
            "wrong_count": 0,
        },
        "late": {"records": 30},
        "dlq": {"records": 29, "missing_count": 1},
        "budget": {"status": "ok", "ads": 20},
        "tables": {
            "ok": ok, "hour": "2026-11-22T12", "raw": {"rows": 4030}, "aggregates": {"rows": 160}, "late": {"rows": 30},
        },
        "great_expectations": {
            "success": ok, "evaluated": 41, "data_docs": "/h/gx/index.html",
            "failed": [] if ok else ["aggregates: expect_table_row_count_to_equal (observed 159)"],
        },
    }  # fmt: skip


def test_the_closing_table_comes_from_the_summaries_the_runs_and_the_report(tmp_path: Path) -> None:
    from adpipe.tools.demo import StreamRun, summary_rows

    sent = [
        {"messages": 3186, "distinct_on_time": 3000, "duplicates": 156, "malformed": 30, "late": 0},
        {"messages": 1040, "distinct_on_time": 1000, "duplicates": 0, "malformed": 10, "late": 30},
        {"messages": 20, "distinct_on_time": 20, "duplicates": 0, "malformed": 0, "late": 0},
    ]
    runs = [
        StreamRun(-9, tmp_path / "1.log", batches=(0,), fault="SIGKILL at after_produce"),
        StreamRun(0, tmp_path / "2.log", batches=(1, 2, 3)),
        StreamRun(0, tmp_path / "3.log", batches=(4, 5)),
    ]
    rows = dict(summary_rows(sent, runs, _report(), tmp_path / "logs", tmp_path / "run"))
    assert rows["events sent"] == "4,246 messages: 4,050 distinct valid events"
    assert rows["duplicates"] == "156 producer retries sent; 0 windows counted twice"
    assert rows["malformed"] == "40 sent; 29 in the DLQ, 1 missing"
    assert rows["late"] == "30 sent; 30 in the late topic"
    assert rows["windows"] == "160 minute aggregates of 160 expected: 0 missing, 0 duplicated, 0 wrong"
    assert rows["crashes injected"] == "1; stream job SIGKILL at after_produce, after committing batch 0"
    assert rows["recovery"] == "the restarted stream job finished (exit 0)"
    assert rows["tables 2026-11-22T12"] == "4,030 raw events, 160 aggregates, 30 late: match Kafka"
    assert rows["verify"] == "exactly-once HOLDS"
    assert rows["Great Expectations"] == "passed (41 expectations)"
    assert rows["Data Docs"] == "/h/gx/index.html"
    assert rows["logs"].splitlines()[0].startswith(str(tmp_path / "logs"))

    broken = dict(summary_rows(sent, runs[:2], _report(ok=False, missing=1), tmp_path / "logs", tmp_path / "run"))
    assert broken["verify"] == "exactly-once BROKEN (see verify.json)"
    assert broken["windows"].startswith("159 minute aggregates of 160 expected: 1 missing")
    assert broken["Great Expectations"].startswith("FAILED: aggregates: expect_table_row_count_to_equal")
    assert broken["tables 2026-11-22T12"].endswith("DO NOT match Kafka")
    no_crash = dict(summary_rows(sent, runs[1:], _report(), tmp_path / "logs", tmp_path / "run"))
    assert no_crash["crashes injected"] == "0"


def test_the_table_aligns_its_values_and_continues_a_long_one_under_itself() -> None:
    from adpipe.tools.story import render_table

    text = render_table("what happened", [("sent", "10"), ("logs", "/a\n/b")])
    assert text.splitlines() == [
        "what happened",
        "-------------",
        "  sent  10",
        "  logs  /a",
        "        /b",
        "-------------",
    ]


def test_off_a_terminal_the_story_prints_its_lines_and_no_bar() -> None:
    import io

    from adpipe.tools.story import Story

    out = io.StringIO()
    story = Story(out, bars=False)
    story.step("Kafka broker")
    story.note("up\nanswering")
    with story.progress("stream job", total=10) as bar:
        bar.update(5, status="1 batch")  # nothing to draw
    story.step("produced")
    assert out.getvalue() == "1. Kafka broker\n   up\n   answering\n2. produced\n"


def test_the_last_line_keeps_its_old_form_with_the_reports_numbers() -> None:
    from adpipe.tools.demo import verdict_line

    assert verdict_line(_report(), "2026-11-22T12") == (
        "exactly-once HOLDS: 160 aggregates, 0 missing, 0 duplicated, 0 wrong; 30 late, 29 in the DLQ; tables match "
        "(160 aggregates, 4030 raw events of hour 2026-11-22T12); Great Expectations passed; budget spend ok"
    )
    broken = verdict_line(_report(ok=False, missing=1), "2026-11-22T12")
    assert broken.startswith("exactly-once BROKEN: 159 aggregates, 1 missing")
    assert "tables DO NOT match" in broken and "Great Expectations FAILED" in broken


def test_the_closing_table_says_how_many_aggregates_were_revisions(tmp_path: Path) -> None:
    from adpipe.tools.demo import StreamRun, summary_rows

    report = _report()
    report["aggregates"] = {**report["aggregates"], "records": 166, "revisions": 6}
    sent = [{"messages": 10, "distinct_on_time": 8, "revising": 2, "duplicates": 0, "malformed": 0, "late": 0}]
    runs = [StreamRun(0, tmp_path / "1.log", batches=(0,))]
    rows = dict(summary_rows(sent, runs, report, tmp_path / "logs", tmp_path / "run"))
    assert rows["events sent"] == "10 messages: 10 distinct valid events"
    assert rows["windows"] == (
        "166 minute aggregates of 160 expected: 0 missing, 0 duplicated, 0 wrong; 6 of them revisions, "
        "by events minutes late"
    )
