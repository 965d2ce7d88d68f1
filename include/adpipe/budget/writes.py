"""Writing rows into the budget database: text made storable, insert-only
rows by a key (the ledger) and sums added per (ad_id, period) (the spend,
the pruned ledger's sums). On PostgreSQL the rows of a batch go as one
statement over ``unnest`` of one array per column (:func:`pg_array_literal`):
see :func:`_rows_select` for why."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from adpipe.budget.db import insert


def storable(value: str | None, limit: int | None = None) -> str | None:
    """``value`` made safe for a text column: NUL and unpaired surrogates
    escaped, cut to ``limit`` characters (quarantine rows must never be
    refused themselves)."""
    if value is None:
        return None
    safe = value.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return safe[:limit] if limit else safe


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


def _array_param(name: str | None, values: Iterable[str | int | None], item_type: sa.types.TypeEngine) -> sa.Cast:
    """One PostgreSQL array parameter, sent as text and cast by the server."""
    return sa.cast(sa.bindparam(name, pg_array_literal(values), type_=sa.Text), postgresql.ARRAY(item_type))


def _rows_select(table: sa.Table, rows: list[dict]) -> tuple[list[str], sa.Select]:
    """PostgreSQL: ``rows`` as a SELECT over ``unnest`` of one array per
    column: one statement and a parameter per column, where a multi-row
    VALUES binds every cell (several times slower for the thousands of rows
    of a budget batch). Each array goes as one text parameter, cast by the
    server: a Python list would be sent as an ``ARRAY[...]`` expression the
    server parses element by element (twice the time of the whole insert)."""
    names = list(rows[0])
    columns = sa.func.unnest(
        *(_array_param(n, map(operator.itemgetter(n), rows), table.c[n].type) for n in names)
    ).table_valued(*names).render_derived(name="new_rows")
    return names, sa.select(columns)


def key_in(conn: Connection, column: sa.Column, keys: list[str]) -> sa.ColumnElement[bool]:
    """``column IN keys``; on PostgreSQL as ``= ANY`` of one text-array
    parameter (an IN list of a batch's thousands of ads is rendered and
    bound value by value: a third of the price lookup's time)."""
    if conn.dialect.name != "postgresql":
        return column.in_(keys)
    return column == sa.any_(_array_param(None, keys, column.type))


def pairs_in(
    conn: Connection, first: sa.Column, second: sa.Column, keys: Sequence[tuple[str, str]]
) -> sa.ColumnElement[bool]:
    """``(first, second) IN keys``; on PostgreSQL against ``unnest`` of two
    text-array parameters (see :func:`key_in`)."""
    if conn.dialect.name != "postgresql":
        return sa.tuple_(first, second).in_(list(keys))
    pairs = sa.func.unnest(
        _array_param(None, [k[0] for k in keys], first.type), _array_param(None, [k[1] for k in keys], second.type)
    ).table_valued("a", "b").render_derived(name="keys")
    return sa.tuple_(first, second).in_(sa.select(pairs.c.a, pairs.c.b))


def insert_new(conn: Connection, table: sa.Table, rows: list[dict], key: str | tuple[str, ...]) -> set:
    """Insert-only by ``key`` (a unique column, or the columns of a unique
    key): a row whose key is already there is skipped. Returns the keys
    actually inserted (tuples for a key of several columns)."""
    if not rows:
        return set()
    names = [key] if isinstance(key, str) else list(key)
    returning = [table.c[n] for n in names]
    if conn.dialect.name != "postgresql":
        stmt = insert(conn, table).on_conflict_do_nothing(index_elements=names).returning(*returning)
        result = conn.execute(stmt, rows)
    else:
        columns, source = _rows_select(table, rows)
        stmt = (
            postgresql.insert(table)
            .from_select(columns, source)
            .on_conflict_do_nothing(index_elements=names)
            .returning(*returning)
        )
        result = conn.execute(stmt)
    if isinstance(key, str):
        return {r[0] for r in result}
    return {tuple(r) for r in result}


def put(conn: Connection, table: sa.Table, key: tuple[str, ...], rows: list[dict], stamp: str) -> None:
    """Insert or overwrite ``rows`` by ``key`` (the columns of a unique key):
    an existing row gets the other columns' new values and ``stamp`` set to
    now."""
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        names, source = _rows_select(table, rows)
        up = postgresql.insert(table).from_select(names, source)
        params: list[dict] | None = None
    else:
        names, up, params = list(rows[0]), insert(conn, table), rows
    stmt = up.on_conflict_do_update(
        index_elements=list(key),
        set_={**{n: up.excluded[n] for n in names if n not in key}, stamp: sa.func.now()},
    )
    conn.execute(stmt, params)


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
