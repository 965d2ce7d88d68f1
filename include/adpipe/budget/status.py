"""Paused or active, per ad and budget period, and the events of each change.

An (ad, period) is **paused** when its spend has reached its budget and
**active** otherwise (no budget: always active). Two things change that:

* a charge (Step 5 of a batch, :func:`settle_charged`): spend only grows, so
  it can only pause;
* the pricing (:func:`settle_pricing`): a budget lowered below the spend
  pauses, one raised above it (or removed) resumes, without waiting for the
  ad's next record. It runs in the transaction of ``adpipe budget prices``,
  and in every publisher round of the service, which settles only when the
  pricing table's fingerprint differs from the one last settled (so an edit
  made with plain SQL takes effect within a round too).

Every change is a transition: ``budget_status.generation`` goes up by one and
one ``budget_events`` row (the outbox) is written in the same transaction,
its ``event_id`` derived from (ad, period, generation): each transition is
one event, published once (:mod:`adpipe.budget.events`).

Races. A batch takes the ``pricing_settled`` row of ``budget_meta`` FOR SHARE
before it reads prices; settling takes it FOR UPDATE. So a settlement never
runs beside a batch that priced with the pricing before it: it waits for the
batch's commit and then sees its spend and states. Status rows are locked
(FOR UPDATE) before spend is read, in key order.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from adpipe.budget import db, pricing

PAUSED = "paused"
ACTIVE = "active"
EVENT_TYPES = {PAUSED: "ad_paused", ACTIVE: "ad_resumed"}
EVENT_NAMESPACE = uuid.UUID("4d1f5b8e-5a39-4d0b-9a52-2f0c7f3b9e10")

SpendKey = tuple[str, str]  # (ad_id, period)


def event_id(ad_id: str, period: str, generation: int = 1) -> str:
    """The id of the ``generation``-th event of (ad, period): the same
    transition always has the same id (the first one keeps the id of the
    first version, when an ad could only be paused once)."""
    name = f"{ad_id}|{period}" if generation == 1 else f"{ad_id}|{period}|{generation}"
    return str(uuid.uuid5(EVENT_NAMESPACE, name))


def desired_state(spend_micros: int, budget_micros: int | None) -> str:
    return PAUSED if budget_micros is not None and spend_micros >= budget_micros else ACTIVE


@dataclass(frozen=True)
class Transition:
    ad_id: str
    period: str
    generation: int
    state: str
    cause: str  # "spend" or "budget_change"
    spend_micros: int
    budget_micros: int | None
    record_uuid: str | None = None
    window_start: str | None = None

    @property
    def event_type(self) -> str:
        return EVENT_TYPES[self.state]


def lock_pricing_shared(conn: Connection) -> None:
    """A batch's guard against a settlement running beside it (module doc)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(db.meta.c.value).where(db.meta.c.key == db.PRICING_SETTLED).with_for_update(read=True))


def _lock_states(conn: Connection, keys: list[SpendKey] | None) -> dict[SpendKey, tuple[str, int]]:
    query = sa.select(db.status.c.ad_id, db.status.c.period, db.status.c.state, db.status.c.generation)
    if keys is not None:
        query = query.where(sa.tuple_(db.status.c.ad_id, db.status.c.period).in_(keys))
    rows = conn.execute(query.order_by(db.status.c.ad_id, db.status.c.period).with_for_update()).all()
    return {(a, p): (state, gen) for a, p, state, gen in rows}


def _apply(conn: Connection, transitions: list[Transition], new_rows: set[SpendKey]) -> None:
    """Write the transitions: status rows (inserted for ``new_rows``) and
    one outbox row each."""
    for t in transitions:
        values = {
            "state": t.state,
            "generation": t.generation,
            "spend_micros": t.spend_micros,
            "budget_micros": t.budget_micros,
            "updated_at": sa.func.now(),
        }
        if (t.ad_id, t.period) in new_rows:
            conn.execute(sa.insert(db.status).values(ad_id=t.ad_id, period=t.period, **values))
        else:
            conn.execute(
                sa.update(db.status)
                .where(db.status.c.ad_id == t.ad_id, db.status.c.period == t.period)
                .values(**values)
            )
    if transitions:
        conn.execute(
            db.insert(conn, db.events).on_conflict_do_nothing(index_elements=["event_id"]),
            [
                {
                    "event_id": event_id(t.ad_id, t.period, t.generation),
                    "ad_id": t.ad_id,
                    "period": t.period,
                    "generation": t.generation,
                    "event_type": t.event_type,
                    "cause": t.cause,
                    "spend_micros": t.spend_micros,
                    "budget_micros": t.budget_micros,
                    "record_uuid": t.record_uuid,
                    "window_start": t.window_start,
                }
                for t in transitions
            ],
        )


def settle_charged(
    conn: Connection,
    new_spend: dict[SpendKey, int],
    budgets: dict[str, int | None],
    crossing_record: dict[SpendKey, dict],
) -> list[Transition]:
    """Step 5 of a batch: pause each (ad, period) whose new spend reached its
    budget and is not paused yet. ``crossing_record``: per key, the ledger
    row that made the spend reach it."""
    reached = sorted(k for k, micros in new_spend.items() if desired_state(micros, budgets[k[0]]) == PAUSED)
    if reached:
        # Most of them are paused already (spend only grows, and a resume
        # cannot run beside this batch: see the module doc); lock the others.
        reached = sorted(set(reached) - paused_keys(conn, reached))
    if not reached:
        return []
    # Insert-if-absent first: two batches reaching a new key at once meet on
    # the primary key, and the second then waits for the first's row lock.
    conn.execute(
        db.insert(conn, db.status).on_conflict_do_nothing(index_elements=["ad_id", "period"]),
        [
            {"ad_id": a, "period": p, "state": ACTIVE, "generation": 0, "spend_micros": 0, "budget_micros": None}
            for a, p in reached
        ],
    )
    states = _lock_states(conn, reached)
    transitions = []
    for key in reached:
        state, generation = states[key]
        if state == PAUSED:
            continue
        row = crossing_record[key]
        transitions.append(
            Transition(
                key[0],
                key[1],
                generation + 1,
                PAUSED,
                "spend",
                new_spend[key],
                budgets[key[0]],
                row["record_uuid"],
                row["window_start"],
            )
        )
    _apply(conn, transitions, set())
    return transitions


def settle_pricing(conn: Connection, force: bool = False) -> list[Transition] | None:
    """Bring every (ad, period) to the state its spend and today's budget
    call for. None when the pricing is the one last settled (and not
    ``force``); else the transitions made (maybe none)."""
    settled = conn.execute(
        sa.select(db.meta.c.value).where(db.meta.c.key == db.PRICING_SETTLED).with_for_update()
    ).scalar_one_or_none()
    book = pricing.load_price_book(conn)
    fingerprint = book.fingerprint()
    if settled == fingerprint and not force:
        return None
    states = _lock_states(conn, None)
    spend_rows = conn.execute(
        sa.select(db.spend.c.ad_id, db.spend.c.period, db.spend.c.spend_micros).order_by(
            db.spend.c.ad_id, db.spend.c.period
        )
    ).all()
    transitions = []
    new_rows = set()
    budgets: dict[str, int | None] = {}
    for ad_id, period, micros in spend_rows:
        if ad_id not in budgets:
            budgets[ad_id] = book.price(ad_id).budget_micros
        state, generation = states.get((ad_id, period), (ACTIVE, 0))
        wanted = desired_state(micros, budgets[ad_id])
        if wanted != state:
            if (ad_id, period) not in states:
                new_rows.add((ad_id, period))
            transitions.append(
                Transition(ad_id, period, generation + 1, wanted, "budget_change", micros, budgets[ad_id])
            )
    _apply(conn, transitions, new_rows)
    conn.execute(
        db.insert(conn, db.meta)
        .on_conflict_do_update(index_elements=["key"], set_={"value": fingerprint})
        .values(key=db.PRICING_SETTLED, value=fingerprint)
    )
    return transitions


def paused_keys(conn: Connection, keys: Iterable[SpendKey] | None = None) -> set[SpendKey]:
    query = sa.select(db.status.c.ad_id, db.status.c.period).where(db.status.c.state == PAUSED)
    if keys is not None:
        query = query.where(sa.tuple_(db.status.c.ad_id, db.status.c.period).in_(list(keys)))
    return {(a, p) for a, p in conn.execute(query)}
