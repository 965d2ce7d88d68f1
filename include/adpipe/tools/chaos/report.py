"""The run's report: its output checked against the producer's record
(:mod:`adpipe.tools.chaos.check`), the budgets, the Delta tables, what the
faults did, the verdict; written to ``report.json`` in the run's folder."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict

from adpipe import kafka_io
from adpipe import schemas as S
from adpipe.local import kafka_broker
from adpipe.settings import Settings
from adpipe.tools import produce

from . import check
from .plan import PlannedFault, replay_command
from .rig import Rig

log = logging.getLogger("adpipe.tools.chaos")


def write(rig: Rig, main: produce.Plan, closer_minute: str, drain_s: float, schedule: list[PlannedFault]) -> dict:
    """The report of a run that has drained (``closer_minute``: the closing
    events' first window, not judged), written and returned."""
    s = rig.ctx.settings
    events, judged, (raw, late, dlq) = check_events(rig, main, closer_minute)
    spend = check.check_spend(judged, spend_rows(s), (s.budget_default_cpm_micros, s.budget_default_cpc_micros))
    tables = check_tables(rig)
    # The same tables read with delta-rs, when it is installed.
    rows = check.read_delta_tables(s.warehouse_dir / "ads.db")
    tables_delta_rs = (
        {"ok": None, "skipped": rows}
        if isinstance(rows, str)
        else check.compare_tables(rows, judged, raw, late, dlq, set(rig.loads.hours))
    )
    faults = check.summarize_faults([asdict(f) for f in rig.faults.records], Counter(f.kind for f in schedule))
    verdict, reasons = check.run_verdict(
        {
            "events": events["ok"],
            "spend": spend["ok"],
            "tables": tables["ok"],
            **({"tables (delta-rs)": tables_delta_rs["ok"]} if tables_delta_rs["ok"] is not None else {}),
            "producer": not rig.producer_error,
        },
        faults,
        rig.restarts.parts_down(),
        rig.supervisor.stalls,
    )
    explained = {
        "PASS": "zero lost, zero duplicated, budgets exact, tables match, every planned fault injected",
        "SHORT": "the output is right, but the run fell short: " + "; ".join(reasons),
        "FAIL": "; ".join(reasons) + ": see check, spend and tables",
    }[verdict]
    report = {
        "run_id": rig.ctx.run_id,
        "seed": rig.seed,
        "command": " ".join(replay_command(rig.spec, rig.seed)),
        "brokers": len(kafka_broker.nodes(rig.ctx.base)),
        "spark_master": s.spark_master,
        "hosts": rig.spec.hosts,
        "stream_standby": rig.crew.with_standby,
        "duration_s": rig.clock.elapsed(),
        "events": {
            "sent_messages": main.summary["messages"],
            "distinct_events": events["raw_valid_events"],
            "duplicates_sent": main.summary["duplicates"],
            "malformed": main.summary["malformed"],
            "late_planned": main.summary["late"],
        },
        "faults_planned": len(schedule),
        "faults_injected": sum(row["injected"] for row in faults.values()),
        "faults_skipped": rig.faults.skipped,
        "faults": faults,
        "failover": check.summarize_failover([asdict(f) for f in rig.faults.records]),
        "fault_log": [asdict(f) for f in rig.faults.records],
        "restarts": rig.restart_counts(),
        "restart_failures": rig.restarts.failures,
        "parts_down": rig.restarts.parts_down(),
        "exits": {
            "stream": dict(sum((p.exits for p in rig.crew.drivers()), Counter())),
            "budget": dict(sum((p.exits for p in rig.crew.budgets), Counter())),
            "load": dict(rig.loads.rcs),
        },
        "airflow": rig.airflow.summary() if rig.airflow is not None else None,
        "max_stream_lag": rig.monitor.max_stream_lag,
        "stream_stalls_killed": rig.supervisor.stalls,
        "warm_up_s": rig.warm_up_s,
        "drain_s": drain_s,
        "producer_error": rig.producer_error,
        "check": events,
        "spend": spend,
        "tables": tables,
        "tables_delta_rs": tables_delta_rs,
        "verdict": f"{verdict}: {explained}",
        "ok": verdict == "PASS",
        "logs": str(rig.ctx.logs),
    }
    (rig.ctx.home / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report


def check_events(rig: Rig, main: produce.Plan, closer_minute: str) -> tuple[dict, list[bytes], tuple]:
    """The verdict on the stream's output (check.check_stream_output):
    the producer's summary, the raw topic, the ledger boundaries sampled
    during the run (and once more now), the output topics; and the
    aggregates it judged (those of windows before the closer's), and the
    raw topic, late listings and DLQ sources it read."""
    s = rig.ctx.settings
    try:
        rig.monitor.note_boundary(kafka_io.stream_commits(s))
    except Exception as exc:  # noqa: BLE001 - the sampled ones still bound the watermarks
        log.warning("reading the ledger once more: %s", exc)
    rules = check.StreamRules(
        s.watermark_delay_s * 1000, s.max_future_skew_ms, s.late_dedupe_retention_s * 1000, s.allowed_lateness_s * 1000
    )
    raw = check.RawTopic(
        (
            check.RawRecord(r.partition, r.offset, r.timestamp_ms, r.value)
            for r in kafka_io.read_topic(s.kafka, s.topics.events)
        ),
        rules,
    )
    bounds = check.WatermarkBounds(raw, rig.monitor.boundaries.values(), rules.lateness_ms)
    aggregates = [r.value for r in kafka_io.read_topic(s.kafka, s.topics.aggregates)]
    late = [
        check.LateListing.from_record(r.value, {name: r.header(name) for name in r.headers})
        for r in kafka_io.read_topic(s.kafka, s.topics.late)
    ]
    dlq = [r.header(S.HEADER_SOURCE) for r in kafka_io.read_topic(s.kafka, s.topics.dlq)]
    truth = check.Truth.from_summaries([main.summary], closed_before=closer_minute)
    judged = [a for a in aggregates if json.loads(a)["window_start"] < closer_minute]
    result = check.check_stream_output(truth, raw, bounds, judged, late, dlq, rules, closer_minute)
    return result, judged, (raw, late, dlq)


def spend_rows(settings: Settings) -> list[tuple[str, str, int, int]]:
    """The budget database's spend: (ad_id, period, spend_micros, records) rows."""
    import sqlalchemy as sa

    engine = sa.create_engine(settings.budget_db)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT ad_id, period, spend_micros, records FROM budget_spend")).all()
    finally:
        engine.dispose()
    return [(r[0], r[1], int(r[2]), int(r[3])) for r in rows]


def check_tables(rig: Rig) -> dict:
    """The Delta tables of every hour against Kafka (adpipe.tools.table_verify,
    as ``adpipe verify --hour H --tables-only``), in one Spark session."""
    from adpipe.lakehouse import load
    from adpipe.lakehouse.metastore import metastore_session
    from adpipe.tools import table_verify

    spark = metastore_session(rig.ctx.settings, "adpipe-chaos-check")
    results, ok = {}, True
    try:
        for hour in rig.loads.hours:
            report = table_verify.check_hour(rig.ctx.settings, load.parse_hour(hour), spark)
            (rig.ctx.logs / f"verify-tables-{hour}.json").write_text(json.dumps(report, indent=2, default=str))
            results[hour] = report["ok"]
            ok = ok and report["ok"] and rig.loads.done.get(hour, 0) > 0
    finally:
        spark.stop()
    return {"ok": ok, "hours": list(results), "match": results, "loads": rig.loads.done}
