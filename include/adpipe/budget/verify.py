"""The budget part of ``adpipe verify``: the budget database against the
aggregates topic, read again.

Read independently of the service's batch path: the aggregates with a plain
read_committed consumer (``kafka_io.read_topic``) up to the service's
offsets (records beyond them are lag), parsed with the one parser
(``aggregate.parse_aggregate``), every copy of each record_uuid compared here.
Checked:

* each record_uuid charged once, by the copy the ledger names, with that
  copy's counts and revision; the other copies are duplicates (same counts)
  or quarantined conflicts (other counts); malformed records and records the
  database refused are quarantined;
* revisions, per window (ad_id, window_start): each revision charged at most
  once, in revision order, each against the revision charged before it (its
  base: the ledger row before it, counts included), never with a count below
  its base's; its charge recomputed as the price of its counts less the
  price of its base's, at the prices the ledger row says it was charged at
  (prices change; a charge keeps its price), so a window's charges add up to
  its latest charged revision's counts at those prices; the window's
  ``budget_windows`` row names that revision; a copy not charged is an older
  revision than the window's charged one (a replay, or read after a newer
  one), or a revision quarantined for having fewer events than one charged;
  any other copy not charged is a finding (``not_charged``);
* spend per (ad, period) equals the recomputed charges (of ledger rows
  whose records retention has deleted too, from their own counts), plus the
  totals ``budget prune`` moved out of the ledger;
* pause states: paused exactly where spend has reached today's budget; each
  budget event once in the topic, each (ad, period)'s events numbered
  1..n, alternating paused / resumed;
* offset gaps (records deleted by retention before they were charged) fail
  the check until an operator has dealt with them.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import sqlalchemy as sa
from confluent_kafka import KafkaException
from sqlalchemy.exc import OperationalError

from adpipe import kafka_io
from adpipe.budget import db, pricing
from adpipe.budget.aggregate import Aggregate, BadAggregate, parse_aggregate
from adpipe.budget.money import Price, period_of, spend_micros
from adpipe.budget.status import PAUSED, desired_state
from adpipe.settings import Settings

LIST_LIMIT = 50


def _skipped(why: str) -> dict:
    return {"status": "skipped", "ok": True, "why": why, "problems": 0}


def _error(exc: BaseException) -> dict:
    return {"status": "error", "ok": False, "why": f"{type(exc).__name__}: {str(exc).splitlines()[0]}", "problems": 1}


def check(settings: Settings) -> dict:
    """The budget section of the verify report; ``ok`` is True when skipped
    (no budget database or no ledger for this run)."""
    url = settings.budget_db
    if url.startswith("sqlite"):
        path = sa.engine.make_url(url).database
        if not path or not Path(path).exists():
            return _skipped(f"no budget database ({url})")
    engine = sa.create_engine(url)
    try:
        try:
            with engine.connect() as conn:
                if not sa.inspect(conn).has_table("budget_ledger"):
                    return _skipped("the budget database has no ledger")
                if not sa.inspect(conn).has_table(db.windows.name):
                    return {
                        "status": "error",
                        "ok": False,
                        "why": "the budget database predates revisions (no budget_windows): start adpipe budget "
                        "once to upgrade it",
                        "problems": 1,
                    }
                return _check(settings, conn)
        except OperationalError as exc:
            if "does not exist" in str(exc):
                return _skipped("the budget database does not exist")
            return _error(exc)
        except Exception as exc:  # noqa: BLE001 - the report says why; verify must finish
            return _error(exc)
    finally:
        engine.dispose()


Copy = tuple[Aggregate, int, int]  # the aggregate, its partition and offset


def _check(settings: Settings, conn: sa.Connection) -> dict:
    topic = settings.topics.aggregates
    group = settings.budget_group
    consumed = dict(
        conn.execute(
            sa.select(db.offsets.c.kafka_partition, db.offsets.c.next_offset).where(
                db.offsets.c.group_id == group, db.offsets.c.topic == topic
            )
        ).all()
    )
    if not consumed:
        return _skipped(f"consumer group {group} has consumed nothing of {topic}")

    # The aggregates the service has read, read again independently.
    copies: dict[str, list[Copy]] = defaultdict(list)
    malformed: set[tuple[int, int]] = set()
    lag = 0
    records_read = 0
    for rec in kafka_io.read_topic(settings.kafka, topic):
        if rec.offset >= consumed.get(rec.partition, 0):
            lag += 1
            continue
        records_read += 1
        try:
            copies[(agg := parse_aggregate(rec.value)).record_uuid].append((agg, rec.partition, rec.offset))
        except BadAggregate:
            malformed.add((rec.partition, rec.offset))
    log_start = kafka_io.start_offsets(settings.kafka, topic)

    ledger_rows = list(conn.execute(sa.select(db.ledger).where(db.ledger.c.kafka_topic == topic)))
    quarantine = {
        (r.kafka_partition, r.kafka_offset): (r.kind or "malformed")
        for r in conn.execute(
            sa.select(db.quarantine.c.kafka_partition, db.quarantine.c.kafka_offset, db.quarantine.c.kind).where(
                db.quarantine.c.group_id == group, db.quarantine.c.kafka_topic == topic
            )
        )
    }
    findings: dict[str, list] = defaultdict(list)
    expected: dict[tuple[str, str], int] = defaultdict(int)
    for position in sorted(malformed):
        if quarantine.get(position) != "malformed":
            findings["malformed_not_quarantined"].append(list(position))

    # Each ledger row against the copy of the topic it names.
    charged_copy: dict[str, Copy] = {}
    beyond_retention = 0
    for row in ledger_rows:
        found = copies.get(row.record_uuid)
        if found is None:  # not read: retention deleted it, or the ledger holds what the topic never had
            if row.kafka_offset < log_start.get(row.kafka_partition, 0):
                beyond_retention += 1
            else:
                findings["ledger_row_unexplained"].append(row.record_uuid)
            continue
        copy = next((c for c in found if (c[1], c[2]) == (row.kafka_partition, row.kafka_offset)), None)
        if copy is None:
            findings["ledger_copy_not_in_topic"].append(row.record_uuid)
            continue
        charged_copy[row.record_uuid] = copy
        agg = copy[0]
        if (row.ad_id, row.window_start, row.impressions, row.clicks, row.revision or 0) != (
            *agg.counts(),
            agg.revision,
        ):
            findings["ledger_counts_differ"].append(row.record_uuid)

    # Each window's charged revisions: one charge each, each the difference from the one before.
    latest = _check_revisions(conn, topic, settings.budget_period, ledger_rows, expected, findings)

    # Every copy the service read and did not charge, explained.
    duplicates = superseded = 0
    ledger_uuids = {row.record_uuid for row in ledger_rows}
    for record_uuid, found in copies.items():
        charged = charged_copy.get(record_uuid)
        for copy in found:
            if copy is charged:
                continue
            agg, partition, offset = copy
            kind = quarantine.get((partition, offset))
            top = latest.get((agg.ad_id, agg.window_start))
            if charged is not None:
                if agg.counts() == charged[0].counts():
                    duplicates += 1
                elif kind != "conflict":
                    findings["conflict_not_quarantined"].append([record_uuid, partition, offset])
            elif record_uuid in ledger_uuids:  # its ledger row names another copy: a finding above
                pass
            elif kind in ("rejected", "malformed"):
                pass
            elif kind == "conflict":  # a revision with fewer events than one charged of its window
                if top is None or (agg.impressions >= top[1] and agg.clicks >= top[2]):
                    findings["conflict_unfounded"].append([record_uuid, partition, offset])
            elif top is not None and agg.revision <= top[0]:
                superseded += 1  # an older revision than the one charged, or a replay under another uuid
            else:
                findings["not_charged"].append([record_uuid, partition, offset])
    for a, period, micros in conn.execute(
        sa.select(db.ledger_pruned.c.ad_id, db.ledger_pruned.c.period, db.ledger_pruned.c.spend_micros)
    ):
        expected[(a, period)] += micros

    actual = dict(
        ((a, period), micros)
        for a, period, micros in conn.execute(sa.select(db.spend.c.ad_id, db.spend.c.period, db.spend.c.spend_micros))
    )
    wrong_periods = [
        {"ad_id": a, "period": p, "expected_micros": expected.get((a, p), 0), "actual_micros": actual.get((a, p), 0)}
        for a, p in sorted(set(expected) | set(actual))
        if expected.get((a, p), 0) != actual.get((a, p), 0)
    ]
    gaps = [
        {
            "partition": r.kafka_partition,
            "from_offset": r.from_offset,
            "to_offset": r.to_offset,
            "lost_offsets": r.lost_offsets,
        }
        for r in conn.execute(
            sa.select(db.gaps)
            .where(db.gaps.c.group_id == group, db.gaps.c.topic == topic)
            .order_by(db.gaps.c.kafka_partition, db.gaps.c.from_offset)
        )
    ]
    states = _check_states(settings, conn, expected, findings)
    kinds = Counter(quarantine.values())
    problems = len(wrong_periods) + len(gaps) + sum(len(v) for v in findings.values())
    return {
        "status": "ok" if problems == 0 else "failed",
        "ok": problems == 0,
        "group": group,
        "consumed_through": dict(sorted(consumed.items())),
        "lag_records": lag,
        "records_read": records_read,
        "distinct_record_uuids": len(copies),
        "duplicate_copies": duplicates,
        "revisions_charged": sum(1 for row in ledger_rows if row.base_revision is not None),
        "superseded_copies": superseded,
        "malformed": len(malformed),
        "quarantined": dict(sorted(kinds.items())),
        "conflicts": kinds.get("conflict", 0),
        "rejected_by_database": kinds.get("rejected", 0),
        "ledger_rows_beyond_retention": beyond_retention,
        "ads": len({a for a, _p in expected}),
        "expected_spend_micros": sum(expected.values()),
        "actual_spend_micros": sum(actual.values()),
        "wrong_period_spend": wrong_periods[:LIST_LIMIT],
        "gaps": gaps[:LIST_LIMIT],
        "lost_to_retention_offsets": sum(g["lost_offsets"] for g in gaps),
        **states,
        **{name: items[:LIST_LIMIT] for name, items in sorted(findings.items())},
        "problems": problems,
    }


Window = tuple[str, str]  # (ad_id, window_start)


def _check_revisions(
    conn: sa.Connection,
    topic: str,
    period: str,
    ledger_rows: list[sa.Row],
    expected: dict[tuple[str, str], int],
    findings: dict[str, list],
) -> dict[Window, tuple[int, int, int]]:
    """Per window, its ledger rows in revision order (a row of an earlier
    version, without a revision, is a revision 0 charged in full): each
    revision charged once; each row's base the row before it (the first
    one's: none, or an older revision no longer in the ledger); no count
    below its base; its charge the price of its counts less the price of its
    base's, at the prices it was charged at (added to ``expected``). The
    window's ``budget_windows`` row (kept by the service from the first
    revision it charged) names the last one. Returns each window's last
    charged (revision, impressions, clicks)."""
    by_window: dict[Window, list[sa.Row]] = defaultdict(list)
    for row in ledger_rows:
        by_window[(row.ad_id, row.window_start)].append(row)
    bases = {
        (w.ad_id, w.window_start): (w.revision, w.impressions, w.clicks)
        for w in conn.execute(sa.select(db.windows).where(db.windows.c.kafka_topic == topic))
    }
    latest: dict[Window, tuple[int, int, int]] = {}
    for window, rows in by_window.items():
        rows.sort(key=lambda r: (r.revision or 0, r.applied_at, r.record_uuid))
        before: tuple[int | None, int, int] | None = None
        for row in rows:
            revision = row.revision or 0
            base = (row.base_revision, row.base_impressions or 0, row.base_clicks or 0)
            where = [*window, revision, row.record_uuid]
            if before is not None and before[0] == revision:
                findings["revision_charged_twice"].append(where)
            elif before is not None and base != before:
                findings["revision_base_wrong"].append(where)
            elif before is None and base[0] is not None and base[0] >= revision:
                findings["revision_base_wrong"].append(where)
            if row.impressions < base[1] or row.clicks < base[2]:
                findings["revision_below_its_base"].append(where)
            price = Price(row.cpm_micros, row.cpc_micros)
            charge = spend_micros(row.impressions, row.clicks, price) - spend_micros(base[1], base[2], price)
            if charge != row.spend_micros:
                findings["ledger_charge_wrong"].append(row.record_uuid)
            expected[(row.ad_id, period_of(row.window_start, period))] += charge
            before = (revision, row.impressions, row.clicks)
        assert before is not None
        latest[window] = (before[0], before[1], before[2])
        if any(r.revision is not None for r in rows) and bases.get(window) != latest[window]:
            findings["window_base_wrong"].append([*window, bases.get(window), latest[window]])
    return latest


def _check_states(
    settings: Settings, conn: sa.Connection, spend: dict[tuple[str, str], int], findings: dict[str, list]
) -> dict:
    """Pause states against spend and today's budgets; the budget events in
    the topic against the outbox."""
    book = pricing.load_price_book(conn)
    expected_paused = {
        k for k, micros in spend.items() if desired_state(micros, book.price(k[0]).budget_micros) == PAUSED
    }
    paused = {
        (a, p)
        for a, p, state in conn.execute(sa.select(db.status.c.ad_id, db.status.c.period, db.status.c.state))
        if state == PAUSED
    }
    findings["paused_missing"].extend(list(k) for k in sorted(expected_paused - paused))
    findings["paused_unexpected"].extend(list(k) for k in sorted(paused - expected_paused))
    outbox = {r.event_id: r for r in conn.execute(sa.select(db.events))}
    pending = sum(1 for r in outbox.values() if r.sent_at is None)
    seen: Counter[str] = Counter()
    by_key: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    try:
        for rec in kafka_io.read_topic(settings.kafka, settings.topics.budget_events):
            try:
                body = json.loads(rec.value or b"")
                seen[body["event_id"]] += 1
                by_key[(body["ad_id"], body["period"])].append((int(body.get("generation", 1)), body["event_type"]))
            except (ValueError, KeyError, TypeError):
                findings["events_unreadable"].append([rec.partition, rec.offset])
    except KafkaException as exc:  # no budget-events topic: nothing was published
        if outbox:
            raise RuntimeError(f"cannot read {settings.topics.budget_events}: {exc}") from exc
    findings["events_duplicated"].extend(sorted(e for e, n in seen.items() if n > 1))
    findings["events_missing"].extend(sorted(e for e, r in outbox.items() if r.sent_at is not None and e not in seen))
    findings["events_unexpected"].extend(sorted(e for e in seen if e not in outbox))
    for key, items in sorted(by_key.items()):
        items = sorted(set(items))
        numbers = [g for g, _t in items]
        alternating = all(t == ("ad_paused" if g % 2 else "ad_resumed") for g, t in items)
        if numbers != list(range(1, len(numbers) + 1)) or not alternating:
            findings["events_out_of_order"].append(list(key))
    return {
        "paused": len(paused),
        "events": sum(seen.values()),
        "events_resumed": sum(1 for items in by_key.values() for _g, t in items if t == "ad_resumed"),
        "events_pending": pending,
    }
