"""``adpipe demo``: the pipeline end to end on the embedded default, with a
crash injected, ending in the verify report."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from adpipe import kafka_io
from adpipe.budget import report as budget_report
from adpipe.lakehouse import load, quality
from adpipe.lakehouse.metastore import metastore_session
from adpipe.local import kafka_broker, postgres
from adpipe.settings import Settings, isolated_env
from adpipe.tools import produce, table_verify, verify

log = logging.getLogger(__name__)


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
        }
    )
    return env


def _stream(env: dict[str, str], log_path: Path, max_offsets: int, fault: dict[str, str] | None = None) -> int:
    cmd = [sys.executable, "-m", "adpipe", "stream", "--available-now", "--max-offsets-per-trigger", str(max_offsets)]
    with log_path.open("w") as out:
        proc = subprocess.run(
            cmd,
            env={**env, **(fault or {})},
            stdout=out,
            stderr=subprocess.STDOUT,  # noqa: S603
            start_new_session=True,
            check=False,
        )
    for line in log_path.read_text().splitlines():
        if "adpipe.stream: batch" in line or "fault injection" in line or "already committed" in line:
            print("   " + line.split(": ", 1)[-1])
    if proc.returncode != 0 and not fault:
        print(f"   the stream job failed (exit {proc.returncode}); see {log_path}")
    return proc.returncode


def run_start(runs_dir: Path) -> datetime:
    """The first event time of the next demo run. Each run in a home gets an
    hour of its own (the n-th run: n days before the first), so the Delta
    tables' hour holds that run's rows only and the checks judge that run,
    not earlier ones with the same seed (and so the same event ids). Before,
    not after: an event time ahead of its record's timestamp (now) by more
    than ADPIPE_MAX_FUTURE_SKEW_S is malformed."""
    earlier_runs = sum(1 for d in runs_dir.iterdir() if d.is_dir()) if runs_dir.exists() else 0
    return produce.ProduceSpec.start - timedelta(days=earlier_runs)


def run(settings: Settings, events: int = 3000, seed: int = 42) -> int:
    run_id = time.strftime("%Y%m%d%H%M%S")
    env = demo_env(settings, run_id)
    from adpipe.settings import load_settings

    demo_settings = load_settings(env)
    runs_dir = settings.home / "demo"
    start = run_start(runs_dir)
    work = runs_dir / run_id
    work.mkdir(parents=True, exist_ok=True)
    max_offsets = max(200, events // 3)

    print(f"1. Kafka broker on {settings.kafka_bootstrap}")
    print("   " + kafka_broker.up(settings).describe())
    kafka_io.ensure_topics(settings.kafka, demo_settings.topics.all(), settings.topic_partitions)
    print(f"   topics: {', '.join(demo_settings.topics.all())}")

    spec = produce.ProduceSpec(
        events=events, seed=seed, minutes=5, start=start, duplicate_rate=0.05, malformed_rate=0.01
    )
    plan = produce.plan(spec)
    produce.send(settings.kafka, demo_settings.topics.events, plan)
    produce.write_summary(plan.summary, work / "produce-1.json")
    print(
        f"2. produced {plan.summary['messages']} messages: {plan.summary['distinct_on_time']} events over 5 minutes, "
        f"{plan.summary['duplicates']} producer-retry duplicates, {plan.summary['malformed']} malformed"
    )

    print("3. stream job, with a SIGKILL injected after producing batch 1 into its transaction (before commit)")
    rc = _stream(env, work / "stream-1.log", max_offsets, {"ADPIPE_FAULT": "after_produce", "ADPIPE_FAULT_BATCH": "1"})
    print(f"   the job died with exit code {rc} ({'SIGKILL' if rc in (-9, 137) else 'unexpected'})")

    print("4. stream job restarted: Spark replays the uncommitted batch; the open transaction was aborted")
    if _stream(env, work / "stream-2.log", max_offsets) != 0:
        return 1

    # Late events timed 12:00..12:03 (2 to 5 minutes before this batch's
    # start), windows already closed: late, and in the demo's own hour (an
    # hour of nothing but late events would fail the late-share gate).
    spec2 = produce.ProduceSpec(
        events=max(1, events // 3), seed=seed + 1, minutes=3, start=spec.start + timedelta(minutes=5), late_rate=0.03,
        late_by_minutes=3,
    )
    plan2 = produce.plan(spec2)
    produce.send(settings.kafka, demo_settings.topics.events, plan2)
    produce.write_summary(plan2.summary, work / "produce-2.json")
    # A few events of the next hour: time moves on, the watermark passes the
    # end of the demo's hour and closes it for Union & Load.
    spec3 = produce.ProduceSpec(
        events=20, seed=seed + 2, minutes=1, start=spec.start.replace(minute=0) + timedelta(hours=1, minutes=1)
    )
    plan3 = produce.plan(spec3)
    produce.send(settings.kafka, demo_settings.topics.events, plan3)
    print(
        f"5. produced {plan2.summary['messages']} more: {plan2.summary['distinct_on_time']} events of the next "
        f"minutes and {plan2.summary['late']} late ones for windows already closed, and "
        f"{plan3.summary['distinct_on_time']} of the next hour (which closes the demo's hour)"
    )
    if _stream(env, work / "stream-3.log", max_offsets) != 0:
        return 1

    print("6. ad budget service: spend per ad from the read_committed aggregates, once per record_uuid")
    with (work / "budget.log").open("w") as out:
        rc = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "adpipe", "budget", "--once"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode
    if rc != 0:
        print(f"   the budget service failed (exit {rc}); see {work / 'budget.log'}")
        return 1
    report_rows = budget_report.report(demo_settings) or []
    paused = sum(1 for r in report_rows if r.status == "paused")
    print(f"   spend recorded for {len(report_rows)} ads, {paused} paused at their budget ({work / 'budget.log'})")

    hour = load.hour_label(spec.start.replace(minute=0, second=0, microsecond=0))
    print(f"7. Union & Load of hour {hour} into the ads Delta tables (Hive metastore in PostgreSQL)")
    postgres.up(settings)
    spark = metastore_session(demo_settings, "adpipe-demo")
    the_hour = load.parse_hour(hour)
    if not load.hour_closed(demo_settings, the_hour):
        print(f"   hour {hour} is not closed: the stream's watermark has not passed its end")
        return 1
    try:
        print("   " + load.load_hour(demo_settings, the_hour, spark).describe())
    except load.GateFailed as exc:
        print("   the quality gate failed, nothing was published:\n   " + str(exc).replace("\n", "\n   "))
        return 1

    print(f"8. Great Expectations: the exactly-once proof for hour {hour}")
    facts = load.kafka_facts(demo_settings, spark, the_hour)
    quality_result = quality.validate_hour(demo_settings, the_hour, spark, facts)
    print("   " + quality_result.describe().replace("\n", "\n   "))

    print("9. verify (independent reconciliation of raw events, aggregates, late and DLQ topics, and the tables)")
    report = verify.reconcile(demo_settings, kafka_io.ledger_group(demo_settings.job_id))
    report["tables"] = table_verify.check_hour(demo_settings, the_hour, spark)
    report["great_expectations"] = {
        "success": quality_result.success,
        "failed": quality_result.failed,
        "data_docs": str(quality_result.data_docs),
    }
    report["ok"] = report["ok"] and report["tables"]["ok"] and quality_result.success
    (work / "verify.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    agg = report["aggregates"]
    print(
        f"\nexactly-once {'HOLDS' if report['ok'] else 'BROKEN'}: {agg['records']} aggregates, "
        f"{agg['missing_count']} missing, {agg['duplicated_count']} duplicated, {agg['wrong_count']} wrong; "
        f"{report['late']['records']} late, {report['dlq']['records']} in the DLQ; tables "
        f"{'match' if report['tables']['ok'] else 'DO NOT match'} ({report['tables']['aggregates']['rows']} "
        f"aggregates, {report['tables']['raw']['rows']} raw events of hour {hour}); Great Expectations "
        f"{'passed' if quality_result.success else 'FAILED'}; budget spend {report['budget']['status']}. "
        f"Files: {work}; Data Docs: {quality_result.data_docs}"
    )
    return 0 if report["ok"] else 1
