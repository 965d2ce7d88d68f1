"""``adpipe budget report``: spend, budget and status per ad and budget
period, read from the budget database (read-only)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from adpipe.budget import db
from adpipe.money import format_micros
from adpipe.settings import Settings


@dataclass(frozen=True)
class ReportRow:
    ad_id: str
    period: str
    spend_micros: int
    budget_micros: int | None
    records: int
    status: str


def report(settings: Settings) -> list[ReportRow] | None:
    """Spend, budget and status per ad and period; read-only. None when
    there is no budget database (or it has no tables) yet."""
    url = settings.budget_db
    if url.startswith("sqlite"):
        path = sa.engine.make_url(url).database
        if not path or not Path(path).exists():
            return None
    engine = db.make_engine(url)
    try:
        if not db.has_schema(engine):
            return None
        with engine.connect() as conn:
            spend_rows = conn.execute(
                sa.select(db.spend.c.ad_id, db.spend.c.period, db.spend.c.spend_micros, db.spend.c.records).order_by(
                    db.spend.c.ad_id, db.spend.c.period
                )
            ).all()
            paused = {(a, p) for a, p in conn.execute(sa.select(db.pauses.c.ad_id, db.pauses.c.period))}
            prices = db.resolve_prices(conn, {r[0] for r in spend_rows})
        return [
            ReportRow(a, p, s, prices[a].budget_micros, n, "paused" if (a, p) in paused else "active")
            for a, p, s, n in spend_rows
        ]
    finally:
        engine.dispose()


def format_report(rows: list[ReportRow]) -> str:
    """The report as a fixed-width table with a summary line."""
    lines = [f"{'ad_id':<20} {'period':<13} {'spend':>16} {'budget':>16} {'records':>8} status"]
    for r in rows:
        lines.append(
            f"{r.ad_id:<20} {r.period:<13} {format_micros(r.spend_micros):>16} {format_micros(r.budget_micros):>16} "
            f"{r.records:>8} {r.status}"
        )
    total = sum(r.spend_micros for r in rows)
    lines.append(
        f"{len({r.ad_id for r in rows})} ads, {sum(r.status == 'paused' for r in rows)} paused, "
        f"total spend {format_micros(total)}"
    )
    return "\n".join(lines)
