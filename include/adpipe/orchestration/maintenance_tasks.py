"""Bodies of the ``ad_table_maintenance`` DAG's tasks: ``OPTIMIZE`` then
``VACUUM`` of the ``ads`` Delta tables (:mod:`adpipe.lakehouse.maintenance`
says what each step does, and what a crash between them leaves), and the
budget ledger's retention rule (:mod:`adpipe.budget.retention`).

It does not depend on the run's date: each run maintains the tables as they
are, so a rerun, a retry or a skipped day is harmless."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from adpipe.settings import Settings

log = logging.getLogger(__name__)


def optimize_and_vacuum(settings: Settings) -> list[dict[str, Any]]:
    """Maintain the three ``ads`` tables; returns one summary per table
    (JSON-friendly, for XCom). Raises on a failed OPTIMIZE or VACUUM."""
    from adpipe.lakehouse.maintenance import optimize_and_vacuum as run
    from adpipe.lakehouse.metastore import metastore_session

    # In a task process of its own (Airflow's executors) there is no session
    # yet to reuse; the tables are found through the Hive metastore.
    spark = metastore_session(settings, "adpipe-maintenance")
    results = run(settings, spark)
    for result in results:
        log.info("%s", result.describe())
    return [asdict(r) for r in results]


def prune_budget_ledger(settings: Settings) -> dict[str, Any]:
    """``adpipe budget prune``: ledger rows older than the aggregates topic's
    retention plus the margin; skipped when there is no budget database."""
    from adpipe.budget import db
    from adpipe.budget.retention import prune

    with db.existing(settings) as engine:
        if engine is None:
            return {"skipped": "no budget database (or no ledger in it) yet"}
    result = prune(settings)
    summary = {
        "cutoff": None if result.cutoff is None else result.cutoff.isoformat(),
        "rows": result.rows,
        "spend_micros": result.spend_micros,
        "windows": result.windows,
    }
    log.info("budget ledger pruned: %s", summary)
    return summary
