"""``adpipe budget report``: spend, budget and status per ad and budget
period, read from the budget database (read-only)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from adpipe.budget import db, pricing, status
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
    with db.existing(settings) as engine:
        if engine is None:
            return None
        with engine.connect() as conn:
            spend_rows = conn.execute(
                sa.select(db.spend.c.ad_id, db.spend.c.period, db.spend.c.spend_micros, db.spend.c.records).order_by(
                    db.spend.c.ad_id, db.spend.c.period
                )
            ).all()
            paused = status.paused_keys(conn)
            prices = pricing.resolve_prices(conn, {r[0] for r in spend_rows})
        return [
            ReportRow(a, p, s, prices[a].budget_micros, n, "paused" if (a, p) in paused else "active")
            for a, p, s, n in spend_rows
        ]


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


@dataclass(frozen=True)
class Findings:
    """What was not charged, and why: quarantine counts by kind, the
    conflicting duplicates, and offsets lost to retention."""

    quarantined: dict[str, int]
    conflicts: list[dict]
    gaps: list[dict]


def findings(settings: Settings, limit: int = 20) -> Findings | None:
    """Read-only; None when there is no budget database yet."""
    with db.existing(settings) as engine:
        if engine is None:
            return None
        q = db.quarantine
        with engine.connect() as conn:
            kinds = {
                kind or "malformed": n
                for kind, n in conn.execute(sa.select(q.c.kind, sa.func.count()).group_by(q.c.kind))
            }
            conflicts = [
                dict(r)
                for r in conn.execute(
                    sa.select(q.c.record_uuid, q.c.kafka_topic, q.c.kafka_partition, q.c.kafka_offset, q.c.reason)
                    .where(q.c.kind == "conflict")
                    .order_by(q.c.quarantined_at.desc())
                    .limit(limit)
                ).mappings()
            ]
            gaps = [
                dict(r)
                for r in conn.execute(
                    sa.select(db.gaps).order_by(db.gaps.c.topic, db.gaps.c.kafka_partition, db.gaps.c.from_offset)
                ).mappings()
            ]
        return Findings(kinds, conflicts, gaps)


def format_findings(found: Findings) -> str:
    lines = []
    total = sum(found.quarantined.values())
    if total:
        lines.append(
            f"quarantined (not charged): {total} ("
            + ", ".join(f"{n} {kind}" for kind, n in sorted(found.quarantined.items()))
            + ")"
        )
    for c in found.conflicts:
        lines.append(f"CONFLICT {c['kafka_topic']}/{c['kafka_partition']}/{c['kafka_offset']}: {c['reason']}")
    for g in found.gaps:
        lines.append(
            f"GAP {g['topic']}[{g['kafka_partition']}] offsets {g['from_offset']}..{g['to_offset'] - 1}: "
            f"{g['lost_offsets']} offsets deleted by retention before group {g['group_id']} charged them"
        )
    return "\n".join(lines)
