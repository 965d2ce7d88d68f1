"""The database side of one batch of the budget service: Steps 1-6 of the
commit protocol (Steps 7-9 and what a crash leaves behind are in
:mod:`adpipe.budget.commit`). Everything here runs inside the caller's
transaction; nothing is committed here.

  Step 1. Lock this batch's partitions' rows of ``budget_offsets``
          (``SELECT ... FOR UPDATE``) and compare each with the offset this
          instance started the partition from. A partition whose row moved
          (another instance applied it meanwhile: a rebalance this instance
          has not seen yet, or it is a zombie) is dropped from the batch and
          re-sought after the transaction: nothing is applied twice, nothing
          is skipped. (Also the ``pricing_settled`` row FOR SHARE: see
          :mod:`adpipe.budget.status`.)
  Step 2. Parse and validate with the one parser (``aggregate.parse_aggregate``):
          an aggregate that is not one of the contract, or holds what the
          database cannot (a field longer than its column, a count beyond
          BIGINT, NUL, an unpaired surrogate), goes to ``budget_quarantine``
          as ``malformed`` with the reason, and its offset is consumed. So do
          records the caller names as ``rejected`` (the database refused them
          alone: see the batch splitting of :mod:`adpipe.budget.commit`).
  Step 3. Charge each window's revisions (:mod:`adpipe.budget.revisions`):
          (a) dedupe in the batch by ``record_uuid``: a second copy with the
          same counts is a duplicate, with other counts a ``conflict``
          (quarantined; the first copy goes on);
          (b) lock the batch's windows' rows of ``budget_windows`` (FOR
          UPDATE, in key order): each window's base, the revision charged
          last; a window with no row yet has what an earlier version charged
          of it (its ledger rows without a revision) or nothing;
          (c) in a savepoint: plan each window's records in revision order
          (above the base and no count below it: charged, the difference
          from the base priced now and stored with the ledger row; at or
          below the base: not charged), create the rows of new windows
          (insert-only), insert the ledger rows (insert-only by
          ``record_uuid``) and set the windows' new bases. A window another
          instance created since (b), or a ledger row another one inserted
          (a copy of the record_uuid in another partition), rolls the
          savepoint back and plans again with what they wrote;
          (d) records not charged: a record_uuid in the ledger with the same
          counts is a duplicate, with other counts a ``conflict``; one not in
          the ledger is an older revision than its window's (superseded:
          counted, logged); a revision with fewer events than its base is a
          ``conflict``. Conflicts are quarantined.
  Step 4. Add the new rows' charges to ``budget_spend`` per (ad, period).
  Step 5. Pause each (ad, period) whose new spend reached its budget
          (``status.settle_charged``: a status transition and its outbox row).
  Step 6. Write the partitions' next offsets to ``budget_offsets`` as a
          compare-and-set: an UPDATE of the value Step 1 saw, or for a
          partition with no row yet an insert that must not meet one. If
          another instance created the row meanwhile, :class:`StaleOffsets`
          aborts the whole transaction. An offset never moves backwards: a
          batch applied already (held through a revoke and a re-assignment,
          e.g. while an outage was waited out) keeps the stored offset.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from confluent_kafka import Message
from sqlalchemy.engine import Connection

from adpipe.budget import db, pricing, revisions, status, writes
from adpipe.budget.aggregate import Aggregate, BadAggregate, parse_aggregate
from adpipe.budget.money import Price, charge_micros, period_of
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")

MessageKey = tuple[int, int]  # (partition, offset)


class StaleOffsets(RuntimeError):
    """Step 6: another instance wrote a partition's first offsets row while
    this batch ran; the transaction must roll back."""

    def __init__(self, partitions: list[int]) -> None:
        super().__init__(f"partitions {partitions}: another instance applied them first")
        self.partitions = partitions


COUNTED = (
    "records", "applied", "duplicates", "already_applied", "malformed", "rejected", "conflicts", "superseded",
    "revised",
)


@dataclass
class BatchResult:
    records: int = 0
    applied: int = 0
    duplicates: int = 0
    already_applied: int = 0
    malformed: int = 0
    rejected: int = 0
    conflicts: int = 0
    superseded: int = 0  # not charged: their window's revision charged is at or above theirs
    revised: int = 0  # charged against a revision of their window charged before (a difference)
    stale_partitions: dict[int, int | None] = field(default_factory=dict)
    spend_added_micros: int = 0
    transitions: list[status.Transition] = field(default_factory=list)
    next_offsets: dict[int, int] = field(default_factory=dict)

    @property
    def quarantined(self) -> int:
        return self.malformed + self.rejected + self.conflicts

    @property
    def paused(self) -> list[tuple[str, str]]:
        return [(t.ad_id, t.period) for t in self.transitions if t.state == status.PAUSED]

    def merge(self, other: BatchResult) -> BatchResult:
        """This batch's result followed by ``other``'s (a split batch)."""
        merged = BatchResult()
        for name in COUNTED:
            setattr(merged, name, getattr(self, name) + getattr(other, name))
        merged.spend_added_micros = self.spend_added_micros + other.spend_added_micros
        merged.transitions = self.transitions + other.transitions
        merged.stale_partitions = {**self.stale_partitions, **other.stale_partitions}
        merged.next_offsets = {**self.next_offsets, **other.next_offsets}
        return merged


SpendKey = status.SpendKey


def apply_batch(
    conn: Connection,
    settings: Settings,
    topic: str,
    messages: Sequence[Message],
    started_from: dict[int, int | None],
    rejected: dict[MessageKey, str] | None = None,
) -> BatchResult:
    """Steps 1-6 of the module doc, inside the caller's transaction.

    ``started_from``: per partition, the offset this instance's consumption
    started from (the database's value when it was assigned or last applied;
    None: no row, read from the beginning). ``rejected``: records to
    quarantine with the database's reason instead of charging them."""
    group = settings.budget_group
    result = BatchResult(records=len(messages))
    by_partition: dict[int, list[Message]] = defaultdict(list)
    for msg in messages:
        by_partition[msg.partition()].append(msg)

    # Step 1
    status.lock_pricing_shared(conn)
    usable = _claim_partitions(conn, group, topic, by_partition, started_from, result)
    # Step 2
    parsed = _parse_or_quarantine(conn, group, topic, usable, rejected or {}, result)
    # Step 3
    rows, prices = _charge(conn, settings, group, topic, parsed, result)
    # Step 4
    new_spend, crossing_record = _add_spend(conn, rows, result)
    # Step 5
    result.transitions = status.settle_charged(
        conn, new_spend, {ad: price.budget_micros for ad, price in prices.items()}, crossing_record
    )
    # Step 6
    _store_next_offsets(conn, group, topic, result.next_offsets, started_from)
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
        # Never backwards: records below the stored offset were applied already.
        result.next_offsets[p] = max(by_partition[p][-1].offset() + 1, start)
    return usable


def quarantine_row(
    group: str, topic: str, msg: Message, kind: str, reason: str, record_uuid: str | None = None
) -> dict:
    """A ``budget_quarantine`` row; its text is made storable whatever the
    record holds (the record itself stays in Kafka at its offset)."""
    raw = msg.value()
    return {
        "kafka_topic": topic,
        "kafka_partition": msg.partition(),
        "kafka_offset": msg.offset(),
        "group_id": group,
        "kind": kind,
        "reason": writes.storable(reason, 500),
        "record_uuid": writes.storable(record_uuid, 64),
        "value": None if raw is None else writes.storable(raw[:4000].decode("utf-8", "backslashreplace")),
    }


_RESULT_FIELD = {"malformed": "malformed", "rejected": "rejected", "conflict": "conflicts"}


def _quarantine(conn: Connection, topic: str, rows: list[dict], result: BatchResult) -> None:
    if not rows:
        return
    conn.execute(
        db.insert(conn, db.quarantine).on_conflict_do_nothing(
            index_elements=["kafka_topic", "kafka_partition", "kafka_offset"]
        ),
        rows,
    )
    for row in rows:
        counter = _RESULT_FIELD[row["kind"]]
        setattr(result, counter, getattr(result, counter) + 1)
        log.warning(
            "quarantined %s/%d/%d (%s): %s",
            topic,
            row["kafka_partition"],
            row["kafka_offset"],
            row["kind"],
            row["reason"],
        )


def _parse_or_quarantine(
    conn: Connection,
    group: str,
    topic: str,
    usable: list[Message],
    rejected: dict[MessageKey, str],
    result: BatchResult,
) -> list[tuple[Aggregate, Message]]:
    """Step 2: the parsed aggregates; the others go to the quarantine table."""
    parsed = []
    bad = []
    for msg in usable:
        why = rejected.get((msg.partition(), msg.offset()))
        if why is not None:
            bad.append(quarantine_row(group, topic, msg, "rejected", why))
            continue
        try:
            parsed.append((parse_aggregate(msg.value()), msg))
        except BadAggregate as exc:
            bad.append(quarantine_row(group, topic, msg, "malformed", str(exc)))
    _quarantine(conn, topic, bad, result)
    return parsed


def _conflict_reason(agg: Aggregate, first: tuple, where: str) -> str:
    ad_id, window_start, impressions, clicks = first
    return (
        f"record_uuid {agg.record_uuid} seen again with other counts: this copy ad_id={agg.ad_id} "
        f"window_start={agg.window_start} impressions={agg.impressions} clicks={agg.clicks}; "
        f"earlier copy ({where}) ad_id={ad_id} window_start={window_start} impressions={impressions} clicks={clicks}"
    )


def _charge(
    conn: Connection,
    settings: Settings,
    group: str,
    topic: str,
    parsed: list[tuple[Aggregate, Message]],
    result: BatchResult,
) -> tuple[list[dict], dict[str, Price]]:
    """Step 3 (a-d of the module doc). Returns the ledger rows inserted and
    the prices (Step 5 needs the budgets)."""
    # Step 3a
    firsts: dict[str, tuple[Aggregate, Message]] = {}
    bad: list[dict] = []
    for agg, msg in parsed:
        first = firsts.get(agg.record_uuid)
        if first is None:
            firsts[agg.record_uuid] = (agg, msg)
        elif first[0].counts() == agg.counts():
            result.duplicates += 1
        else:
            where = f"{topic}/{first[1].partition()}/{first[1].offset()}"
            bad.append(
                quarantine_row(
                    group, topic, msg, "conflict", _conflict_reason(agg, first[0].counts(), where), agg.record_uuid
                )
            )
    if not firsts:
        _quarantine(conn, topic, bad, result)
        return [], {}
    prices = pricing.resolve_prices(conn, {agg.ad_id for agg, _ in firsts.values()})
    # Step 3b
    keys = sorted({revisions.window_key(agg) for agg, _ in firsts.values()})
    states = revisions.lock_windows(conn, topic, keys)
    missing = {k for k in keys if k not in states}
    states.update(revisions.charged_before_revisions(conn, topic, sorted(missing)))
    # Step 3c
    left_out: set[str] = set()  # record_uuids the ledger already holds (a copy charged meanwhile)
    while True:
        plan = revisions.plan_revisions(states, (am for u, am in firsts.items() if u not in left_out))
        rows: list[dict] = []
        unpriceable = []
        for agg, msg, base in plan.charged:
            price = prices[agg.ad_id]
            try:
                charge = charge_micros(agg, price, base.impressions, base.clicks)
            except BadAggregate as exc:
                unpriceable.append((agg, msg, str(exc)))
                continue
            rows.append(_ledger_row(settings, topic, agg, msg, base, price, charge))
        if unpriceable:  # quarantined, and the window's next revision charged against the base before it
            for agg, msg, why in unpriceable:
                bad.append(quarantine_row(group, topic, msg, "malformed", why, agg.record_uuid))
                del firsts[agg.record_uuid]
            continue
        rows.sort(key=lambda row: row["record_uuid"])
        savepoint = conn.begin_nested()
        created = revisions.create_windows(
            conn, topic, {k: plan.final.get(k, states.get(k, revisions.NOTHING)) for k in missing}
        )
        raced = missing - created
        if raced:  # another instance met these windows first: theirs are the bases
            savepoint.rollback()
            missing -= raced
            states.update(revisions.lock_windows(conn, topic, sorted(raced)))
            continue
        inserted = writes.insert_new(conn, db.ledger, rows, "record_uuid")
        if len(inserted) < len(rows):  # a copy of these record_uuids was charged meanwhile
            savepoint.rollback()
            left_out |= {row["record_uuid"] for row in rows} - inserted
            continue
        revisions.update_windows(conn, topic, {k: st for k, st in plan.final.items() if k not in missing})
        savepoint.commit()
        break
    result.applied = len(rows)
    result.revised = sum(1 for row in rows if row["base_revision"] is not None)
    # Step 3d
    for agg, msg, base in plan.lower:
        bad.append(
            quarantine_row(group, topic, msg, "conflict", revisions.lower_counts_reason(agg, base), agg.record_uuid)
        )
    not_charged = {agg.record_uuid: (agg, msg, base) for agg, msg, base in plan.superseded}
    not_charged.update({u: (*firsts[u], revisions.NOTHING) for u in left_out})
    bad.extend(_not_charged_again(conn, group, topic, not_charged, result))
    _quarantine(conn, topic, bad, result)
    return rows, prices


def _ledger_row(
    settings: Settings,
    topic: str,
    agg: Aggregate,
    msg: Message,
    base: revisions.WindowState,
    price: Price,
    charge: int,
) -> dict:
    return {
        "record_uuid": agg.record_uuid,
        "ad_id": agg.ad_id,
        "window_start": agg.window_start,
        "period": period_of(agg.window_start, settings.budget_period),
        "impressions": agg.impressions,
        "clicks": agg.clicks,
        "cpm_micros": price.cpm_micros,
        "cpc_micros": price.cpc_micros,
        "spend_micros": charge,
        "kafka_topic": topic,
        "kafka_partition": msg.partition(),
        "kafka_offset": msg.offset(),
        "revision": agg.revision,
        "base_revision": base.revision,
        "base_impressions": base.impressions,
        "base_clicks": base.clicks,
    }


def _not_charged_again(
    conn: Connection,
    group: str,
    topic: str,
    records: dict[str, tuple[Aggregate, Message, revisions.WindowState]],
    result: BatchResult,
) -> list[dict]:
    """Step 3d: records not charged because their window's base is at or
    above their revision, or the ledger has their record_uuid: a record_uuid
    charged before with the same counts is a duplicate, with other counts a
    conflict (quarantine rows returned); one never charged is an older
    revision than the one charged (superseded)."""
    if not records:
        return []
    charged = {
        r.record_uuid: r
        for r in conn.execute(
            sa.select(
                db.ledger.c.record_uuid,
                db.ledger.c.ad_id,
                db.ledger.c.window_start,
                db.ledger.c.impressions,
                db.ledger.c.clicks,
                db.ledger.c.kafka_topic,
                db.ledger.c.kafka_partition,
                db.ledger.c.kafka_offset,
            ).where(writes.key_in(conn, db.ledger.c.record_uuid, sorted(records)))
        )
    }
    bad = []
    superseded = []
    for record_uuid in sorted(records):
        agg, msg, base = records[record_uuid]
        old = charged.get(record_uuid)
        if old is None:
            superseded.append((agg, msg, base))
        elif (old.ad_id, old.window_start, old.impressions, old.clicks) == agg.counts():
            result.duplicates += 1
        else:
            where = f"{old.kafka_topic}/{old.kafka_partition}/{old.kafka_offset}"
            reason = _conflict_reason(agg, (old.ad_id, old.window_start, old.impressions, old.clicks), where)
            bad.append(quarantine_row(group, topic, msg, "conflict", reason, record_uuid))
    result.superseded += len(superseded)
    if superseded:
        agg, msg, base = superseded[0]
        log.info(
            "%d records not charged: their window's revision charged is at or above theirs (a replay, or an older "
            "revision read after a newer one); e.g. %s/%d/%d revision %d of ad_id=%s window_start=%s, revision %s "
            "charged",
            len(superseded),
            topic,
            msg.partition(),
            msg.offset(),
            agg.revision,
            agg.ad_id,
            agg.window_start,
            base.revision,
        )
    return bad


def _add_spend(
    conn: Connection, rows: list[dict], result: BatchResult
) -> tuple[dict[SpendKey, int], dict[SpendKey, dict]]:
    """Step 4: returns the new spend per (ad, period) touched, and per key the
    last inserted ledger row (the record that made the spend reach a budget)."""
    delta: dict[SpendKey, list[int]] = defaultdict(lambda: [0, 0])
    crossing_record: dict[SpendKey, dict] = {}
    for row in rows:
        key = (row["ad_id"], row["period"])
        delta[key][0] += row["spend_micros"]
        delta[key][1] += 1
        crossing_record[key] = row
    new_spend: dict[SpendKey, int] = {}
    if delta:
        values = [
            {"ad_id": a, "period": p, "spend_micros": d[0], "records": d[1]} for (a, p), d in sorted(delta.items())
        ]
        new_spend = writes.add_sums(conn, db.spend, "updated_at", values)
        result.spend_added_micros = sum(d[0] for d in delta.values())
    return new_spend, crossing_record


def _store_next_offsets(
    conn: Connection, group: str, topic: str, next_offsets: dict[int, int], started_from: dict[int, int | None]
) -> None:
    """Step 6: the partitions' next offsets, in the same transaction as the
    ledger rows they cover, as a compare-and-set on what Step 1 saw; never
    below it."""
    first_rows = [p for p in sorted(next_offsets) if started_from.get(p) is None]
    for p in sorted(next_offsets):
        if p in first_rows:
            continue
        stored = started_from[p]
        assert stored is not None
        if next_offsets[p] < stored:  # applied already: the stored offset stays
            next_offsets[p] = stored
        updated = conn.execute(
            sa.update(db.offsets)
            .where(
                db.offsets.c.group_id == group,
                db.offsets.c.topic == topic,
                db.offsets.c.kafka_partition == p,
                db.offsets.c.next_offset == stored,
                db.offsets.c.next_offset <= next_offsets[p],
            )
            .values(next_offset=next_offsets[p], updated_at=sa.func.now())
        ).rowcount
        if updated != 1:  # cannot happen under Step 1's lock; refuse rather than guess
            raise StaleOffsets([p])
    if first_rows:
        created = conn.execute(
            db.insert(conn, db.offsets)
            .on_conflict_do_nothing(index_elements=["group_id", "topic", "kafka_partition"])
            .returning(db.offsets.c.kafka_partition),
            [
                {"group_id": group, "topic": topic, "kafka_partition": p, "next_offset": next_offsets[p]}
                for p in first_rows
            ],
        )
        missing = sorted(set(first_rows) - {r[0] for r in created})
        if missing:
            raise StaleOffsets(missing)


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


def record_gap(conn: Connection, group: str, topic: str, partition: int, expected: int | None, log_start: int) -> int:
    """Retention deleted ``partition``'s offsets from ``expected`` (None: no
    row, so 0) up to ``log_start`` before they were charged: record the gap
    and move the offset to ``log_start``, by compare-and-set, in the
    caller's transaction. Returns the number of offsets lost."""
    current = conn.execute(
        sa.select(db.offsets.c.next_offset)
        .where(db.offsets.c.group_id == group, db.offsets.c.topic == topic, db.offsets.c.kafka_partition == partition)
        .with_for_update()
    ).scalar_one_or_none()
    if current != expected:
        raise StaleOffsets([partition])
    from_offset = expected or 0
    lost = log_start - from_offset
    conn.execute(
        db.insert(conn, db.gaps).on_conflict_do_nothing(
            index_elements=["group_id", "topic", "kafka_partition", "from_offset"]
        ),
        {
            "group_id": group,
            "topic": topic,
            "kafka_partition": partition,
            "from_offset": from_offset,
            "to_offset": log_start,
            "lost_offsets": lost,
        },
    )
    _store_next_offsets(conn, group, topic, {partition: log_start}, {partition: expected})
    return lost
