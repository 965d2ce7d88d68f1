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
``budget_status``      paused or active per (ad_id, period), and how many transitions it has had
                       (``generation``): spend reaching the budget pauses, a budget raised above the
                       spend resumes (adpipe.budget.status)
``budget_events``      the outbox of budget events: one row per transition, keyed by an event id derived
                       from (ad, period, generation), so each is once; ``round``/``sent_at`` record its
                       publication (adpipe.budget.events)
``budget_quarantine``  aggregates not charged, with the kind and the reason (the service goes on):
                       ``malformed`` (not an aggregate of the contract, or beyond what the columns hold),
                       ``rejected`` (the database refused it), ``conflict`` (a record_uuid seen again
                       with other counts)
``budget_gaps``        offsets of the aggregates topic that retention deleted before they were charged
``budget_ledger_pruned`` per (ad_id, period), the sums of ledger rows removed by ``budget prune``

Older databases are brought up to date by ``ensure_schema`` (missing columns
added; the outbox of the first version, ``budget_pauses``, copied over).
"""

from __future__ import annotations

import csv
import hashlib
import operator
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from adpipe.budget.aggregate import MAX_AD_ID, MAX_RECORD_UUID, MAX_WINDOW_START
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
    # budget prune deletes by age; verify and the report read per ad.
    sa.Index("budget_ledger_applied_at", "applied_at"),
    sa.Index("budget_ledger_ad_period", "ad_id", "period"),
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


def storable(value: str | None, limit: int | None = None) -> str | None:
    """``value`` made safe for a text column: NUL and unpaired surrogates
    escaped, cut to ``limit`` characters (quarantine rows must never be
    refused themselves)."""
    if value is None:
        return None
    safe = value.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return safe[:limit] if limit else safe


def insert(conn: Connection, table: sa.Table):  # noqa: ANN201 - dialect-specific Insert
    """INSERT with ``on_conflict_*`` for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    if conn.dialect.name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"the budget database must be PostgreSQL or SQLite, not {conn.dialect.name}")


def pg_array_literal(values: Iterable[str | int | None]) -> str:
    """PostgreSQL's text form of a one-dimensional array (``{"a","b",NULL}``):
    every string quoted and escaped, so a value reads back as it was
    (``"NULL"`` stays a string)."""
    values = list(values)
    # A budget batch's columns are all strings free of quotes and
    # backslashes (ids, timestamps) or all ints: joined in C, not escaped one
    # by one (a third of the ledger insert's Python time, cProfile).
    kinds = set(map(type, values))
    if kinds == {str}:
        joined = "".join(values)
        if '"' not in joined and "\\" not in joined:
            return '{"' + '","'.join(values) + '"}'
    elif kinds == {int}:
        return "{" + ",".join(map(str, values)) + "}"
    items = []
    for value in values:
        if value is None:
            items.append("NULL")
        elif isinstance(value, str):
            items.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
        elif isinstance(value, int) and not isinstance(value, bool):
            items.append(str(value))
        else:
            raise TypeError(f"no array literal for {type(value).__name__} {value!r}")
    return "{" + ",".join(items) + "}"


def _rows_select(table: sa.Table, rows: list[dict]) -> tuple[list[str], sa.Select]:
    """PostgreSQL: ``rows`` as a SELECT over ``unnest`` of one array per
    column: one statement and a parameter per column, where a multi-row
    VALUES binds every cell (several times slower for the thousands of rows
    of a budget batch). Each array goes as one text parameter, cast by the
    server: a Python list would be sent as an ``ARRAY[...]`` expression the
    server parses element by element (twice the time of the whole insert)."""
    names = list(rows[0])
    columns = sa.func.unnest(
        *(
            sa.cast(
                sa.bindparam(n, pg_array_literal(map(operator.itemgetter(n), rows)), type_=sa.Text),
                postgresql.ARRAY(table.c[n].type),
            )
            for n in names
        )
    ).table_valued(*names).render_derived(name="new_rows")
    return names, sa.select(columns)


def insert_new(conn: Connection, table: sa.Table, rows: list[dict], key: str) -> set:
    """Insert-only by ``key`` (a unique column): a row whose key is already
    there is skipped. Returns the keys actually inserted."""
    if not rows:
        return set()
    if conn.dialect.name != "postgresql":
        stmt = insert(conn, table).on_conflict_do_nothing(index_elements=[key]).returning(table.c[key])
        return {r[0] for r in conn.execute(stmt, rows)}
    names, source = _rows_select(table, rows)
    stmt = (
        postgresql.insert(table)
        .from_select(names, source)
        .on_conflict_do_nothing(index_elements=[key])
        .returning(table.c[key])
    )
    return {r[0] for r in conn.execute(stmt)}


PRICING_SETTLED = "pricing_settled"  # budget_meta: the pricing the pause states were last settled against


def add_sums(conn: Connection, table: sa.Table, stamp: str, rows: list[dict]) -> dict[tuple[str, str], int]:
    """Upsert ``rows`` (``ad_id``, ``period``, ``spend_micros``, ``records``;
    one per key) into a table of sums per (ad_id, period) (``budget_spend``,
    ``budget_ledger_pruned``): a new key is inserted, an existing one gets
    ``spend_micros`` and ``records`` added and ``stamp`` set to now. Returns
    each key's new ``spend_micros``."""
    if not rows:
        return {}
    if conn.dialect.name == "postgresql":
        names, source = _rows_select(table, rows)
        up = postgresql.insert(table).from_select(names, source)
        params: list[dict] | None = None
    else:
        up, params = insert(conn, table), rows
    stmt = up.on_conflict_do_update(
        index_elements=["ad_id", "period"],
        set_={
            "spend_micros": table.c.spend_micros + up.excluded.spend_micros,
            "records": table.c.records + up.excluded.records,
            stamp: sa.func.now(),
        },
    ).returning(table.c.ad_id, table.c.period, table.c.spend_micros)
    return {(a, p): spend for a, p, spend in conn.execute(stmt, params)}


def ensure_schema(engine: Engine, settings: Settings) -> str:
    """Create the tables, the publisher id and the default price row if
    missing, and bring an older database up to date (idempotent, safe with
    several instances starting at once). Returns the publisher id."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_SCHEMA})
        metadata.create_all(conn, checkfirst=True)
        _add_missing_columns(conn)
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


@dataclass(frozen=True)
class PriceBook:
    """Pricing rows as read in one transaction; ``price`` resolves an ad:
    each of cpm, cpc and budget from the ad's row, else its campaign's row,
    else the default row."""

    ads: dict[str, dict]
    campaigns: dict[str, dict]
    default: dict

    def price(self, ad_id: str) -> Price:
        own = self.ads.get(ad_id)
        if own is None:  # most ads: priced by the default row alone
            return self._default_price
        chain = [own, self.campaigns.get(own["campaign_id"]) if own and own["campaign_id"] else None, self.default]
        rows = [r for r in chain if r is not None]

        def first(col: str) -> int | None:
            return next((r[col] for r in rows if r[col] is not None), None)

        return Price(first("cpm_micros"), first("cpc_micros"), first("budget_micros"))  # type: ignore[arg-type]

    @cached_property
    def _default_price(self) -> Price:
        d = self.default
        return Price(d["cpm_micros"], d["cpc_micros"], d["budget_micros"])

    def fingerprint(self) -> str:
        """Changes whenever any row does (pauses are settled against it)."""
        rows = sorted(
            (scope, key, tuple(sorted(r.items())))
            for scope, table in (("ad", self.ads), ("campaign", self.campaigns), ("default", {"*": self.default}))
            for key, r in table.items()
        )
        return hashlib.sha256(repr(rows).encode()).hexdigest()[:32]


def load_price_book(conn: Connection, ad_ids: Iterable[str] | None = None) -> PriceBook:
    """The rows pricing ``ad_ids`` (None: the whole table)."""
    query = sa.select(pricing)
    if ad_ids is not None:
        ads = sorted(set(ad_ids))
        ad_rows = [
            dict(r) for r in conn.execute(query.where(pricing.c.scope == "ad", pricing.c.key.in_(ads))).mappings()
        ]
        campaigns = sorted({r["campaign_id"] for r in ad_rows if r["campaign_id"]})
        other = conn.execute(
            query.where(
                sa.or_(
                    pricing.c.scope == "default", sa.and_(pricing.c.scope == "campaign", pricing.c.key.in_(campaigns))
                )
            )
        ).mappings()
        rows = ad_rows + [dict(r) for r in other]
    else:
        rows = [dict(r) for r in conn.execute(query).mappings()]
    by_scope: dict[str, dict[str, dict]] = {scope: {} for scope in SCOPES}
    for r in rows:
        by_scope[r["scope"]][r["key"]] = r
    default = by_scope["default"].get("*")
    if default is None or default["cpm_micros"] is None or default["cpc_micros"] is None:
        raise PricingError("the pricing table has no complete default row (scope 'default', cpm and cpc)")
    return PriceBook(by_scope["ad"], by_scope["campaign"], default)


def resolve_prices(conn: Connection, ad_ids: Iterable[str]) -> dict[str, Price]:
    """The price of each ad (see :class:`PriceBook`)."""
    ads = sorted(set(ad_ids))
    book = load_price_book(conn, ads)
    return {ad: book.price(ad) for ad in ads}
