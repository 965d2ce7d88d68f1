"""The database side of a budget-event publish round
(:mod:`adpipe.budget.events`): the outbox ``budget_events`` (filled by
:mod:`adpipe.budget.status`) and ``last_publisher`` in ``budget_meta``.
Step 4 (:func:`claim`) and Step 6 (:func:`mark_sent`) are one database
transaction each."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Engine, RowMapping

from adpipe.budget import db

LAST_PUBLISHER = "last_publisher"  # budget_meta: the instance that claimed the last round


def pending(engine: Engine) -> int:
    """Outbox rows not sent yet."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(sa.func.count()).select_from(db.events).where(db.events.c.sent_at.is_(None))
        ).scalar_one()


def last_publisher(engine: Engine) -> str | None:
    """The instance that claimed the last round (Step 2 compares it with its own)."""
    with engine.connect() as conn:
        return conn.execute(sa.select(db.meta.c.value).where(db.meta.c.key == LAST_PUBLISHER)).scalar()


def claim(engine: Engine, instance: str, last_round: int, next_round: int) -> tuple[int, Sequence[RowMapping]]:
    """Step 4, one database transaction: returns how many rows of round
    ``last_round`` were confirmed sent, and the rows claimed for
    ``next_round`` (``last_publisher`` = ``instance``)."""
    with engine.begin() as conn:
        confirmed = conn.execute(
            sa.update(db.events)
            .where(db.events.c.round == last_round, db.events.c.sent_at.is_(None))
            .values(sent_at=sa.func.now())
        ).rowcount
        conn.execute(sa.update(db.events).where(db.events.c.sent_at.is_(None)).values(round=next_round))
        rows = (
            conn.execute(
                sa.select(db.events)
                .where(db.events.c.round == next_round, db.events.c.sent_at.is_(None))
                .order_by(db.events.c.ad_id, db.events.c.period, db.events.c.generation)
            )
            .mappings()
            .all()
        )
        conn.execute(
            db.insert(conn, db.meta)
            .on_conflict_do_update(index_elements=["key"], set_={"value": instance})
            .values(key=LAST_PUBLISHER, value=instance)
        )
    return confirmed, rows


def mark_sent(engine: Engine, next_round: int) -> None:
    """Step 6: the round is in Kafka; its outbox rows are done."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(db.events)
            .where(db.events.c.round == next_round, db.events.c.sent_at.is_(None))
            .values(sent_at=sa.func.now())
        )
