"""``adpipe budget prune``: the ledger's retention rule.

A ledger row exists to make a repeat of its record_uuid a no-op. A repeat
can only come from the aggregates topic, so once a record is past the
topic's retention it can never come back, and its ledger row can go. The
rule: delete ledger rows applied more than the topic's ``retention.ms`` plus
``ADPIPE_BUDGET_LEDGER_MARGIN_H`` (default 168 h) ago. A topic kept forever
(``retention.ms`` -1) keeps its ledger forever.

Spend is unchanged (``budget_spend`` is a running sum); the pruned rows'
sums move to ``budget_ledger_pruned`` in the same transaction, so
``verify`` still reconciles spend with ledger plus pruned totals.

A ``budget_windows`` row is the base of its window's next revision, which
can only come from the topic too: rows last charged before the same cutoff
are deleted with the ledger rows (a window's ledger rows are never younger
than its row).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from confluent_kafka.admin import AdminClient, ConfigResource

from adpipe.budget import db, writes
from adpipe.settings import Settings

log = logging.getLogger("adpipe.budget")


def topic_retention_ms(settings: Settings, topic: str) -> int:
    """The topic's ``retention.ms`` as the broker reports it (-1: forever)."""
    admin = AdminClient(settings.kafka.client_config())
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    return int(configs["retention.ms"].value)


@dataclass(frozen=True)
class PruneResult:
    cutoff: datetime | None
    rows: int
    spend_micros: int
    windows: int = 0


def prune(settings: Settings, dry_run: bool = False, now: datetime | None = None) -> PruneResult:
    retention_ms = topic_retention_ms(settings, settings.topics.aggregates)
    if retention_ms < 0:
        return PruneResult(None, 0, 0)
    now = now or datetime.now(UTC)
    cutoff = now - timedelta(milliseconds=retention_ms) - timedelta(hours=settings.budget_ledger_margin_h)
    engine = db.make_engine(settings)
    try:
        with engine.begin() as conn:
            old = db.ledger.c.applied_at < cutoff
            sums = conn.execute(
                sa.select(
                    db.ledger.c.ad_id,
                    db.ledger.c.period,
                    sa.func.sum(db.ledger.c.spend_micros),
                    sa.func.count(),
                )
                .where(old)
                .group_by(db.ledger.c.ad_id, db.ledger.c.period)
            ).all()
            rows = sum(n for *_k, n in sums)
            micros = sum(int(m) for _a, _p, m, _n in sums)
            old_windows = db.windows.c.updated_at < cutoff
            windows = conn.execute(sa.select(sa.func.count()).select_from(db.windows).where(old_windows)).scalar_one()
            if dry_run:
                return PruneResult(cutoff, rows, micros, windows)
            if windows:
                conn.execute(sa.delete(db.windows).where(old_windows))
            if not sums:
                return PruneResult(cutoff, rows, micros, windows)
            writes.add_sums(
                conn,
                db.ledger_pruned,
                "last_pruned_at",
                [{"ad_id": a, "period": p, "spend_micros": int(m), "records": n} for a, p, m, n in sums],
            )
            deleted = conn.execute(sa.delete(db.ledger).where(old)).rowcount
            if deleted != rows:  # rows applied meanwhile cannot be older than the cutoff
                raise RuntimeError(f"prune: counted {rows} rows, deleted {deleted}; rolled back")
        log.info("pruned %d ledger rows and %d windows applied before %s", rows, windows, cutoff.isoformat())
        return PruneResult(cutoff, rows, micros, windows)
    finally:
        engine.dispose()
