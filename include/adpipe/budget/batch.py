"""The database side of one batch of the budget service: Steps 1-6 of the
commit protocol (Steps 7-9 and what a crash leaves behind are in
:mod:`adpipe.budget.service`). Everything here runs inside the caller's
transaction; nothing is committed here.

  Step 1. Lock this batch's partitions' rows of ``budget_offsets``
          (``SELECT ... FOR UPDATE``) and compare each with the offset this
          instance started the partition from. A partition whose row moved
          (another instance applied it meanwhile: a rebalance this instance
          has not seen yet, or it is a zombie) is dropped from the batch and
          re-sought after the transaction: nothing is applied twice, nothing
          is skipped.
  Step 2. Parse; an aggregate that is not valid JSON of the contract goes to
          ``budget_quarantine`` with the reason (and its offset is consumed).
  Step 3. Insert the ledger rows, insert-only by ``record_uuid``
          (``ON CONFLICT DO NOTHING RETURNING``): a record_uuid seen before, in
          this batch or any earlier one, is a no-op. The charge of each new
          row is priced now (money.spend_micros) and stored with it.
  Step 4. Add the new rows' charges to ``budget_spend`` per (ad, period).
  Step 5. For each (ad, period) whose new spend reached its budget, insert a
          ``budget_pauses`` row (primary key (ad_id, period): once).
  Step 6. Write the partitions' next offsets to ``budget_offsets``.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from confluent_kafka import Message
from sqlalchemy.engine import Connection

from adpipe.budget import db
from adpipe.budget.money import Aggregate, BadAggregate, Price, parse_aggregate, period_of, spend_micros
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")

EVENT_NAMESPACE = uuid.UUID("4d1f5b8e-5a39-4d0b-9a52-2f0c7f3b9e10")


def event_id(ad_id: str, period: str) -> str:
    """The budget event's id: the same for the same (ad, period), always."""
    return str(uuid.uuid5(EVENT_NAMESPACE, f"{ad_id}|{period}"))


@dataclass
class BatchResult:
    records: int = 0
    applied: int = 0
    duplicates: int = 0
    already_applied: int = 0
    quarantined: int = 0
    stale_partitions: dict[int, int | None] = field(default_factory=dict)
    spend_added_micros: int = 0
    paused: list[tuple[str, str]] = field(default_factory=list)
    next_offsets: dict[int, int] = field(default_factory=dict)


SpendKey = tuple[str, str]  # (ad_id, period)


def apply_batch(
    conn: Connection,
    settings: Settings,
    topic: str,
    messages: Sequence[Message],
    started_from: dict[int, int | None],
) -> BatchResult:
    """Steps 1-6 of the module doc, inside the caller's transaction.

    ``started_from``: per partition, the offset this instance's consumption
    started from (the database's value when it was assigned or last applied;
    None: no row, read from the beginning)."""
    group = settings.budget_group
    result = BatchResult(records=len(messages))
    by_partition: dict[int, list[Message]] = defaultdict(list)
    for msg in messages:
        by_partition[msg.partition()].append(msg)

    # Step 1
    usable = _claim_partitions(conn, group, topic, by_partition, started_from, result)
    # Step 2
    parsed = _parse_or_quarantine(conn, group, topic, usable, result)
    # Step 3
    rows, inserted, prices = _insert_ledger(conn, settings, topic, parsed, result)
    # Step 4
    new_spend, crossing_record = _add_spend(conn, rows, inserted, result)
    # Step 5
    _pause_reached(conn, new_spend, crossing_record, prices, result)
    # Step 6
    _store_next_offsets(conn, group, topic, result.next_offsets)
    return result


def _claim_partitions(
    conn: Connection,
    group: str,
    topic: str,
    by_partition: dict[int, list[Message]],
    started_from: dict[int, int | None],
    result: BatchResult,
) -> list[Message]:
    """Step 1: lock the partitions' offset rows; returns the messages still to
    apply. Sets the stale partitions, the already-applied count and the next
    offsets of the partitions kept."""
    stored_rows = conn.execute(
        sa.select(db.offsets.c.kafka_partition, db.offsets.c.next_offset)
        .where(
            db.offsets.c.group_id == group,
            db.offsets.c.topic == topic,
            db.offsets.c.kafka_partition.in_(sorted(by_partition)),
        )
        .order_by(db.offsets.c.kafka_partition)
        .with_for_update()
    ).all()
    stored: dict[int, int] = {p: o for p, o in stored_rows}
    usable: list[Message] = []
    for p in sorted(by_partition):
        if stored.get(p) != started_from.get(p):
            result.stale_partitions[p] = stored.get(p)
            continue
        start = stored.get(p, -1)
        for msg in by_partition[p]:
            if msg.offset() < start:
                result.already_applied += 1
            else:
                usable.append(msg)
        result.next_offsets[p] = by_partition[p][-1].offset() + 1
    return usable


def _parse_or_quarantine(
    conn: Connection, group: str, topic: str, usable: list[Message], result: BatchResult
) -> list[tuple[Aggregate, Message]]:
    """Step 2: the parsed aggregates; the others go to the quarantine table."""
    parsed = []
    bad = []
    for msg in usable:
        try:
            parsed.append((parse_aggregate(msg.value()), msg))
        except BadAggregate as exc:
            raw = msg.value()
            bad.append(
                {
                    "kafka_topic": topic,
                    "kafka_partition": msg.partition(),
                    "kafka_offset": msg.offset(),
                    "group_id": group,
                    "reason": str(exc)[:500],
                    "value": None if raw is None else raw[:4000].decode("utf-8", "replace"),
                }
            )
    if bad:
        conn.execute(
            db.insert(conn, db.quarantine).on_conflict_do_nothing(
                index_elements=["kafka_topic", "kafka_partition", "kafka_offset"]
            ),
            bad,
        )
        result.quarantined = len(bad)
        for row in bad:
            log.warning("quarantined %s/%d/%d: %s", topic, row["kafka_partition"], row["kafka_offset"], row["reason"])
    return parsed


def _insert_ledger(
    conn: Connection,
    settings: Settings,
    topic: str,
    parsed: list[tuple[Aggregate, Message]],
    result: BatchResult,
) -> tuple[list[dict], set[str], dict[str, Price]]:
    """Step 3: dedupe in the batch first, then insert-only on the key.
    Returns the priced ledger rows, the record_uuids actually inserted and
    the prices (Step 5 needs the budgets)."""
    firsts: dict[str, tuple] = {}
    for agg, msg in parsed:
        if agg.record_uuid in firsts:
            result.duplicates += 1
        else:
            firsts[agg.record_uuid] = (agg, msg)
    prices = db.resolve_prices(conn, (agg.ad_id for agg, _ in firsts.values())) if firsts else {}
    rows = []
    for record_uuid in sorted(firsts):
        agg, msg = firsts[record_uuid]
        price = prices[agg.ad_id]
        rows.append(
            {
                "record_uuid": record_uuid,
                "ad_id": agg.ad_id,
                "window_start": agg.window_start,
                "period": period_of(agg.window_start, settings.budget_period),
                "impressions": agg.impressions,
                "clicks": agg.clicks,
                "cpm_micros": price.cpm_micros,
                "cpc_micros": price.cpc_micros,
                "spend_micros": spend_micros(agg.impressions, agg.clicks, price),
                "kafka_topic": topic,
                "kafka_partition": msg.partition(),
                "kafka_offset": msg.offset(),
            }
        )
    inserted: set[str] = set()
    if rows:
        stmt = (
            db.insert(conn, db.ledger)
            .on_conflict_do_nothing(index_elements=["record_uuid"])
            .returning(db.ledger.c.record_uuid)
        )
        inserted = {r[0] for r in conn.execute(stmt, rows)}
    result.applied = len(inserted)
    result.duplicates += len(rows) - len(inserted)
    return rows, inserted, prices


def _add_spend(
    conn: Connection, rows: list[dict], inserted: set[str], result: BatchResult
) -> tuple[dict[SpendKey, int], dict[SpendKey, dict]]:
    """Step 4: returns the new spend per (ad, period) touched, and per key the
    last inserted ledger row (the record that made the spend reach a budget)."""
    delta: dict[SpendKey, list[int]] = defaultdict(lambda: [0, 0])
    crossing_record: dict[SpendKey, dict] = {}
    for row in rows:
        if row["record_uuid"] in inserted:
            key = (row["ad_id"], row["period"])
            delta[key][0] += row["spend_micros"]
            delta[key][1] += 1
            crossing_record[key] = row
    new_spend: dict[SpendKey, int] = {}
    if delta:
        up = db.insert(conn, db.spend)
        up = up.on_conflict_do_update(
            index_elements=["ad_id", "period"],
            set_={
                "spend_micros": db.spend.c.spend_micros + up.excluded.spend_micros,
                "records": db.spend.c.records + up.excluded.records,
                "updated_at": sa.func.now(),
            },
        ).returning(db.spend.c.ad_id, db.spend.c.period, db.spend.c.spend_micros)
        values = [
            {"ad_id": a, "period": p, "spend_micros": d[0], "records": d[1]} for (a, p), d in sorted(delta.items())
        ]
        new_spend = {(a, p): s for a, p, s in conn.execute(up, values)}
        result.spend_added_micros = sum(d[0] for d in delta.values())
    return new_spend, crossing_record


def _pause_reached(
    conn: Connection,
    new_spend: dict[SpendKey, int],
    crossing_record: dict[SpendKey, dict],
    prices: dict[str, Price],
    result: BatchResult,
) -> None:
    """Step 5: a pause row (the outbox) per (ad, period) whose spend reached
    its budget; ``result.paused`` gets the rows new in this batch."""
    reached = []
    for key in sorted(new_spend):
        budget = prices[key[0]].budget_micros
        if budget is not None and new_spend[key] >= budget:
            row = crossing_record[key]
            reached.append(
                {
                    "ad_id": key[0],
                    "period": key[1],
                    "event_id": event_id(*key),
                    "spend_micros": new_spend[key],
                    "budget_micros": budget,
                    "record_uuid": row["record_uuid"],
                    "window_start": row["window_start"],
                }
            )
    if reached:
        stmt = (
            db.insert(conn, db.pauses)
            .on_conflict_do_nothing(index_elements=["ad_id", "period"])
            .returning(db.pauses.c.ad_id, db.pauses.c.period)
        )
        result.paused = sorted((a, p) for a, p in conn.execute(stmt, reached))


def _store_next_offsets(conn: Connection, group: str, topic: str, next_offsets: dict[int, int]) -> None:
    """Step 6: the partitions' next offsets, in the same transaction as the
    ledger rows they cover."""
    if next_offsets:
        up = db.insert(conn, db.offsets)
        up = up.on_conflict_do_update(
            index_elements=["group_id", "topic", "kafka_partition"],
            set_={"next_offset": up.excluded.next_offset, "updated_at": sa.func.now()},
        )
        conn.execute(
            up,
            [
                {"group_id": group, "topic": topic, "kafka_partition": p, "next_offset": o}
                for p, o in sorted(next_offsets.items())
            ],
        )


def stored_offsets(conn: Connection, group: str, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    """The database's next offset per partition (no row: not in the dict)."""
    rows = conn.execute(
        sa.select(db.offsets.c.kafka_partition, db.offsets.c.next_offset).where(
            db.offsets.c.group_id == group,
            db.offsets.c.topic == topic,
            db.offsets.c.kafka_partition.in_(list(partitions)),
        )
    ).all()
    return {p: o for p, o in rows}
