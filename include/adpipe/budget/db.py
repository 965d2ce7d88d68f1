"""The budget service's database: tables, engine, pricing (SQLAlchemy Core).

PostgreSQL in production and tests; SQLite (a file under ADPIPE_HOME) is the
embedded fallback for one instance. Every table is prefixed ``budget_``:

``budget_meta``        key/value: ``publisher_id`` names this database's budget-event publisher
``budget_pricing``     prices and budgets: rows of scope ``default`` (key ``*``), ``campaign`` (key =
                       campaign id) or ``ad`` (key = ad id, optional ``campaign_id`` mapping the ad to a
                       campaign). Each of cpm, cpc and budget resolves ad -> its campaign -> default;
                       a default budget of NULL means no budget.
``budget_ledger``      one row per applied aggregate, keyed by ``record_uuid`` (a repeat is a no-op),
                       with the prices it was charged at and where it was read
``budget_spend``       spend per (ad_id, budget period): the sum of the ledger's charges
``budget_offsets``     next offset per (consumer group, topic, partition): the consumer's position,
                       committed with the ledger rows it covers
``budget_pauses``      the outbox of budget events: one row per (ad_id, period) whose spend reached its
                       budget (the primary key makes the event once); ``round``/``sent_at`` record its
                       publication (see adpipe.budget.events)
``budget_quarantine``  aggregates that could not be parsed, with the reason (the service goes on)
"""

from __future__ import annotations

import csv
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from adpipe.budget.money import Price
from adpipe.money import parse_micros
from adpipe.settings import Settings

metadata = sa.MetaData()

meta = sa.Table(
    "budget_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(200), nullable=False),
)

SCOPES = ("default", "campaign", "ad")
PRICE_COLUMNS = ("scope", "key", "campaign_id", "cpm", "cpc", "budget")
pricing = sa.Table(
    "budget_pricing",
    metadata,
    sa.Column("scope", sa.String(16), primary_key=True),
    sa.Column("key", sa.String(200), primary_key=True),
    sa.Column("campaign_id", sa.String(200)),
    sa.Column("cpm_micros", sa.BigInteger),
    sa.Column("cpc_micros", sa.BigInteger),
    sa.Column("budget_micros", sa.BigInteger),
    sa.CheckConstraint("scope IN ('default', 'campaign', 'ad')", name="budget_pricing_scope"),
    sa.CheckConstraint(
        "cpm_micros >= 0 AND cpc_micros >= 0 AND budget_micros >= 0", name="budget_pricing_non_negative"
    ),
)

ledger = sa.Table(
    "budget_ledger",
    metadata,
    sa.Column("record_uuid", sa.String(64), primary_key=True),
    sa.Column("ad_id", sa.String(200), nullable=False),
    sa.Column("window_start", sa.String(40), nullable=False),
    sa.Column("period", sa.String(20), nullable=False),
    sa.Column("impressions", sa.BigInteger, nullable=False),
    sa.Column("clicks", sa.BigInteger, nullable=False),
    sa.Column("cpm_micros", sa.BigInteger, nullable=False),
    sa.Column("cpc_micros", sa.BigInteger, nullable=False),
    sa.Column("spend_micros", sa.BigInteger, nullable=False),
    sa.Column("kafka_topic", sa.String(255), nullable=False),
    sa.Column("kafka_partition", sa.Integer, nullable=False),
    sa.Column("kafka_offset", sa.BigInteger, nullable=False),
    sa.Column("applied_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
)

spend = sa.Table(
    "budget_spend",
    metadata,
    sa.Column("ad_id", sa.String(200), primary_key=True),
    sa.Column("period", sa.String(20), primary_key=True),
    sa.Column("spend_micros", sa.BigInteger, nullable=False),
    sa.Column("records", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
)

offsets = sa.Table(
    "budget_offsets",
    metadata,
    sa.Column("group_id", sa.String(255), primary_key=True),
    sa.Column("topic", sa.String(255), primary_key=True),
    sa.Column("kafka_partition", sa.Integer, primary_key=True),
    sa.Column("next_offset", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
)

pauses = sa.Table(
    "budget_pauses",
    metadata,
    sa.Column("ad_id", sa.String(200), primary_key=True),
    sa.Column("period", sa.String(20), primary_key=True),
    sa.Column("event_id", sa.String(36), nullable=False, unique=True),
    sa.Column("spend_micros", sa.BigInteger, nullable=False),
    sa.Column("budget_micros", sa.BigInteger, nullable=False),
    sa.Column("record_uuid", sa.String(64), nullable=False),
    sa.Column("window_start", sa.String(40), nullable=False),
    sa.Column("paused_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column("round", sa.BigInteger),
    sa.Column("sent_at", sa.DateTime(timezone=True)),
)

quarantine = sa.Table(
    "budget_quarantine",
    metadata,
    sa.Column("kafka_topic", sa.String(255), primary_key=True),
    sa.Column("kafka_partition", sa.Integer, primary_key=True),
    sa.Column("kafka_offset", sa.BigInteger, primary_key=True),
    sa.Column("group_id", sa.String(255), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("value", sa.Text),
    sa.Column("quarantined_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
)

# A constant key for PostgreSQL advisory locks taken by the budget service.
LOCK_SCHEMA = 7_311_001
LOCK_PUBLISHER = 7_311_002


def make_engine(url: str) -> Engine:
    """An engine for the budget database. SQLite runs every transaction as
    ``BEGIN IMMEDIATE`` (one writer at a time, no lock upgrades); its file's
    directory is created."""
    if url.startswith("sqlite"):
        path = sa.engine.make_url(url).database
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _no_implicit_transactions(dbapi_conn, _record) -> None:  # noqa: ANN001
            dbapi_conn.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _begin_immediate(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_size=3, max_overflow=2)


def insert(conn: Connection, table: sa.Table):  # noqa: ANN201 - dialect-specific Insert
    """INSERT with ``on_conflict_*`` for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    if conn.dialect.name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"the budget database must be PostgreSQL or SQLite, not {conn.dialect.name}")


def ensure_schema(engine: Engine, settings: Settings) -> str:
    """Create the tables, the publisher id and the default price row if
    missing (idempotent, safe with several instances starting at once).
    Returns the database's publisher id."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_SCHEMA})
        metadata.create_all(conn, checkfirst=True)
        conn.execute(
            insert(conn, meta).on_conflict_do_nothing(index_elements=["key"]),
            {"key": "publisher_id", "value": uuid.uuid4().hex[:16]},
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


def has_schema(engine: Engine) -> bool:
    return sa.inspect(engine).has_table(ledger.name)


# ---------------------------------------------------------------- pricing


@dataclass(frozen=True)
class PriceRow:
    scope: str
    key: str
    campaign_id: str | None = None
    cpm_micros: int | None = None
    cpc_micros: int | None = None
    budget_micros: int | None = None


class PricingError(ValueError):
    """A pricing row or file is invalid."""


def _amount(row: dict[str, str], name: str, line: int) -> int | None:
    raw = (row.get(name) or "").strip()
    if not raw:
        return None
    try:
        return parse_micros(raw)
    except ValueError as exc:
        raise PricingError(f"line {line}: {name}: {exc}") from exc


def read_price_file(path: Path) -> list[PriceRow]:
    """A CSV with header ``scope,key,campaign_id,cpm,cpc,budget``; amounts in
    currency units (``2.50``), empty = inherit."""
    rows = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = {"scope", "key"} - set(reader.fieldnames or ())
        if missing:
            raise PricingError(f"{path}: missing columns {sorted(missing)}; expected {','.join(PRICE_COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            scope = (row.get("scope") or "").strip()
            key = (row.get("key") or "").strip()
            if scope not in SCOPES:
                raise PricingError(f"line {line}: scope {scope!r} must be one of {', '.join(SCOPES)}")
            if scope == "default":
                key = "*"
            if not key:
                raise PricingError(f"line {line}: empty key")
            price = PriceRow(
                scope,
                key,
                (row.get("campaign_id") or "").strip() or None if scope == "ad" else None,
                _amount(row, "cpm", line),
                _amount(row, "cpc", line),
                _amount(row, "budget", line),
            )
            if scope == "default" and (price.cpm_micros is None or price.cpc_micros is None):
                raise PricingError(f"line {line}: the default row needs cpm and cpc")
            rows.append(price)
    return rows


def upsert_prices(conn: Connection, rows: Iterable[PriceRow]) -> int:
    """Insert or replace pricing rows (by scope and key)."""
    values = [r.__dict__ for r in rows]
    if not values:
        return 0
    stmt = insert(conn, pricing)
    stmt = stmt.on_conflict_do_update(
        index_elements=["scope", "key"],
        set_={c: stmt.excluded[c] for c in ("campaign_id", "cpm_micros", "cpc_micros", "budget_micros")},
    )
    conn.execute(stmt, values)
    return len(values)


def resolve_prices(conn: Connection, ad_ids: Iterable[str]) -> dict[str, Price]:
    """The price of each ad: each field from the ad's row, else its
    campaign's row, else the default row."""
    ads = sorted(set(ad_ids))
    ad_rows = {}
    if ads:
        for r in conn.execute(sa.select(pricing).where(pricing.c.scope == "ad", pricing.c.key.in_(ads))).mappings():
            ad_rows[r["key"]] = r
    campaigns = sorted({r["campaign_id"] for r in ad_rows.values() if r["campaign_id"]})
    campaign_rows = {}
    if campaigns:
        for r in conn.execute(
            sa.select(pricing).where(pricing.c.scope == "campaign", pricing.c.key.in_(campaigns))
        ).mappings():
            campaign_rows[r["key"]] = r
    default = conn.execute(sa.select(pricing).where(pricing.c.scope == "default")).mappings().first()
    if default is None or default["cpm_micros"] is None or default["cpc_micros"] is None:
        raise PricingError("the pricing table has no complete default row (scope 'default', cpm and cpc)")
    result = {}
    for ad in ads:
        chain = [ad_rows.get(ad)]
        if chain[0] is not None and chain[0]["campaign_id"]:
            chain.append(campaign_rows.get(chain[0]["campaign_id"]))
        chain.append(default)
        rows = [r for r in chain if r is not None]

        def first(col: str, rows: list = rows) -> int | None:
            return next((r[col] for r in rows if r[col] is not None), None)

        result[ad] = Price(first("cpm_micros"), first("cpc_micros"), first("budget_micros"))  # type: ignore[arg-type]
    return result
