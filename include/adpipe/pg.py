"""Connections to the configured PostgreSQL server (``ADPIPE_PG_*``).

A shared piece: the metastore's set-up lock and the local server's
database creation use it; the server may be the local one
(``adpipe.local.postgres``) or any other (docker-compose, a managed one)."""

from __future__ import annotations

from adpipe.settings import Settings


def connect(settings: Settings, database: str = "adpipe", autocommit: bool = True, **libpq: object):  # noqa: ANN201 - psycopg2 connection
    """A connection to ``database``; ``libpq``: more connection parameters
    (keepalives, ``tcp_user_timeout``)."""
    import psycopg2

    conn = psycopg2.connect(
        host=settings.pg_host,
        port=settings.pg_port,
        user=settings.pg_user,
        password=settings.pg_password,
        dbname=database,
        connect_timeout=10,
        **libpq,
    )
    conn.autocommit = autocommit
    return conn


def ensure_databases(settings: Settings, names: tuple[str, ...]) -> list[str]:
    """Create the databases that do not exist yet; return those created.
    Safe from several processes at once (workers on several hosts starting
    their warm load drivers on a new metastore): a database another one
    created meanwhile is left to it."""
    from psycopg2 import errors

    conn = connect(settings, "postgres")
    created = []
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database")
            existing = {row[0] for row in cur.fetchall()}
            for name in names:
                if name in existing:
                    continue
                try:
                    cur.execute(f'CREATE DATABASE "{name}"')
                except (errors.DuplicateDatabase, errors.UniqueViolation):
                    continue  # created by another process since the SELECT (autocommit: nothing to roll back)
                created.append(name)
    finally:
        conn.close()
    return created
