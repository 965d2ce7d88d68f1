"""``adpipe budget``: the budget service, its report and its prices.

Heavy imports happen when a command runs, so ``adpipe --help`` stays fast."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from adpipe.settings import Settings

log = logging.getLogger("adpipe.budget")

PRICE_FILE_HELP = (
    "CSV with header scope,key,campaign_id,cpm,cpc,budget. scope is default (key *), campaign (key = campaign "
    "id) or ad (key = ad id; campaign_id maps the ad to a campaign). Amounts in currency units with at most 6 "
    "decimals; an empty cell inherits: ad -> its campaign -> default. cpm is per thousand impressions, cpc per "
    "click, budget per budget period (ADPIPE_BUDGET_PERIOD)."
)


def cmd_budget(args: argparse.Namespace, settings: Settings) -> int:
    action = getattr(args, "budget_action", None)
    if action == "report":
        return _report(args, settings)
    if action == "prices":
        return _prices(args, settings)
    if action == "prune":
        return _prune(args, settings)
    from adpipe import pygc
    from adpipe.budget.service import BudgetService
    from adpipe.faults import FaultPlan

    pygc.tune_for_batches()
    return BudgetService(settings, once=args.once, fault=FaultPlan.from_env()).run(once_timeout_s=args.timeout)


def _report(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.budget.report import findings, format_findings, format_report, report

    rows = report(settings)
    if rows is None:
        print("no budget database yet (run `adpipe budget` first)")
        return 3
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
        return 0
    print(format_report(rows))
    found = findings(settings)
    if found is not None and (text := format_findings(found)):
        print(text)
    return 0


def _prune(args: argparse.Namespace, settings: Settings) -> int:
    from adpipe.budget.retention import prune
    from adpipe.money import format_micros

    result = prune(settings, dry_run=args.dry_run)
    if result.cutoff is None:
        print(f"{settings.topics.aggregates} keeps its records forever (retention.ms -1): the ledger is kept too")
        return 0
    verb = "would prune" if args.dry_run else "pruned"
    print(
        f"{verb} {result.rows} ledger rows applied before {result.cutoff.isoformat()} "
        f"(spend {format_micros(result.spend_micros)} kept in budget_ledger_pruned) and {result.windows} windows "
        "last charged before it"
    )
    return 0


def _prices(args: argparse.Namespace, settings: Settings) -> int:
    import sqlalchemy as sa

    from adpipe.budget import db, pricing, schema, status
    from adpipe.money import format_micros

    engine = db.make_engine(settings)
    try:
        schema.ensure_schema(engine, settings)
        if args.file:
            rows = pricing.read_price_file(Path(args.file))
            with engine.begin() as conn:
                n = pricing.upsert_prices(conn, rows)
                # Pauses follow the new budgets in the same transaction.
                transitions = status.settle_pricing(conn, force=True) or []
            print(f"loaded {n} pricing rows from {args.file}")
            for t in transitions:
                print(
                    f"{t.event_type} {t.ad_id} {t.period}: spend {format_micros(t.spend_micros)}, "
                    f"budget {format_micros(t.budget_micros)}"
                )
        with engine.connect() as conn:
            for r in conn.execute(sa.select(db.pricing).order_by(db.pricing.c.scope, db.pricing.c.key)).mappings():
                print(
                    f"{r['scope']:<9} {r['key']:<20} campaign={r['campaign_id'] or '-':<12} "
                    f"cpm={format_micros(r['cpm_micros'])} cpc={format_micros(r['cpc_micros'])} "
                    f"budget={format_micros(r['budget_micros'])}"
                )
    finally:
        engine.dispose()
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "budget",
        help="the ad budget service (exactly-once spend into the budget database)",
        description="Consumes the aggregates topic (read_committed) in consumer group ADPIPE_BUDGET_GROUP and "
        "applies spend = impressions x CPM / 1000 + clicks x CPC per ad into ADPIPE_BUDGET_DB, one database "
        "transaction per batch holding the ledger (keyed by record_uuid), the spend and the consumer's offsets. "
        "An ad whose spend reaches its budget is paused, and resumed when its budget is raised above the spend; "
        "each change is one event on the budget-events topic. An aggregate the database cannot hold or refuses, "
        "or a record_uuid seen again with other counts, is quarantined and the rest charged; while the database "
        "is down, consumption pauses for up to ADPIPE_BUDGET_DB_OUTAGE_S seconds. Offsets deleted by retention "
        "before they were charged are reported as a gap. Stops cleanly on SIGTERM. "
        "Sub-commands: report, prices, prune.",
    )
    p.add_argument("--once", action="store_true", help="drain what is in the topic now, then stop")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="with --once: give up (exit 1) when not drained after this many s"
    )
    p.set_defaults(func=cmd_budget, budget_action=None)
    actions = p.add_subparsers(dest="budget_action", metavar="ACTION")
    r = actions.add_parser(
        "report",
        help="spend, budget and status per ad and period (read-only)",
        description="Prints spend, budget and status per ad and budget period from the budget database. "
        "Read-only; exit 3 when there is no budget database yet.",
    )
    r.add_argument("--json", action="store_true", help="JSON instead of a table")
    q = actions.add_parser(
        "prices",
        help="load or list the pricing table (prices and budgets)",
        description="Without --file: list the pricing table. " + PRICE_FILE_HELP,
    )
    q.add_argument("--file", help="CSV to load (insert or replace by scope and key)")
    pr = actions.add_parser(
        "prune",
        help="delete ledger rows older than the aggregates topic's retention plus a margin",
        description="A ledger row only guards against a repeat of its record_uuid, which can only come from the "
        "aggregates topic: rows applied more than the topic's retention.ms plus ADPIPE_BUDGET_LEDGER_MARGIN_H "
        "(168) hours ago are deleted, their sums kept per ad and period in budget_ledger_pruned (spend is "
        "unchanged); so are the windows (each one's last charged revision) last charged before then. A topic "
        "kept forever keeps its ledger.",
    )
    pr.add_argument("--dry-run", action="store_true", help="count what would go, change nothing")
