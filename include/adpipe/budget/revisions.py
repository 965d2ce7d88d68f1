"""Revisions of a minute window: which records of a batch are charged,
against which base, and the ``budget_windows`` rows that keep each window's
last charged revision (Step 3 of :mod:`adpipe.budget.batch`).

The stream job may emit a window (``ad_id``, ``window_start``) again, its
``revision`` one higher, with the window's full corrected counts. The budget
charges each revision the difference from the revision of the window it
charged last (the *base*), at the batch's prices::

    charge = spend(counts) - spend(base counts)

so a window's charges add up to the price of its latest revision (at one
price), and no count is charged twice. A window's records in one batch are
taken in revision order; each is

* **charged** when its revision is above the base's (none charged yet: any
  revision) and neither count is below the base's; it becomes the base;
* **superseded** when its revision is at or below the base's (a replay, an
  older revision read after a newer one): not charged, counted;
* a **conflict** when it has fewer impressions or clicks than the base:
  revisions only add events, so it is quarantined, never a negative charge.

The base of a window with no ``budget_windows`` row yet is what an earlier
version of the service charged of it: its ledger rows without a revision
(a revision 0 charged in full; if several, the one with the most
impressions, then clicks), else nothing (no revision, counts 0). The row is
created with the batch that first meets the window, so that lookup is made
once per window.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from adpipe.budget import db, writes
from adpipe.budget.aggregate import Aggregate

WindowKey = tuple[str, str]  # (ad_id, window_start)
M = TypeVar("M")  # what travels with each record (the Kafka message)


@dataclass(frozen=True)
class WindowState:
    """The revision of a window charged last (None: none) and its counts."""

    revision: int | None
    impressions: int = 0
    clicks: int = 0
    record_uuid: str | None = None

    @classmethod
    def of(cls, agg: Aggregate) -> WindowState:
        return cls(agg.revision, agg.impressions, agg.clicks, agg.record_uuid)


NOTHING = WindowState(None)


@dataclass
class RevisionPlan(Generic[M]):
    """Step 3's decision for the records of a batch (each with its base)."""

    charged: list[tuple[Aggregate, M, WindowState]] = field(default_factory=list)
    superseded: list[tuple[Aggregate, M, WindowState]] = field(default_factory=list)
    lower: list[tuple[Aggregate, M, WindowState]] = field(default_factory=list)
    # windows whose base changed: their new state
    final: dict[WindowKey, WindowState] = field(default_factory=dict)


def window_key(agg: Aggregate) -> WindowKey:
    return (agg.ad_id, agg.window_start)


def plan_revisions(
    states: Mapping[WindowKey, WindowState], records: Iterable[tuple[Aggregate, M]]
) -> RevisionPlan[M]:
    """Charged, superseded or conflict, per the module doc. ``states``: each
    window's base (a window missing: none). Records of one window are taken
    by revision, in the order given within one revision."""
    by_window: dict[WindowKey, list[tuple[Aggregate, M]]] = defaultdict(list)
    for agg, msg in records:
        by_window[window_key(agg)].append((agg, msg))
    plan: RevisionPlan[M] = RevisionPlan()
    for key in sorted(by_window):
        before = state = states.get(key, NOTHING)
        for agg, msg in sorted(by_window[key], key=lambda item: item[0].revision):
            if state.revision is not None and agg.revision <= state.revision:
                plan.superseded.append((agg, msg, state))
            elif agg.impressions < state.impressions or agg.clicks < state.clicks:
                plan.lower.append((agg, msg, state))
            else:
                plan.charged.append((agg, msg, state))
                state = WindowState.of(agg)
        if state != before:
            plan.final[key] = state
    return plan


def lower_counts_reason(agg: Aggregate, base: WindowState) -> str:
    return (
        f"revision {agg.revision} of window ad_id={agg.ad_id} window_start={agg.window_start} has fewer events "
        f"(impressions={agg.impressions}, clicks={agg.clicks}) than revision {base.revision} charged before "
        f"(impressions={base.impressions}, clicks={base.clicks}, record_uuid {base.record_uuid}); revisions only "
        "add events: not charged"
    )


# ------------------------------------------------------------------ budget_windows


def _in_keys(conn: Connection, table: sa.Table, keys: Sequence[WindowKey]) -> sa.ColumnElement[bool]:
    return writes.pairs_in(conn, table.c.ad_id, table.c.window_start, keys)


def lock_windows(conn: Connection, topic: str, keys: Sequence[WindowKey]) -> dict[WindowKey, WindowState]:
    """The windows' rows that exist, locked (FOR UPDATE) in key order, as
    states."""
    if not keys:
        return {}
    w = db.windows
    rows = conn.execute(
        sa.select(w.c.ad_id, w.c.window_start, w.c.revision, w.c.impressions, w.c.clicks, w.c.record_uuid)
        .where(w.c.kafka_topic == topic, _in_keys(conn, w, keys))
        .order_by(w.c.ad_id, w.c.window_start)
        .with_for_update()
    ).all()
    return {(a, s): WindowState(r, i, c, u) for a, s, r, i, c, u in rows}


def charged_before_revisions(
    conn: Connection, topic: str, keys: Sequence[WindowKey]
) -> dict[WindowKey, WindowState]:
    """The base of windows with no row yet: what an earlier version charged
    of them (ledger rows without a revision; see the module doc)."""
    if not keys:
        return {}
    lg = db.ledger
    rows = conn.execute(
        sa.select(lg.c.ad_id, lg.c.window_start, lg.c.impressions, lg.c.clicks, lg.c.record_uuid).where(
            lg.c.kafka_topic == topic, lg.c.revision.is_(None), _in_keys(conn, lg, keys)
        )
    ).all()
    bases: dict[WindowKey, WindowState] = {}
    for ad_id, window_start, impressions, clicks, record_uuid in rows:
        found = bases.get((ad_id, window_start))
        if found is None or (impressions, clicks) > (found.impressions, found.clicks):
            bases[(ad_id, window_start)] = WindowState(0, impressions, clicks, record_uuid)
    return bases


def _rows(topic: str, states: Mapping[WindowKey, WindowState]) -> list[dict]:
    return [
        {
            "kafka_topic": topic,
            "ad_id": ad_id,
            "window_start": window_start,
            "revision": s.revision,
            "impressions": s.impressions,
            "clicks": s.clicks,
            "record_uuid": s.record_uuid,
        }
        for (ad_id, window_start), s in sorted(states.items())
    ]


def create_windows(conn: Connection, topic: str, states: Mapping[WindowKey, WindowState]) -> set[WindowKey]:
    """Insert the windows' rows unless one exists (another transaction
    created it since :func:`lock_windows`: it is not overwritten). Returns
    the keys inserted."""
    created = writes.insert_new(conn, db.windows, _rows(topic, states), ("kafka_topic", "ad_id", "window_start"))
    return {(ad_id, window_start) for _topic, ad_id, window_start in created}


def update_windows(conn: Connection, topic: str, states: Mapping[WindowKey, WindowState]) -> None:
    """Set the rows (locked by :func:`lock_windows`) to their new states."""
    writes.put(conn, db.windows, ("kafka_topic", "ad_id", "window_start"), _rows(topic, states), "updated_at")
