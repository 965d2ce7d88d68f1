"""Creating the budget database's tables (:mod:`adpipe.budget.db`) and
bringing an older database up to date: missing tables created, missing
columns and indexes added (the revisions' ``budget_windows``, the ledger's
revision columns and the index of its rows without a revision), the outbox
of the first version (``budget_pauses``) copied over; the publisher id and
the default price row written once."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from adpipe.budget.db import LOCK_SCHEMA, PRICING_SETTLED, events, insert, meta, metadata, pricing, status
from adpipe.settings import Settings


def ensure_schema(engine: Engine, settings: Settings) -> str:
    """Create the tables, the publisher id and the default price row if
    missing, and bring an older database up to date (idempotent, safe with
    several instances starting at once). Returns the publisher id."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_SCHEMA})
        metadata.create_all(conn, checkfirst=True)
        _add_missing_columns(conn)
        _add_missing_indexes(conn)
        _copy_first_version_outbox(conn)
        conn.execute(
            insert(conn, meta).on_conflict_do_nothing(index_elements=["key"]),
            [{"key": "publisher_id", "value": uuid.uuid4().hex[:16]}, {"key": PRICING_SETTLED, "value": ""}],
        )
        conn.execute(
            insert(conn, pricing).on_conflict_do_nothing(index_elements=["scope", "key"]),
            {
                "scope": "default",
                "key": "*",
                "campaign_id": None,
                "cpm_micros": settings.budget_default_cpm_micros,
                "cpc_micros": settings.budget_default_cpc_micros,
                "budget_micros": settings.budget_default_budget_micros,
            },
        )
        return conn.execute(sa.select(meta.c.value).where(meta.c.key == "publisher_id")).scalar_one()


def _add_missing_columns(conn: Connection) -> None:
    """Columns a later version added (all nullable) to tables created before."""
    inspector = sa.inspect(conn)
    for table in metadata.sorted_tables:
        have = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in have:
                kind = column.type.compile(dialect=conn.dialect)
                conn.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}')


def _add_missing_indexes(conn: Connection) -> None:
    """Indexes a later version declared on tables created before
    (``create_all`` creates a table's indexes only with the table)."""
    for table in metadata.sorted_tables:
        for index in sorted(table.indexes, key=lambda i: i.name or ""):
            index.create(conn, checkfirst=True)


def _copy_first_version_outbox(conn: Connection) -> None:
    """The first version kept pauses and their outbox in ``budget_pauses``
    (one pause per ad and period); copy them over once, publication state
    included, so nothing is published twice or lost."""
    if not sa.inspect(conn).has_table("budget_pauses"):
        return
    if conn.execute(sa.select(sa.func.count()).select_from(events)).scalar_one():
        return
    rows = (
        conn.execute(
            sa.text(
                "SELECT ad_id, period, event_id, spend_micros, budget_micros, record_uuid, window_start, round, "
                "sent_at FROM budget_pauses"
            )
        )
        .mappings()
        .all()
    )
    for r in rows:
        conn.execute(
            insert(conn, status).on_conflict_do_nothing(index_elements=["ad_id", "period"]),
            {
                "ad_id": r["ad_id"],
                "period": r["period"],
                "state": "paused",
                "generation": 1,
                "spend_micros": r["spend_micros"],
                "budget_micros": r["budget_micros"],
            },
        )
        conn.execute(
            insert(conn, events).on_conflict_do_nothing(index_elements=["event_id"]),
            {**dict(r), "generation": 1, "event_type": "ad_paused", "cause": "spend"},
        )
