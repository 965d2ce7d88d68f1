"""The budget service's database: its tables, its engine, the dialect's
INSERT and what a database error means (SQLAlchemy Core).

PostgreSQL in production and tests; SQLite (a file under ADPIPE_HOME) is the
embedded fallback for one instance. Every table is prefixed ``budget_``:

``budget_meta``        key/value: ``publisher_id`` names this database's budget-event publisher
``budget_pricing``     prices and budgets: rows of scope ``default`` (key ``*``), ``campaign`` (key =
                       campaign id) or ``ad`` (key = ad id, optional ``campaign_id`` mapping the ad to a
                       campaign). Each of cpm, cpc and budget resolves ad -> its campaign -> default;
                       a default budget of NULL means no budget.
``budget_ledger``      one row per applied aggregate, keyed by ``record_uuid`` (a repeat is a no-op),
                       with the prices it was charged at and where it was read; for a revision, the
                       base it was charged against (its charge is the difference)
``budget_windows``     per window of an aggregates topic (topic, ad_id, window_start): the last revision
                       charged and its counts, the base of the window's next revision
``budget_spend``       spend per (ad_id, budget period): the sum of the ledger's charges
``budget_offsets``     next offset per (consumer group, topic, partition): the consumer's position,
                       committed with the ledger rows it covers
``budget_status``      paused or active per (ad_id, period), and how many transitions it has had
                       (``generation``): spend reaching the budget pauses, a budget raised above the
                       spend resumes (adpipe.budget.status)
``budget_events``      the outbox of budget events: one row per transition, keyed by an event id derived
                       from (ad, period, generation), so each is once; ``round``/``sent_at`` record its
                       publication (adpipe.budget.events)
``budget_quarantine``  aggregates not charged, with the kind and the reason (the service goes on):
                       ``malformed`` (not an aggregate of the contract, or beyond what the columns hold),
                       ``rejected`` (the database refused it), ``conflict`` (a record_uuid seen again
                       with other counts, or a revision with fewer events than the one charged)
``budget_gaps``        offsets of the aggregates topic that retention deleted before they were charged
``budget_ledger_pruned`` per (ad_id, period), the sums of ledger rows removed by ``budget prune``

Its other jobs have modules of their own: :mod:`adpipe.budget.schema`
creates the tables and brings an older database up to date (missing columns
added; the outbox of the first version, ``budget_pauses``, copied over);
:mod:`adpipe.budget.writes` writes a batch's rows in bulk (insert-only by
key, sums per ad and period); :mod:`adpipe.budget.pricing` reads, loads and
resolves prices and budgets.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from adpipe.budget.aggregate import MAX_AD_ID, MAX_RECORD_UUID, MAX_WINDOW_START
from adpipe.settings import Settings

metadata = sa.MetaData()

meta = sa.Table(
    "budget_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(200), nullable=False),
)

PRICING_SETTLED = "pricing_settled"  # budget_meta: the pricing the pause states were last settled against

SCOPES = ("default", "campaign", "ad")
pricing = sa.Table(
    "budget_pricing",
    metadata,
    sa.Column("scope", sa.String(16), primary_key=True),
    sa.Column("key", sa.String(MAX_AD_ID), primary_key=True),
    sa.Column("campaign_id", sa.String(MAX_AD_ID)),
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
    sa.Column("record_uuid", sa.String(MAX_RECORD_UUID), primary_key=True),
    sa.Column("ad_id", sa.String(MAX_AD_ID), nullable=False),
    sa.Column("window_start", sa.String(MAX_WINDOW_START), nullable=False),
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
    # Added with revisions (NULL in rows of earlier versions: a revision 0
    # charged in full). spend_micros is the charge of this revision's counts
    # less the charge of the base's (the window's revision charged before;
    # NULL base_revision: none, base counts 0), both at this row's prices.
    sa.Column("revision", sa.BigInteger),
    sa.Column("base_revision", sa.BigInteger),
    sa.Column("base_impressions", sa.BigInteger),
    sa.Column("base_clicks", sa.BigInteger),
    # budget prune deletes by age; verify and the report read per ad.
    sa.Index("budget_ledger_applied_at", "applied_at"),
    sa.Index("budget_ledger_ad_period", "ad_id", "period"),
    # A window's first revision charged by this version finds what an
    # earlier version charged of it (rows without a revision) here.
    sa.Index(
        "budget_ledger_unrevised_window",
        "kafka_topic",
        "ad_id",
        "window_start",
        postgresql_where=sa.text("revision IS NULL"),
        sqlite_where=sa.text("revision IS NULL"),
    ),
)

windows = sa.Table(
    "budget_windows",
    metadata,
    sa.Column("kafka_topic", sa.String(255), primary_key=True),
    sa.Column("ad_id", sa.String(MAX_AD_ID), primary_key=True),
    sa.Column("window_start", sa.String(MAX_WINDOW_START), primary_key=True),
    # The last revision charged (NULL: none yet) and its full counts.
    sa.Column("revision", sa.BigInteger),
    sa.Column("impressions", sa.BigInteger, nullable=False),
    sa.Column("clicks", sa.BigInteger, nullable=False),
    sa.Column("record_uuid", sa.String(MAX_RECORD_UUID)),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    # budget prune deletes by age.
    sa.Index("budget_windows_updated_at", "updated_at"),
)

spend = sa.Table(
    "budget_spend",
    metadata,
    sa.Column("ad_id", sa.String(MAX_AD_ID), primary_key=True),
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

status = sa.Table(
    "budget_status",
    metadata,
    sa.Column("ad_id", sa.String(MAX_AD_ID), primary_key=True),
    sa.Column("period", sa.String(20), primary_key=True),
    sa.Column("state", sa.String(8), nullable=False),
    sa.Column("generation", sa.Integer, nullable=False),
    sa.Column("spend_micros", sa.BigInteger, nullable=False),
    sa.Column("budget_micros", sa.BigInteger),
    sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.CheckConstraint("state IN ('paused', 'active')", name="budget_status_state"),
)

events = sa.Table(
    "budget_events",
    metadata,
    sa.Column("event_id", sa.String(36), primary_key=True),
    sa.Column("ad_id", sa.String(MAX_AD_ID), nullable=False),
    sa.Column("period", sa.String(20), nullable=False),
    sa.Column("generation", sa.Integer, nullable=False),
    sa.Column("event_type", sa.String(16), nullable=False),
    sa.Column("cause", sa.String(16), nullable=False),
    sa.Column("spend_micros", sa.BigInteger, nullable=False),
    sa.Column("budget_micros", sa.BigInteger),
    sa.Column("record_uuid", sa.String(MAX_RECORD_UUID)),
    sa.Column("window_start", sa.String(MAX_WINDOW_START)),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column("round", sa.BigInteger),
    sa.Column("sent_at", sa.DateTime(timezone=True)),
    sa.UniqueConstraint("ad_id", "period", "generation", name="budget_events_transition"),
    # The publisher's claim reads the unsent rows only.
    sa.Index(
        "budget_events_unsent",
        "round",
        postgresql_where=sa.text("sent_at IS NULL"),
        sqlite_where=sa.text("sent_at IS NULL"),
    ),
)

QUARANTINE_KINDS = ("malformed", "rejected", "conflict")
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
    # Added in the second version (NULL in older rows: malformed).
    sa.Column("kind", sa.String(16)),
    sa.Column("record_uuid", sa.String(MAX_RECORD_UUID)),
    sa.Index("budget_quarantine_group", "group_id", "kafka_topic"),
)

gaps = sa.Table(
    "budget_gaps",
    metadata,
    sa.Column("group_id", sa.String(255), primary_key=True),
    sa.Column("topic", sa.String(255), primary_key=True),
    sa.Column("kafka_partition", sa.Integer, primary_key=True),
    sa.Column("from_offset", sa.BigInteger, primary_key=True),
    sa.Column("to_offset", sa.BigInteger, nullable=False),
    sa.Column("lost_offsets", sa.BigInteger, nullable=False),
    sa.Column("detected_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
)

ledger_pruned = sa.Table(
    "budget_ledger_pruned",
    metadata,
    sa.Column("ad_id", sa.String(MAX_AD_ID), primary_key=True),
    sa.Column("period", sa.String(20), primary_key=True),
    sa.Column("spend_micros", sa.BigInteger, nullable=False),
    sa.Column("records", sa.BigInteger, nullable=False),
    sa.Column("last_pruned_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
)

# A constant key for PostgreSQL advisory locks taken by the budget service.
LOCK_SCHEMA = 7_311_001
LOCK_PUBLISHER = 7_311_002


def make_engine(settings: Settings) -> Engine:
    """An engine for the budget database (``settings.budget_db``).

    PostgreSQL: a connect timeout, a statement timeout, an idle-in-transaction
    timeout (a frozen process's locks are released by the server) and TCP
    keep-alives (a dead server is noticed), so no call waits without end.
    SQLite runs every transaction as ``BEGIN IMMEDIATE`` (one writer at a
    time, no lock upgrades); its file's directory is created."""
    url = settings.budget_db
    if url.startswith("sqlite"):
        path = sa.engine.make_url(url).database
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"timeout": settings.budget_db_statement_timeout_ms / 1000})

        @sa.event.listens_for(engine, "connect")
        def _no_implicit_transactions(dbapi_conn, _record) -> None:  # noqa: ANN001
            dbapi_conn.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _begin_immediate(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    timeout_ms = settings.budget_db_statement_timeout_ms
    connect_args = {}
    if sa.engine.make_url(url).get_backend_name() == "postgresql":
        connect_args = {
            "connect_timeout": settings.budget_db_connect_timeout_s,
            "options": f"-c statement_timeout={timeout_ms} -c idle_in_transaction_session_timeout={2 * timeout_ms}",
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
        }
    return sa.create_engine(
        url, pool_pre_ping=True, pool_size=3, max_overflow=2, pool_timeout=30, connect_args=connect_args
    )


def insert(conn: Connection, table: sa.Table):  # noqa: ANN201 - dialect-specific Insert
    """INSERT with ``on_conflict_*`` for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    if conn.dialect.name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"the budget database must be PostgreSQL or SQLite, not {conn.dialect.name}")


# What a database error means for the batch that met it (fault_kind):
TRANSIENT = "transient"  # the server or the connection: retry the same batch, with backoff
DATA = "data"  # this batch's data: find the record the database refuses, quarantine it
FATAL = "fatal"  # schema, permissions, a bug: retrying or quarantining cannot help
# SQLSTATE classes and codes (PostgreSQL appendix A).
_TRANSIENT_CLASSES = ("08", "40", "53", "57", "58")  # connection, rollback, resources, operator, system
_TRANSIENT_CODES = ("55P03", "55006")  # lock_not_available, object_in_use
_DATA_CLASSES = ("21", "22", "23", "54")  # cardinality, data exception, integrity, program limit


def fault_kind(exc: BaseException) -> str:
    """Classify an error raised by a database call."""
    if isinstance(exc, sa.exc.TimeoutError):  # the pool had no connection to give
        return TRANSIENT
    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated:
            return TRANSIENT
        code = getattr(exc.orig, "pgcode", None)
        if code:
            if code[:2] in _TRANSIENT_CLASSES or code in _TRANSIENT_CODES:
                return TRANSIENT
            return DATA if code[:2] in _DATA_CLASSES else FATAL
        if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):  # no code: connection refused or lost
            return TRANSIENT
        if isinstance(exc, sa.exc.DataError | sa.exc.IntegrityError):
            return DATA
        return FATAL
    # The driver refuses text before it reaches the server: NUL, unpaired surrogates.
    if isinstance(exc, ValueError):
        return DATA
    return FATAL


def has_schema(engine: Engine) -> bool:
    return sa.inspect(engine).has_table(ledger.name)


@contextmanager
def existing(settings: Settings) -> Iterator[Engine | None]:
    """The budget database's engine for a read-only look, or None when there
    is none yet: a missing SQLite file is not created, and a database
    without the ledger table counts as none."""
    url = sa.engine.make_url(settings.budget_db)
    if url.get_backend_name() == "sqlite" and not (url.database and Path(url.database).exists()):
        yield None
        return
    engine = make_engine(settings)
    try:
        yield engine if has_schema(engine) else None
    finally:
        engine.dispose()
