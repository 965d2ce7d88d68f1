"""Revisions of a window in the budget: the plan (charged, superseded,
conflict), the charge of a revision, and one batch's SQL on SQLite with
revisions and a window an earlier version charged; offsets that never move
backwards. Expected amounts are written out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from adpipe.budget import db, schema
from adpipe.budget.aggregate import Aggregate, BadAggregate, parse_aggregate
from adpipe.budget.batch import apply_batch
from adpipe.budget.money import Price, charge_micros
from adpipe.budget.revisions import NOTHING, WindowState, plan_revisions
from adpipe.settings import load_settings

from tests.unit.budget.conftest import FakeMessage

W = "2026-11-22T12:34:00Z"


def agg(revision: int, impressions: int, clicks: int, window_start: str = W, ad_id: str = "ad-1") -> Aggregate:
    return Aggregate(f"{ad_id}|{window_start}|r{revision}", ad_id, window_start, impressions, clicks, revision)


# ------------------------------------------------------------------ parsing


def _value(**over: object) -> bytes:
    body = {"record_uuid": "u-1", "ad_id": "ad-1", "window_start": W, "impressions": 5, "clicks": 1}
    body.update(over)
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


def test_revision_parsed_absent_or_null_is_zero() -> None:
    assert parse_aggregate(_value()).revision == 0
    assert parse_aggregate(_value(revision=None)).revision == 0
    assert parse_aggregate(_value(revision=3)).revision == 3


@pytest.mark.parametrize("revision", [-1, 1.5, "1", True, 2**63])
def test_revision_must_be_a_non_negative_bigint(revision: object) -> None:
    with pytest.raises(BadAggregate, match="revision"):
        parse_aggregate(_value(revision=revision))


# ------------------------------------------------------------------ the plan


def test_revisions_in_order_each_charged_against_the_one_before() -> None:
    r0, r1, r2 = agg(0, 100, 1), agg(1, 130, 1), agg(2, 150, 4)
    plan = plan_revisions({}, [(r2, "m2"), (r0, "m0"), (r1, "m1")])  # revision order, whatever the read order
    assert [(a.revision, m, base.revision) for a, m, base in plan.charged] == [
        (0, "m0", None),
        (1, "m1", 0),
        (2, "m2", 1),
    ]
    assert [(base.impressions, base.clicks) for _a, _m, base in plan.charged] == [(0, 0), (100, 1), (130, 1)]
    assert plan.final == {("ad-1", W): WindowState(2, 150, 4, r2.record_uuid)}
    assert plan.superseded == plan.lower == []


def test_a_revision_at_or_below_the_charged_one_is_superseded() -> None:
    charged = WindowState(2, 150, 4, "u-r2")
    older, same, newer = agg(1, 130, 1), agg(2, 150, 4), agg(3, 150, 5)
    plan = plan_revisions({("ad-1", W): charged}, [(older, 1), (same, 2), (newer, 3)])
    assert [m for _a, m, _b in plan.superseded] == [1, 2]
    assert [(a.revision, b) for a, _m, b in plan.charged] == [(3, charged)]
    assert plan.final == {("ad-1", W): WindowState(3, 150, 5, newer.record_uuid)}


def test_a_revision_with_fewer_events_than_its_base_is_a_conflict_and_the_next_one_charged() -> None:
    base = WindowState(0, 100, 3, "u-r0")
    fewer_clicks, more = agg(1, 120, 2), agg(2, 140, 3)
    plan = plan_revisions({("ad-1", W): base}, [(fewer_clicks, "a"), (more, "b")])
    assert [(a.revision, b) for a, _m, b in plan.lower] == [(1, base)]
    assert [(a.revision, b) for a, _m, b in plan.charged] == [(2, base)]  # against revision 0, not the refused 1


def test_windows_are_independent_and_unchanged_ones_not_in_final() -> None:
    other = "2026-11-22T12:35:00Z"
    states = {("ad-1", W): WindowState(1, 10, 0, "x")}
    plan = plan_revisions(states, [(agg(0, 10, 0), "old"), (agg(0, 7, 0, other), "new")])
    assert [m for _a, m, _b in plan.superseded] == ["old"]
    assert [(a.window_start, b) for a, _m, b in plan.charged] == [(other, NOTHING)]
    assert set(plan.final) == {("ad-1", other)}


def test_a_first_revision_without_its_revision_0_is_charged_in_full() -> None:
    plan = plan_revisions({}, [(agg(2, 50, 2), "m")])
    assert [(a.revision, b) for a, _m, b in plan.charged] == [(2, NOTHING)]


# ------------------------------------------------------------------ the charge


@pytest.mark.parametrize(
    ("counts", "base", "price", "expected"),
    [
        ((100, 7), (0, 0), (2_000_000, 500_000), 200_000 + 3_500_000),
        ((130, 7), (100, 7), (2_000_000, 500_000), 60_000),  # 30 impressions x 2.00 / 1000
        ((130, 9), (100, 7), (2_000_000, 500_000), 60_000 + 1_000_000),
        # The price of the counts less the price of the base's, each rounded half-to-even:
        # 3 x 2.5 = 7.5 -> 8, 1 x 2.5 = 2.5 -> 2: 6 (the 2 impressions alone would be 5).
        ((3, 0), (1, 0), (2_500, 0), 6),
        ((5, 5), (5, 5), (2_000_000, 500_000), 0),
    ],
)
def test_charge_of_a_revision_by_hand(
    counts: tuple[int, int], base: tuple[int, int], price: tuple[int, int], expected: int
) -> None:
    assert charge_micros(agg(1, *counts), Price(*price), *base) == expected


def test_charge_below_the_base_is_refused() -> None:
    with pytest.raises(ValueError, match="below the base"):
        charge_micros(agg(1, 99, 7), Price(1, 1), 100, 7)


# ------------------------------------------------------------- SQL on SQLite


def message(
    offset: int, revision: int | None, impressions: int, clicks: int, window_start: str = W, uuid: str | None = None
) -> FakeMessage:
    """A record at ``offset`` of partition 0 (``revision`` None: without the field)."""
    body = {
        "record_uuid": uuid or f"{window_start}|r{revision or 0}",
        "ad_id": "ad-1",
        "window_start": window_start,
        "impressions": impressions,
        "clicks": clicks,
    }
    if revision is not None:
        body["revision"] = revision
    return FakeMessage(0, offset, json.dumps(body).encode())


def _spend(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.sum(db.spend.c.spend_micros))).scalar_one()


def _ledger(engine: sa.Engine) -> list[tuple]:
    lg = db.ledger
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.select(lg.c.revision, lg.c.base_revision, lg.c.impressions, lg.c.clicks, lg.c.spend_micros).order_by(
                    lg.c.kafka_offset
                )
            )
        ]


def test_revisions_across_batches_charge_each_difference_once(sqlite_budget) -> None:
    settings, engine = sqlite_budget
    with engine.begin() as conn:  # revision 0 without the field
        first = apply_batch(conn, settings, "aggs", [message(0, None, 100, 2)], {})
    with engine.begin() as conn:  # revisions 1 and 2, then 1 again under another uuid, older than 2
        second = apply_batch(
            conn,
            settings,
            "aggs",
            [message(1, 1, 150, 2), message(2, 2, 150, 5), message(3, 1, 150, 2, uuid="another")],
            {0: 1},
        )
    assert (first.applied, first.revised) == (1, 0)
    assert (second.applied, second.revised, second.superseded, second.conflicts) == (2, 2, 1, 0)
    # 100 x 2.00 / 1000 + 2 x 0.50 = 1.20; +50 impressions = 0.10; +3 clicks = 1.50
    assert _ledger(engine) == [
        (0, None, 100, 2, 1_200_000),
        (1, 0, 150, 2, 100_000),
        (2, 1, 150, 5, 1_500_000),
    ]
    assert _spend(engine) == 2_800_000  # = 150 x 2.00 / 1000 + 5 x 0.50, the latest revision's price
    with engine.connect() as conn:
        assert conn.execute(sa.select(db.windows.c.revision, db.windows.c.impressions, db.windows.c.clicks)).all() == [
            (2, 150, 5)
        ]
    # A replay of all of it (another group: no offsets): nothing charged again.
    other = settings.with_overrides(budget_group="replay")
    msgs = [message(0, None, 100, 2), message(1, 1, 150, 2), message(2, 2, 150, 5)]
    with engine.begin() as conn:
        replay = apply_batch(conn, other, "aggs", msgs, {})
    assert (replay.applied, replay.duplicates, replay.superseded) == (0, 3, 0)
    assert _spend(engine) == 2_800_000


def test_fewer_events_than_the_charged_revision_is_a_conflict(sqlite_budget) -> None:
    settings, engine = sqlite_budget
    msgs = [message(0, 0, 100, 2), message(1, 1, 90, 3), message(2, 2, 120, 2)]
    with engine.begin() as conn:
        result = apply_batch(conn, settings, "aggs", msgs, {})
    assert (result.applied, result.conflicts) == (2, 1)
    with engine.connect() as conn:
        (kind, reason, uuid), = conn.execute(
            sa.select(db.quarantine.c.kind, db.quarantine.c.reason, db.quarantine.c.record_uuid)
        ).all()
    assert kind == "conflict" and uuid == f"{W}|r1" and "fewer events" in reason and "revision 0" in reason
    # revision 2 against revision 0: +20 impressions = 0.04
    assert [row[1:] for row in _ledger(engine)] == [(None, 100, 2, 1_200_000), (0, 120, 2, 40_000)]


def test_revision_1_of_a_window_an_earlier_version_charged(sqlite_budget) -> None:
    """Ledger rows without a revision and no window row: what an earlier
    version wrote. Its revision 0 is the base of revision 1."""
    settings, engine = sqlite_budget
    with engine.begin() as conn:
        apply_batch(conn, settings, "aggs", [message(0, None, 100, 2)], {})
        conn.execute(sa.delete(db.windows))
        conn.execute(
            sa.update(db.ledger).values(revision=None, base_revision=None, base_impressions=None, base_clicks=None)
        )
    with engine.begin() as conn:
        again = apply_batch(conn, settings, "aggs", [message(0, 0, 100, 2), message(1, 1, 110, 2)], {0: 1})
    assert (again.already_applied, again.applied) == (1, 1)
    with engine.begin() as conn:  # revision 0 again under another group: still not charged
        replay = apply_batch(conn, settings.with_overrides(budget_group="g2"), "aggs", [message(0, None, 100, 2)], {})
    assert (replay.applied, replay.duplicates) == (0, 1)
    assert [row[:2] + row[4:] for row in _ledger(engine)] == [(None, None, 1_200_000), (1, 0, 20_000)]
    assert _spend(engine) == 1_220_000


def test_stored_offsets_never_move_backwards(sqlite_budget) -> None:
    settings, engine = sqlite_budget
    batch_1 = [message(i, 0, 10, 0, f"2026-11-22T12:0{i}:00Z") for i in range(3)]
    batch_2 = [message(i, 0, 10, 0, f"2026-11-22T12:0{i}:00Z") for i in range(3, 6)]
    with engine.begin() as conn:
        apply_batch(conn, settings, "aggs", batch_1, {})
    with engine.begin() as conn:
        apply_batch(conn, settings, "aggs", batch_2, {0: 3})
    with engine.begin() as conn:  # batch 1 again, positioned at the stored 6 (a re-assignment)
        again = apply_batch(conn, settings, "aggs", batch_1, {0: 6})
    assert (again.applied, again.already_applied, again.next_offsets) == (0, 3, {0: 6})
    with engine.connect() as conn:
        assert conn.execute(sa.select(db.offsets.c.next_offset)).scalar_one() == 6


def test_schema_upgrade_adds_the_windows_and_the_ledger_revision_columns(tmp_path: Path) -> None:
    settings = load_settings({"ADPIPE_HOME": str(tmp_path)})
    engine = db.make_engine(settings)
    schema.ensure_schema(engine, settings)
    with engine.begin() as conn:  # back to the schema before revisions
        conn.exec_driver_sql("DROP TABLE budget_windows")
        conn.exec_driver_sql("DROP INDEX budget_ledger_unrevised_window")
        for column in ("revision", "base_revision", "base_impressions", "base_clicks"):
            conn.exec_driver_sql(f"ALTER TABLE budget_ledger DROP COLUMN {column}")
    schema.ensure_schema(engine, settings)
    schema.ensure_schema(engine, settings)  # idempotent
    inspector = sa.inspect(engine)
    assert inspector.has_table("budget_windows")
    assert {"revision", "base_revision", "base_impressions", "base_clicks"} <= {
        c["name"] for c in inspector.get_columns("budget_ledger")
    }
    assert "budget_ledger_unrevised_window" in {i["name"] for i in inspector.get_indexes("budget_ledger")}
    engine.dispose()
