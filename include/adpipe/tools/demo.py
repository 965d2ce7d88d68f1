"""``adpipe demo``: the pipeline end to end on the embedded default, with a
crash injected, ending in a table of what happened and the verify verdict.

It tells its story (adpipe.tools.story): a line or two per step, a bar
while a long step runs, the table at the end. Its log lines go to
ADPIPE_HOME/logs/demo.log, the Spark drivers' to ADPIPE_HOME/logs (Settings.
jvm_logs), each stream job's and the budget service's to the run's folder;
``adpipe -v demo`` shows them all on the console, and prints the whole
verify report."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from adpipe import kafka_io
from adpipe.budget import report as budget_report
from adpipe.lakehouse import load, quality
from adpipe.lakehouse.metastore import metastore_session
from adpipe.local import kafka_broker, postgres
from adpipe.processes import start_detached
from adpipe.settings import Settings, isolated_env
from adpipe.tools import produce, table_verify, verify
from adpipe.tools.story import Story, render_table

log = logging.getLogger(__name__)


# Under $ADPIPE_HOME/demo: the last demo run's id and its own settings.
LATEST = "latest.json"


def demo_env(settings: Settings, run_id: str) -> dict[str, str]:
    """Environment for child processes: this demo's own topics and job id,
    so that demos can be run again and again next to other work."""
    prefix = f"demo-{run_id}"
    env = dict(os.environ)
    env.update(
        {
            "ADPIPE_HOME": str(settings.home),
            "ADPIPE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            **isolated_env(prefix),
            # The budget service's embedded default (SQLite), one per demo run,
            # so the spend verify expects is this run's alone.
            "ADPIPE_BUDGET_DB": f"sqlite:///{settings.home / 'demo' / run_id / 'budget.db'}",
            # The demo sends late events on purpose (about 1 % of its hour),
            # to show their path; the gate's default (1 %) is for real traffic.
            "ADPIPE_MAX_LATE_SHARE": os.environ.get("ADPIPE_MAX_LATE_SHARE", "0.05"),
            # The children's Spark lines where this process's go (`adpipe -v`).
            "ADPIPE_JVM_LOGS": settings.jvm_logs,
        }
    )
    return env


# The stream job's line per micro-batch (adpipe.stream.job) and a fault's.
BATCH_LINE = re.compile(
    r"adpipe\.stream: batch (?P<batch>\d+): input offsets (?P<records>\d+), windows emitted (?P<windows>\d+), "
    r"dlq (?P<dlq>\d+), late (?P<late>\d+) .*?transaction \S+ (?P<outcome>committed|skipped)"
)
FAULT_LINE = re.compile(r"fault injection: (?P<what>.+)$", re.MULTILINE)


@dataclass(frozen=True)
class StreamRun:
    """What one run of the stream job did, read from its log."""

    returncode: int
    log_path: Path
    batches: tuple[int, ...] = ()  # ids of the batches it committed
    records: int = 0  # input records of those batches
    windows: int = 0
    dlq: int = 0
    late: int = 0
    skipped: int = 0  # batches an earlier run had committed already
    fault: str = ""  # "SIGKILL at after_produce"

    @property
    def killed(self) -> bool:
        return self.returncode in (-9, 137)

    def where_killed(self) -> str:
        after = f"after committing batch {self.batches[-1]}" if self.batches else "before its first commit"
        return f"stream job {self.fault or f'exit {self.returncode}'}, {after}"

    def describe(self) -> str:
        if not self.batches:
            done = "no batch committed"
        else:
            first, last = self.batches[0], self.batches[-1]
            ids = f"batch {first}" if first == last else f"batches {first}-{last}"
            done = (
                f"{ids} committed: {self.records:,} records, {self.windows:,} windows, "
                f"{self.dlq:,} to the DLQ, {self.late:,} late"
            )
        if self.skipped:
            done += f" ({self.skipped} already committed by the killed run, skipped)"
        if self.fault:
            done += f"; then {self.fault}: exit {self.returncode}"
        return done


def read_stream_log(text: str, returncode: int, log_path: Path) -> StreamRun:
    """The numbers of a stream run from its log's batch and fault lines."""
    batches = [m for m in BATCH_LINE.finditer(text) if m["outcome"] == "committed"]
    fault = FAULT_LINE.search(text)
    return StreamRun(
        returncode=returncode,
        log_path=log_path,
        batches=tuple(int(m["batch"]) for m in batches),
        records=sum(int(m["records"]) for m in batches),
        windows=sum(int(m["windows"]) for m in batches),
        dlq=sum(int(m["dlq"]) for m in batches),
        late=sum(int(m["late"]) for m in batches),
        skipped=sum(1 for m in BATCH_LINE.finditer(text) if m["outcome"] == "skipped"),
        fault=fault["what"].strip() if fault else "",
    )


def _stream(
    story: Story, env: dict[str, str], log_path: Path, max_offsets: int, pending: int,
    fault: dict[str, str] | None = None,
) -> StreamRun:  # fmt: skip
    """One ``adpipe stream --available-now`` run as a child process, its
    output in ``log_path``; the bar follows the records of its committed
    batches against the ``pending`` ones."""
    cmd = [sys.executable, "-m", "adpipe", "stream", "--available-now", "--max-offsets-per-trigger", str(max_offsets)]
    with story.progress("stream job", total=max(pending, 1)) as bar:
        proc = start_detached(cmd, log_path, env={**env, **(fault or {})}, append=False)
        while proc.poll() is None:
            time.sleep(0.5)
            so_far = read_stream_log(log_path.read_text(errors="replace"), 0, log_path)
            bar.update(completed=so_far.records, status=f"{len(so_far.batches)} batches committed")
    return read_stream_log(log_path.read_text(errors="replace"), proc.returncode, log_path)


def _send(story: Story, settings: Settings, topic: str, the_plan: produce.Plan) -> None:
    total = len(the_plan.messages)
    with story.progress("producing", total=total) as bar:
        produce.send(
            settings.kafka, topic, the_plan, on_progress=lambda sent, _total: bar.update(sent, status=f"{sent:,}")
        )


def summary_rows(
    sent: Sequence[dict], stream_runs: Sequence[StreamRun], report: dict, log_dir: Path, work: Path
) -> list[tuple[str, str]]:
    """The closing table: what the producer's summaries say was sent, the
    crashes the stream runs went through, and what verify, the tables'
    check and Great Expectations found (``report``, as in verify.json)."""
    messages = sum(s["messages"] for s in sent)
    distinct = sum(s["distinct_on_time"] + s.get("revising", 0) + s["late"] for s in sent)
    agg, late, dlq, tables = report["aggregates"], report["late"], report["dlq"], report.get("tables")
    gx = report.get("great_expectations")
    crashes = [r for r in stream_runs if r.killed]
    recovered = stream_runs[-1].returncode == 0
    rows = [
        ("events sent", f"{messages:,} messages: {distinct:,} distinct valid events"),
        (
            "duplicates",
            f"{sum(s['duplicates'] for s in sent):,} producer retries sent; "
            f"{agg['duplicated_count']} windows counted twice",
        ),
        (
            "malformed",
            f"{sum(s['malformed'] for s in sent):,} sent; {dlq['records']:,} in the DLQ, "
            f"{dlq['missing_count']} missing",
        ),
        ("late", f"{sum(s['late'] for s in sent):,} sent; {late['records']:,} in the late topic"),
        (
            "windows",
            f"{agg['records']:,} minute aggregates of {agg['expected_windows']:,} expected: "
            f"{agg['missing_count']} missing, {agg['duplicated_count']} duplicated, {agg['wrong_count']} wrong"
            + (f"; {agg['revisions']} of them revisions, by events minutes late" if agg.get("revisions") else ""),
        ),
        ("crashes injected", "; ".join([str(len(crashes)), *(r.where_killed() for r in crashes)])),
        ("recovery", f"the restarted stream job {'finished (exit 0)' if recovered else 'DID NOT finish'}"),
        ("budget", f"spend of {report['budget'].get('ads', 0)} ads: {report['budget']['status']}"),
    ]
    if tables is not None:
        rows.append(
            (
                f"tables {tables['hour']}",
                f"{tables['raw']['rows']:,} raw events, {tables['aggregates']['rows']:,} aggregates, "
                f"{tables['late']['rows']:,} late: {'match Kafka' if tables['ok'] else 'DO NOT match Kafka'}",
            )
        )
    rows.append(("verify", "exactly-once HOLDS" if report["ok"] else "exactly-once BROKEN (see verify.json)"))
    if gx is not None:
        verdict = "passed" if gx["success"] else f"FAILED: {'; '.join(gx['failed'])}"
        rows.append(("Great Expectations", f"{verdict} ({gx['evaluated']} expectations)"))
        rows.append(("Data Docs", gx["data_docs"]))
    rows.append(("logs", f"{log_dir} (this run's, Spark's)\n{work} (stream jobs, budget, verify.json)"))
    return rows


def run_start(runs_dir: Path) -> datetime:
    """The first event time of the next demo run. Each run in a home gets an
    hour of its own (the n-th run: n days before the first), so the Delta
    tables' hour holds that run's rows only and the checks judge that run,
    not earlier ones with the same seed (and so the same event ids). Before,
    not after: an event time ahead of its record's timestamp (now) by more
    than ADPIPE_MAX_FUTURE_SKEW_S is malformed."""
    earlier_runs = sum(1 for d in runs_dir.iterdir() if d.is_dir()) if runs_dir.exists() else 0
    return produce.ProduceSpec.start - timedelta(days=earlier_runs)


def run(settings: Settings, events: int = 3000, seed: int = 42, verbose: bool = False) -> int:
    """The demo; ``verbose`` (``adpipe -v demo``) also prints the whole
    verify report."""
    run_id = time.strftime("%Y%m%d%H%M%S")
    env = demo_env(settings, run_id)
    from adpipe.settings import load_settings

    demo_settings = load_settings(env)
    topics = demo_settings.topics
    runs_dir = settings.home / "demo"
    start = run_start(runs_dir)
    work = runs_dir / run_id
    work.mkdir(parents=True, exist_ok=True)
    # `adpipe status` describes this run's stream job when the home's own never ran.
    (runs_dir / LATEST).write_text(json.dumps({"run_id": run_id, "env": isolated_env(f"demo-{run_id}")}) + "\n")
    max_offsets = max(200, events // 3)
    story = Story()
    story.say(f"adpipe demo, run {run_id} in {settings.home}")

    story.step(f"Kafka broker (KRaft) on {settings.kafka_bootstrap}, log {settings.kafka_dir / 'broker.log'}")
    with story.progress("starting the broker"):
        broker = kafka_broker.up(settings)
        kafka_io.ensure_pipeline_topics(settings, topics)
    prefix = f"{demo_settings.job_id}-"  # the run's own topics and job id (isolated_env)
    names = ", ".join(t.removeprefix(prefix) for t in topics.all())
    story.note(f"{broker.describe()}; topics {prefix}{{{names}}}")

    spec = produce.ProduceSpec(
        events=events, seed=seed, minutes=10, start=start, duplicate_rate=0.05, malformed_rate=0.01
    )
    plan = produce.plan(spec)
    _send(story, settings, topics.events, plan)
    produce.write_summary(plan.summary, work / "produce-1.json")
    story.step(
        f"produced {plan.summary['messages']:,} messages: {plan.summary['distinct_on_time']:,} events over 10 "
        f"minutes from {plan.summary['start']}, {plan.summary['duplicates']} producer-retry duplicates, "
        f"{plan.summary['malformed']} malformed"
    )

    story.step("stream job, SIGKILLed on purpose in batch 1 after producing into its Kafka transaction, before commit")
    crashed = _stream(
        story, env, work / "stream-1.log", max_offsets, plan.summary["messages"],
        {"ADPIPE_FAULT": "after_produce", "ADPIPE_FAULT_BATCH": "1"},
    )  # fmt: skip
    story.note(crashed.describe() + ("" if crashed.killed else " (expected a SIGKILL)"))
    stream_runs = [crashed]

    story.step("stream job restarted: Spark replays batch 1, the killed run's open transaction is aborted (fenced)")
    restarted = _stream(story, env, work / "stream-2.log", max_offsets, plan.summary["messages"] - crashed.records)
    stream_runs.append(restarted)
    story.note(restarted.describe())
    if restarted.returncode != 0:
        story.note(f"the stream job failed (exit {restarted.returncode}); see {restarted.log_path}")
        return 1

    # Late events timed 12:00..12:03 (7 to 10 minutes before this batch's
    # start): their windows closed and their allowed lateness (5 minutes)
    # passed, so they are late, and in the demo's own hour (an hour of
    # nothing but late events would fail the late-share gate). Events a few
    # minutes out of order beside them: some revise windows that closed.
    spec2 = produce.ProduceSpec(
        events=max(1, events // 3),
        seed=seed + 1,
        minutes=3,
        start=spec.start + timedelta(minutes=10),
        late_rate=0.03,
        late_by_minutes=3,
        revise_rate=0.05,
    )
    plan2 = produce.plan(spec2)
    _send(story, settings, topics.events, plan2)
    produce.write_summary(plan2.summary, work / "produce-2.json")
    # A few events of the next hour: time moves on, the watermark passes the
    # end of the demo's hour plus its allowed lateness and closes it for Union & Load.
    next_hour = spec.start.replace(minute=0) + timedelta(hours=1, seconds=demo_settings.lateness_ms // 1000 + 60)
    spec3 = produce.ProduceSpec(events=20, seed=seed + 2, minutes=1, start=next_hour)
    plan3 = produce.plan(spec3)
    _send(story, settings, topics.events, plan3)
    produce.write_summary(plan3.summary, work / "produce-3.json")
    sent = [plan.summary, plan2.summary, plan3.summary]
    pending = plan2.summary["messages"] + plan3.summary["messages"]
    story.step(
        f"produced {pending:,} more: "
        f"{plan2.summary['distinct_on_time']:,} events of the next minutes, {plan2.summary['revising']} minutes out "
        f"of order, {plan2.summary['late']} late ones for windows past their allowed lateness, "
        f"{plan3.summary['distinct_on_time']} of the next hour (closes the demo's hour)"
    )
    third = _stream(story, env, work / "stream-3.log", max_offsets, pending)
    stream_runs.append(third)
    story.note("stream job: " + third.describe())
    if third.returncode != 0:
        story.note(f"the stream job failed (exit {third.returncode}); see {third.log_path}")
        return 1

    story.step("ad budget service: spend per ad from the read_committed aggregates, once per record_uuid")
    with (work / "budget.log").open("w") as out, story.progress("budget service"):
        rc = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "adpipe", "budget", "--once"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode
    if rc != 0:
        story.note(f"the budget service failed (exit {rc}); see {work / 'budget.log'}")
        return 1
    report_rows = budget_report.report(demo_settings) or []
    paused = sum(1 for r in report_rows if r.status == "paused")
    story.note(f"spend recorded for {len(report_rows)} ads, {paused} paused at their budget")

    hour = load.hour_label(spec.start.replace(minute=0, second=0, microsecond=0))
    the_hour = load.parse_hour(hour)
    story.step(f"Union & Load of hour {hour} into the ads Delta tables (Hive metastore in PostgreSQL)")
    with story.progress("PostgreSQL, Spark, Union & Load"):
        postgres.up(settings)
        spark = metastore_session(demo_settings, "adpipe-demo")
        closed = load.hour_closed(demo_settings, the_hour)
        loaded = None
        if closed:
            try:
                loaded = load.load_hour(demo_settings, the_hour, spark)
            except load.GateFailed as exc:
                story.note("the quality gate failed, nothing was published:\n" + str(exc))
                return 1
    if loaded is None:
        story.note(f"hour {hour} is not closed: the stream's watermark has not passed its end plus the allowed "
                   "lateness")
        return 1
    story.note(loaded.describe())

    story.step(f"Great Expectations: the exactly-once proof for hour {hour}")
    with story.progress("Great Expectations"):
        facts = load.kafka_facts(demo_settings, spark, the_hour)
        quality_result = quality.validate_hour(demo_settings, the_hour, spark, facts)
    story.note(quality_result.describe().splitlines()[0])
    for failed in quality_result.failed:
        story.note(f"  FAILED {failed}")

    story.step("verify: raw events, aggregates, late and DLQ topics, budget spend and the tables, reconciled")
    with story.progress("verify"):
        report = verify.reconcile(demo_settings, kafka_io.ledger_group(demo_settings.job_id))
        report["tables"] = table_verify.check_hour(demo_settings, the_hour, spark)
    report["great_expectations"] = {
        "success": quality_result.success,
        "evaluated": quality_result.evaluated,
        "failed": quality_result.failed,
        "data_docs": str(quality_result.data_docs),
    }
    report["ok"] = report["ok"] and report["tables"]["ok"] and quality_result.success
    (work / "verify.json").write_text(json.dumps(report, indent=2) + "\n")
    story.note(f"report: {work / 'verify.json'}")
    if verbose:  # the whole report, as `adpipe verify` prints it
        story.say(json.dumps(report, indent=2))
    story.say("")
    rows = summary_rows(sent, stream_runs, report, settings.log_dir, work)
    story.say(render_table("adpipe demo: what happened", rows))
    story.say(verdict_line(report, hour))
    return 0 if report["ok"] else 1


def verdict_line(report: dict, hour: str) -> str:
    """The demo's last line, in the form it has always had (scripts grep it):
    the verdict and the numbers behind it, from the verify report."""
    agg, tables = report["aggregates"], report["tables"]
    ge = report["great_expectations"]
    return (
        f"exactly-once {'HOLDS' if report['ok'] else 'BROKEN'}: {agg['records']} aggregates, "
        f"{agg['missing_count']} missing, {agg['duplicated_count']} duplicated, {agg['wrong_count']} wrong; "
        f"{report['late']['records']} late, {report['dlq']['records']} in the DLQ; tables "
        f"{'match' if tables['ok'] else 'DO NOT match'} ({tables['aggregates']['rows']} aggregates, "
        f"{tables['raw']['rows']} raw events of hour {hour}); Great Expectations "
        f"{'passed' if ge['success'] else 'FAILED'}; budget spend {report['budget']['status']}"
    )
