"""The budget database's batch statements on a real PostgreSQL: the rows a
batch sends as one array per column read back exactly as they were sent,
whatever their text holds."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from adpipe import pg as pg_client
from adpipe.budget import db, writes
from adpipe.settings import Settings

# Text an array literal must quote and escape: its own delimiters, quotes,
# backslashes, the word NULL, blanks, non-ASCII.
HOSTILE_AD_IDS = [
    "ad-plain",
    'ad "quoted"',
    "ad\\backslash\\",
    "ad,comma",
    "{ad}",
    "NULL",
    "null",
    "  padded  ",
    "",
    "tab\there",
    "line\nbreak",
    "ad-ünïcødé-广告",
    '\\"',
]


def test_hostile_text_round_trips_through_the_ledger_and_the_spend_sums(pg: Settings) -> None:
    database = f"budget_db_{uuid.uuid4().hex[:8]}"
    pg_client.ensure_databases(pg, (database,))
    engine = sa.create_engine(pg.pg_url(database))
    try:
        db.metadata.create_all(engine)
        rows = [
            {
                "record_uuid": f"uuid-{i}-{ad}",
                "ad_id": ad,
                "window_start": "2026-11-22T12:00:00Z",
                "period": "2026-11-22",
                "impressions": i,
                "clicks": 2**40 + i,  # beyond a 32-bit integer
                "cpm_micros": 2_000_000,
                "cpc_micros": 500_000,
                "spend_micros": 10 * i,
                "kafka_topic": "t",
                "kafka_partition": i % 4,
                "kafka_offset": 10**12 + i,
            }
            for i, ad in enumerate(HOSTILE_AD_IDS)
        ]
        with engine.begin() as conn:
            inserted = writes.insert_new(conn, db.ledger, rows, "record_uuid")
            again = writes.insert_new(conn, db.ledger, rows[:3], "record_uuid")
            sums = writes.add_sums(
                conn,
                db.spend,
                "updated_at",
                [{"ad_id": r["ad_id"], "period": r["period"], "spend_micros": 7, "records": 1} for r in rows],
            )
            one_more = [{"ad_id": "{ad}", "period": "2026-11-22", "spend_micros": 5, "records": 1}]
            sums_again = writes.add_sums(conn, db.spend, "updated_at", one_more)
        assert inserted == {r["record_uuid"] for r in rows}
        assert again == set()  # insert-only: keys already there are skipped
        assert sums == {(ad, "2026-11-22"): 7 for ad in HOSTILE_AD_IDS}
        assert sums_again == {("{ad}", "2026-11-22"): 12}
        with engine.connect() as conn:
            stored = [dict(r) for r in conn.execute(sa.select(db.ledger).order_by(db.ledger.c.kafka_offset)).mappings()]
        names = list(rows[0])
        assert [{n: r[n] for n in names} for r in stored] == rows
    finally:
        engine.dispose()
        conn = pg_client.connect(pg, "postgres")
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        conn.close()
